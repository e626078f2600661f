"""The CPU's linear layers: at decode steps, oneDNN with prepacked weights or the native C loop; else F.linear.

At decode shapes oneDNN with weights prepacked once (what Inductor's `freezing` does) can beat MKL's `F.linear`, and
the C loop of native.py can beat both at one or two rows; which one wins depends on the CPU and the row count
(`docs/CPU.md`, "CPU matmuls by step kind"), so `decode_routes` times each on the model's own matmuls at start-up,
once per machine: the picks are kept on disk (`read_routes` / `write_routes`) under a key of what they depend on.
oneDNN's fp32 sums round differently (2-3x MKL's error), which broke the 1e-4 logits bound that prefill was then held
to against transformers (tests/conftest.py's FP32_LOGITS_ATOL is 2e-4 since). So only decode steps may take another
route and every other step takes `F.linear`: the step contract says which (`StepMetadata.cpu_matmul`), and the model
sets the shared `MatmulRoute` from it.
bfloat16 packs too where oneDNN has bf16 kernels for the CPU (AVX512-BF16 or AMX): there `F.linear` gives the
packed route's results bit for bit, but slower at decode shapes (on 2 cores of an AMD EPYC, SmolLM2's matmuls at
one row 195 us on average against 117 packed; a batch-1 decode step 39 ms against 27, and 40 in float32 packed).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minipic_lite.models import native
from minipic_lite.models.loader import cache_root

PACK_BATCH_HINT = 32  # oneDNN picks its blocking for this many rows; any row count still works
ROUTE_PROBE_ROWS = (1, 2, 4, 8)  # decode row counts timed at start-up to pick the route
PROBE_ROUNDS = 3  # passes per route and row count after the warm-up; the best counts
ROUTES = ("linear", "packed", "native")  # F.linear (MKL); oneDNN's prepacked weights; native.py's C loop


@dataclass
class MatmulRoute:
    """Shared by every PackedLinear of a model; the model's forward sets it from its StepMetadata."""

    kind: str = "linear"  # one of ROUTES; only decode steps take another than "linear"


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """float32, or bfloat16 where oneDNN has bf16 kernels for this CPU (AVX512-BF16 or AMX)."""
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and (dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()))
    )


def can_route(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a CPU model of this dtype has a decode route besides F.linear: oneDNN's packing or the C loop."""
    has_loop = device.type == "cpu" and dtype in native.DTYPES and native.load() is not None
    return can_pack(device, dtype) or has_loop


class PackedLinear(nn.Module):
    """`nn.Linear` plus, where oneDNN packs its dtype, a prepacked copy of its weight; `route.kind` picks the
    matmul (`packed` without the copy, or `native` where the C loop cannot run, falls back to F.linear)."""

    def __init__(self, linear: nn.Linear, route: MatmulRoute, pack: bool = True):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.route = route
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACK_BATCH_HINT) if pack else None
        self.native = native.load() is not None and native.supports(linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = self.route.kind
        if kind == "native" and self.native:
            return native.native_gemv(x, self.weight, self.bias)
        if kind != "packed" or self.packed is None:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.shape[-1])  # (N, in)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")  # (N, out)
        return out.view(*x.shape[:-1], out.shape[-1])


def pack_linears(model: nn.Module, pack: bool = True) -> MatmulRoute:
    """Replace every `nn.Linear` of `model` (weights loaded) by a PackedLinear, with its packed copy when `pack`;
    returns their shared route."""
    route = model.matmul_route = MatmulRoute()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child, route, pack))
    return route


def drop_packed_weights(model: nn.Module) -> None:
    """Free the packed copies (as large as the weights) when the probe never chose them."""
    for m in model.modules():
        if isinstance(m, PackedLinear):
            m.packed = None


def decode_routes(
    model: nn.Module, probe_rows: tuple[int, ...] = ROUTE_PROBE_ROWS, rounds: int = PROBE_ROUNDS
) -> dict[int, str]:
    """{rows: the fastest route at that many rows} for each probed row count, timed on `model`'s own matmuls: after
    a warm-up pass per route, `rounds` rounds of one pass per route in turn, each route's best pass counted (the
    picks are kept for every later start, so one slow pass must not decide them). The routes timed: F.linear, the
    packed weights where the layers hold them, the C loop where every layer can take it."""
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    route = linears[0].route
    kinds = ["linear"]
    kinds += ["packed"] if all(m.packed is not None for m in linears) else []
    kinds += ["native"] if all(m.native for m in linears) else []

    def seconds(inputs: list[torch.Tensor], kind: str) -> float:
        route.kind = kind
        start = time.perf_counter()
        for m, x in zip(linears, inputs, strict=True):
            m(x)
        return time.perf_counter() - start

    def fastest(rows: int) -> str:
        inputs = [torch.zeros(rows, m.weight.shape[1], dtype=m.weight.dtype) for m in linears]
        for kind in kinds:  # warms the caches and oneDNN's primitives
            seconds(inputs, kind)
        best = dict.fromkeys(kinds, float("inf"))
        for _ in range(rounds):
            for kind in kinds:
                best[kind] = min(best[kind], seconds(inputs, kind))
        return min(best, key=best.get)

    with torch.inference_mode():
        routes = {rows: fastest(rows) for rows in probe_rows}
    route.kind = "linear"
    return routes


def route_for_rows(routes: dict[int, str], rows: int) -> str:
    """The route of a decode step of `rows` rows: the one chosen at the largest probed count not above it (the
    smallest probe's below every probe; "linear" when nothing was probed)."""
    probed = sorted(routes)
    below = [r for r in probed if r <= rows]
    return routes[below[-1]] if below else (routes[probed[0]] if probed else "linear")


def routes_path(model: nn.Module) -> Path:
    """Where the probe's picks for `model` on this machine are kept (call before `pack_linears`): a file named by a
    hash of what the picks depend on: the CPU, torch, the C loop's source (and whether it loads), the matmuls' shapes
    and dtypes, and the thread count."""
    shapes = sorted({(tuple(m.weight.shape), str(m.weight.dtype)) for m in model.modules() if isinstance(m, nn.Linear)})
    parts = [native.cpu_signature(), torch.__version__, native.SOURCE, str(native.load() is not None), str(shapes),
             str(torch.get_num_threads()), str((ROUTE_PROBE_ROWS, PROBE_ROUNDS))]  # fmt: skip
    return cache_root() / "routes" / f"{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:16]}.json"


def read_routes(path: Path) -> dict[int, str] | None:
    """The picks kept at `path`, or None where there are none (or the file is not a valid set of picks)."""
    try:
        routes = {int(rows): kind for rows, kind in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return None
    return routes if routes and set(routes.values()) <= set(ROUTES) else None


def write_routes(path: Path, routes: dict[int, str]) -> None:
    """Keep the picks (atomically: written aside, renamed); a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = path.with_suffix(f".{os.getpid()}.tmp")  # NOTE: two processes starting at once write apart
        aside.write_text(json.dumps(routes))
        aside.replace(path)
    except OSError:
        pass
