"""Linear layers whose weights are also prepacked for oneDNN: the CPU's decode matmuls.

At decode shapes oneDNN with weights prepacked once (what Inductor's `freezing` does) can beat MKL's `F.linear`;
which one wins depends on the CPU and the row count (README, "CPU matmuls by step kind", has the figures), so
`packed_min_rows` times both on the model's own matmuls at start-up. oneDNN's fp32 sums round differently (2-3x
MKL's error), which would break the 1e-4 logits bound that prefill is held to against transformers. So only
decode steps may take the packed weights and every other step takes `F.linear`: the step contract says which
(`StepMetadata.use_packed_weights`), and the model sets the shared `MatmulRoute` from it.
bfloat16 packs too where oneDNN has bf16 kernels for the CPU (AVX512-BF16 or AMX): there `F.linear` gives the
packed route's results bit for bit, but slower at decode shapes (on 2 cores of an AMD EPYC, SmolLM2's matmuls at
one row 195 us on average against 117 packed; a batch-1 decode step 39 ms against 27, and 40 in float32 packed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

PACK_BATCH_HINT = 32  # oneDNN picks its blocking for this many rows; any row count still works
ROUTE_PROBE_ROWS = (1, 2, 4, 8)  # decode row counts timed at start-up to pick the route


@dataclass
class MatmulRoute:
    """Shared by every PackedLinear of a model; the model's forward sets it from its StepMetadata."""

    packed: bool = False  # True: oneDNN with prepacked weights (decode steps); False: F.linear (MKL)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """float32, or bfloat16 where oneDNN has bf16 kernels for this CPU (AVX512-BF16 or AMX)."""
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and (dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()))
    )


class PackedLinear(nn.Module):
    """`nn.Linear` plus a oneDNN-packed copy of its weight, taken when `route.packed` is set."""

    def __init__(self, linear: nn.Linear, route: MatmulRoute):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.route = route
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACK_BATCH_HINT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.route.packed or self.packed is None:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.shape[-1])  # (N, in)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")  # (N, out)
        return out.view(*x.shape[:-1], out.shape[-1])


def pack_linears(model: nn.Module) -> MatmulRoute:
    """Replace every `nn.Linear` of `model` (weights loaded) by a PackedLinear; returns their shared route."""
    route = model.matmul_route = MatmulRoute()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child, route))
    return route


def drop_packed_weights(model: nn.Module) -> None:
    """Free the packed copies (as large as the weights) when the probe found F.linear faster at every row count."""
    for m in model.modules():
        if isinstance(m, PackedLinear):
            m.packed = None


def packed_min_rows(model: nn.Module, probe_rows: tuple[int, ...] = ROUTE_PROBE_ROWS) -> int | None:
    """The fewest rows from which the packed weights beat F.linear at every probed count, timed on `model`'s
    own matmuls (one pass per route after a warm-up); the largest probe speaks for larger batches, and None
    (never packed) when F.linear wins there."""
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    route = linears[0].route

    def seconds(rows: int, packed: bool) -> float:
        route.packed = packed
        inputs = [torch.zeros(rows, m.weight.shape[1], dtype=m.weight.dtype) for m in linears]
        for _ in range(2):  # the first pass warms the caches and oneDNN's primitives
            start = time.perf_counter()
            for m, x in zip(linears, inputs, strict=True):
                m(x)
        return time.perf_counter() - start

    with torch.inference_mode():
        wins = [seconds(rows, True) < seconds(rows, False) for rows in probe_rows]
    route.packed = False
    return first_of_winning_tail(probe_rows, wins)


def first_of_winning_tail(probe_rows: tuple[int, ...], wins: list[bool]) -> int | None:
    """The first probe of the longest run of wins that reaches the last probe; None when the last one lost."""
    first = len(probe_rows)
    while first > 0 and wins[first - 1]:
        first -= 1
    return probe_rows[first] if first < len(probe_rows) else None
