"""Linear layers whose weights are also prepacked for oneDNN: the CPU's decode matmuls.

On the project's CPU, MKL's `F.linear` is slow at decode shapes and oneDNN with weights prepacked once (what
Inductor's `freezing` does) is faster (README, "CPU matmuls by step kind", has the figures). oneDNN's fp32 sums
round differently (2-3x MKL's error), which would break the 1e-4 logits bound that prefill is held to against
transformers. So decode steps take the packed weights and every other step `F.linear`: the step contract says
which (`StepMetadata.use_packed_weights`), and the model sets the shared `MatmulRoute` from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

PACK_BATCH_HINT = 32  # oneDNN picks its blocking for this many rows; any row count still works


@dataclass
class MatmulRoute:
    """Shared by every PackedLinear of a model; the model's forward sets it from its StepMetadata."""

    packed: bool = False  # True: oneDNN with prepacked weights (decode steps); False: F.linear (MKL)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
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
        if not self.route.packed:
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
