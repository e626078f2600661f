"""Edges of the CPU's packed matmuls (models/packed_linear.py) and the CUDA routes' library switch
(models/routed_linear.py) that their tests leave open, with no model: float32 packs wherever oneDNN is (the packed
tests skip themselves where can_pack says no, so a can_pack that refused float32 passed them), the packed route keeps
an input's leading dims, the probe compares the routes' own times (a stand-in clock), and through_blas restores the
library it found, also when the call fails."""

import pytest
import torch
from torch import nn

from minipic_lite.models import packed_linear, routed_linear
from minipic_lite.models.packed_linear import (
    MatmulRoute,
    PackedLinear,
    can_pack,
    decode_routes,
    pack_linears,
)

HAS_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
needs_onednn = pytest.mark.skipif(not HAS_ONEDNN, reason="torch lacks oneDNN")


def test_float32_packs_on_the_cpu_wherever_onednn_is():
    assert can_pack(torch.device("cpu"), torch.float32) == HAS_ONEDNN
    assert not can_pack(torch.device("cpu"), torch.float16) and not can_pack(torch.device("meta"), torch.float32)


@needs_onednn
def test_the_packed_route_keeps_the_inputs_leading_dims():
    torch.manual_seed(0)
    linear = PackedLinear(nn.Linear(8, 4), MatmulRoute(kind="packed"))
    assert linear.packed is not None  # a layer packs by default: the route runs oneDNN, not the F.linear fallback
    x = torch.randn(2, 3, 8)
    out = linear(x)
    assert out.shape == (2, 3, 4)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, linear.weight, linear.bias))


@needs_onednn
def test_the_probe_takes_at_each_row_count_the_route_its_own_times_say_is_fastest(monkeypatch):
    """A stand-in clock: a call takes 2 ticks packed; F.linear 1 tick below 4 rows, 3 from 4 rows on; the C loop
    0.5 at one row, 4 above (the layers are told they can take it)."""
    clock = [0.0]
    ticks = {
        "packed": lambda rows: 2.0,
        "linear": lambda rows: 1.0 if rows < 4 else 3.0,
        "native": lambda rows: 0.5 if rows == 1 else 4.0,
    }

    def timed_forward(self, x):
        clock[0] += ticks[self.route.kind](x.shape[0])
        return x

    monkeypatch.setattr(PackedLinear, "forward", timed_forward)
    monkeypatch.setattr(packed_linear.time, "perf_counter", lambda: clock[0])
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    route = pack_linears(model)
    for m in model:
        m.native = True
    assert decode_routes(model) == {1: "native", 2: "linear", 4: "packed", 8: "packed"}
    assert route.kind == "linear"
    model[1].native = False  # a layer the loop cannot take: the probe leaves the loop out
    assert decode_routes(model) == {1: "linear", 2: "linear", 4: "packed", 8: "packed"}


@needs_onednn
def test_one_slow_pass_does_not_decide_the_probe(monkeypatch):
    """A stand-in clock: F.linear takes 1 tick a call and the packed route 2, but F.linear's first timed pass at each
    row count is a hiccup of 10 a call (a host's hiccup, kept for every later start if it decided): the best of the
    rounds still picks F.linear."""
    clock, passes = [0.0], {}

    def timed_forward(self, x):
        kind, rows = self.route.kind, x.shape[0]
        if self is model[0]:
            passes[kind, rows] = passes.get((kind, rows), 0) + 1
        clock[0] += 10.0 if kind == "linear" and passes[kind, rows] == 2 else (1.0 if kind == "linear" else 2.0)
        return x

    monkeypatch.setattr(PackedLinear, "forward", timed_forward)
    monkeypatch.setattr(packed_linear.time, "perf_counter", lambda: clock[0])
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    pack_linears(model)
    assert decode_routes(model) == dict.fromkeys((1, 2, 4, 8), "linear")
    assert all(count == 1 + packed_linear.PROBE_ROUNDS for count in passes.values())  # a warm-up, then the rounds
    passes.clear()
    assert decode_routes(model, rounds=1) == dict.fromkeys((1, 2, 4, 8), "packed")  # one pass: the hiccup decides


def test_through_blas_sets_the_library_for_the_call_and_restores_the_one_it_found(monkeypatch):
    """On a stand-in for torch's setting (a CPU torch refuses cuBLASLt)."""
    library, seen = ["cublas"], []

    def preferred(backend=None):
        if backend is not None:
            library[0] = backend
        return library[0]

    def linear(x, weight, bias):
        seen.append(library[0])
        if x is None:
            raise RuntimeError("the call failed")
        return x

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", preferred)
    monkeypatch.setattr(routed_linear.F, "linear", linear)
    through = routed_linear.through_blas("cublaslt")
    assert through("x", None, None) == "x" and (seen, library) == (["cublaslt"], ["cublas"])
    with pytest.raises(RuntimeError, match="the call failed"):
        through(None, None, None)
    assert library == ["cublas"]
