"""models/routed_linear.py on the CPU: the wrapping keeps the model's parameters, one-row inputs take the routed
function only where the route says so, the compiled one-row matmul equals F.linear, and steps of more rows take
cuBLASLt only at the row counts where the probe chose it. (The timing that sets the routes, and cuBLASLt, need CUDA:
tests/test_gpu.py.)"""

import torch
import torch.nn.functional as F
from torch import nn

from minipic_lite.models.llama import compile_kernel
from minipic_lite.models.routed_linear import (
    RoutedLinear,
    choose_library,
    choose_route,
    group_by_shape,
    one_row_candidates,
    route_many_row_linears,
    route_one_row_linears,
    wrap_linears,
)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = nn.Linear(8, 12, bias=True)
        self.o_proj = nn.Linear(4, 8, bias=False)
        self.inner = nn.Sequential(nn.Linear(8, 12, bias=True), nn.ReLU())


def recording(calls: list):
    def one_row(x, weight, bias):
        calls.append(tuple(x.shape))
        return F.linear(x, weight, bias) + 1000.0  # marked, so the test sees which path ran

    return one_row


def test_wrapping_keeps_every_parameter_and_output():
    torch.manual_seed(0)
    model = Block()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 8)
    expected = model.qkv_proj(x)
    wrapped = wrap_linears(model)
    assert len(wrapped) == 3 and all(isinstance(m, RoutedLinear) for m in wrapped)
    assert isinstance(model.inner[0], RoutedLinear)
    assert model.state_dict().keys() == before.keys()
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    torch.testing.assert_close(model.qkv_proj(x), expected)


def test_only_one_row_inputs_of_routed_projections_take_the_reduction():
    torch.manual_seed(0)
    model, calls = Block(), []
    wrap_linears(model)
    one, three = torch.randn(1, 8), torch.randn(3, 8)
    model.qkv_proj(one)  # not routed yet
    assert calls == []
    model.qkv_proj.one_row = recording(calls)
    torch.testing.assert_close(model.qkv_proj(three), F.linear(three, model.qkv_proj.weight, model.qkv_proj.bias))
    assert calls == []
    routed = model.qkv_proj(one)
    assert calls == [(1, 8)]
    torch.testing.assert_close(routed, F.linear(one, model.qkv_proj.weight, model.qkv_proj.bias) + 1000.0)
    model.inner[0](one)  # same shape, another module: its own route
    assert calls == [(1, 8)]


def test_groups_are_projections_of_one_shape_and_bias():
    model = Block()
    wrapped = wrap_linears(model)
    groups = group_by_shape(wrapped)
    assert groups == {(8, 12, True): [wrapped[0], wrapped[2]], (4, 8, False): [wrapped[1]]}


def test_compiled_candidates_equal_f_linear():
    torch.manual_seed(0)
    candidates = one_row_candidates(compile_kernel)
    assert set(candidates) == {"tuned_reduction", "reduction"}
    for bias in (None, torch.randn(24)):
        x, w = torch.randn(1, 40), torch.randn(24, 40)
        for name, fn in candidates.items():
            torch.testing.assert_close(fn(x, w, bias), F.linear(x, w, bias), msg=name)


def test_the_route_is_the_fastest_candidate_unless_cublas_wins_by_the_margin():
    assert choose_route({"cublas": 1.0, "tuned_reduction": 0.8, "reduction": 0.9}) == "tuned_reduction"
    assert choose_route({"cublas": 1.0, "tuned_reduction": 0.99, "reduction": 0.97}) == "reduction"
    assert choose_route({"cublas": 1.0, "tuned_reduction": 0.995, "reduction": 1.2}) == "tuned_reduction"  # a tie
    assert choose_route({"cublas": 1.0, "tuned_reduction": 1.015, "reduction": 1.2}) == "tuned_reduction"
    assert choose_route({"cublas": 1.0, "tuned_reduction": 1.04, "reduction": 1.2}) == "tuned_reduction"  # < 5%
    assert choose_route({"cublas": 1.0, "tuned_reduction": 1.06, "reduction": 1.1}) == "cublas"
    assert choose_route({"cublas": 1.0, "tuned_reduction": 1.5, "reduction": 1.1}) == "cublas"


def test_routing_takes_each_groups_fastest_and_leaves_out_a_failing_candidate(caplog):
    """The probe's bookkeeping with a stand-in timer (the real one replays CUDA graphs): per shape group the fastest
    candidate, cuBLAS where it wins by the margin; a candidate that raises is skipped with a warning."""
    model = Block()
    fast, broken = recording([]), recording([])
    costs = {  # (in, out) -> seconds per route
        (8, 12): {F.linear: 1.0, fast: 0.5, broken: None},
        (4, 8): {F.linear: 1.0, fast: 1.06, broken: None},
    }

    def timer(fn, group, x):
        assert x.shape == (1, group[0].weight.shape[1])
        seconds = costs[tuple(group[0].weight.shape[::-1])][fn]
        if seconds is None:
            raise RuntimeError("no kernel for this GPU")
        return seconds

    timings = route_one_row_linears(model, {"fast": fast, "broken": broken}, timer=timer)
    assert timings[(8, 12, True)] == {"cublas": 1.0, "fast": 0.5, "broken": float("inf"), "chosen": "fast"}
    assert timings[(4, 8, False)]["chosen"] == "cublas"
    assert model.qkv_proj.one_row is fast and model.inner[0].one_row is fast and model.o_proj.one_row is None
    assert "one-row matmul broken left out" in caplog.text


def test_routing_off_keeps_cublas_everywhere(monkeypatch):
    monkeypatch.setenv("MINIPIC_ONE_ROW_MATMUL", "0")
    model = Block()
    assert route_one_row_linears(model, {"fast": recording([])}, timer=lambda *a: 0.0) == {}
    assert all(m.one_row is None for m in model.modules() if isinstance(m, RoutedLinear))


def test_cublaslt_is_chosen_only_where_it_wins_by_the_margin():
    assert choose_library({"cublas": 1.0, "cublaslt": 0.97}) == "cublaslt"
    assert choose_library({"cublas": 1.0, "cublaslt": 0.985}) == "cublas"  # within 2%: no switch
    assert choose_library({"cublas": 1.0, "cublaslt": 1.0}) == "cublas"
    assert choose_library({"cublas": 1.0, "cublaslt": 1.3}) == "cublas"


def test_many_row_routes_follow_the_probe_per_shape_and_row_count():
    """The probe's bookkeeping with a stand-in timer and a marked stand-in for cuBLASLt: each (shape group, row
    count) is timed once, one row is left to the one-row probe, and a step takes the marked matmul exactly at the
    row counts where it won for its shape."""
    torch.manual_seed(0)
    model = Block()
    wrap_linears(model)
    calls, timed = [], []
    lt = recording(calls)
    costs = {(8, 12): {2: 0.9, 16: 1.2, 64: 0.5}, (4, 8): {2: 1.0, 16: 0.7, 64: 0.99}}  # cuBLASLt's, cuBLAS's 1.0

    def timer(fn, group, x):
        key = tuple(group[0].weight.shape[::-1])
        timed.append((key, x.shape[0], fn is lt))
        assert x.shape[1] == key[0]
        return costs[key][x.shape[0]] if fn is lt else 1.0

    timings = route_many_row_linears(model, [1, 2, 16, 64, 16], timer=timer, cublaslt=lt)
    assert sorted(timed) == sorted((key, n, is_lt) for key in costs for n in (2, 16, 64) for is_lt in (False, True))
    assert {key: {n: t["chosen"] for n, t in rows.items()} for key, rows in timings.items()} == {
        (8, 12, True): {2: "cublaslt", 16: "cublas", 64: "cublaslt"},
        (4, 8, False): {2: "cublas", 16: "cublaslt", 64: "cublas"},  # 0.99: within the margin
    }
    assert timings[(8, 12, True)][2] == {"cublas": 1.0, "cublaslt": 0.9, "chosen": "cublaslt"}
    assert model.qkv_proj.by_rows == model.inner[0].by_rows == {2: lt, 64: lt} and model.o_proj.by_rows == {16: lt}
    for n, expect_lt in ((2, True), (3, False), (16, False), (64, True), (1, False)):
        x = torch.randn(n, 8)
        plain = F.linear(x, model.qkv_proj.weight, model.qkv_proj.bias)
        torch.testing.assert_close(model.qkv_proj(x), plain + 1000.0 if expect_lt else plain)
    assert calls == [(2, 8), (64, 8)]
    x = torch.randn(16, 4)
    torch.testing.assert_close(model.o_proj(x), F.linear(x, model.o_proj.weight) + 1000.0)


def test_many_row_routing_off_keeps_the_default_library(monkeypatch):
    monkeypatch.setenv("MINIPIC_CUBLASLT", "0")
    monkeypatch.setenv("MINIPIC_SKINNY_MATMUL", "0")
    model = Block()
    wrap_linears(model)
    assert route_many_row_linears(model, [2, 64], timer=lambda *a: 1.0, cublaslt=recording([])) == {}
    assert all(m.by_rows == {} for m in model.modules() if isinstance(m, RoutedLinear))


def test_a_failing_cublaslt_leaves_the_default_with_a_warning(caplog):
    """A torch built without cuBLASLt (where preferring it raises, as on this CPU build) must not stop the engine's
    start-up."""
    model = Block()
    wrap_linears(model)

    def timer(fn, group, x):
        fn(x, group[0].weight, group[0].bias)
        return 1.0

    def unavailable(x, weight, bias):  # torch's own message on such a build
        raise RuntimeError("Cannot set preferred backend to cuBLASLt if PyTorch has not been compiled with cuBLASLt.")

    timings = route_many_row_linears(model, [2, 8], timer=timer, cublaslt=unavailable)
    assert {t["chosen"] for rows in timings.values() for t in rows.values()} == {"cublas"}
    assert timings[(4, 8, False)][2] == {"cublas": 1.0, "cublaslt": float("inf"), "chosen": "cublas"}
    assert all(m.by_rows == {} for m in model.modules() if isinstance(m, RoutedLinear))
    assert "cuBLASLt left out for (8, 12, True) at 2 rows" in caplog.text


class StandInSkinny:
    """A marked stand-in for ops/skinny_matmul.py's SkinnyRoute: it takes the rows in `rows` for weights of `width`
    input features, or fails where `fails` says."""

    def __init__(self, calls: list, rows=(2, 16), width=8, fails=False):
        self.calls, self.rows, self.width, self.fails = calls, rows, width, fails

    def supports(self, num_rows, weight):
        return num_rows in self.rows and weight.shape[1] == self.width

    def __call__(self, x, weight, bias):
        if self.fails:
            raise RuntimeError("no TMA here")
        self.calls.append(tuple(x.shape))
        return F.linear(x, weight, bias) - 1000.0


def test_the_skinny_route_is_taken_wherever_it_runs_whatever_the_timings(monkeypatch):
    """The skinny matmul is timed beside the libraries and taken at every (shape, rows) it supports, even where a
    library was faster (the step measures it); elsewhere the libraries' routes stand, and with cuBLASLt off it is
    still taken."""
    model = Block()
    wrap_linears(model)
    calls, lt_calls = [], []
    skinny, lt = StandInSkinny(calls), recording(lt_calls)

    def timer(fn, group, x):
        return {F.linear: 1.0, lt: 0.5}.get(fn, 2.0)  # the skinny matmul slowest of all

    timings = route_many_row_linears(model, [2, 16, 64], timer=timer, cublaslt=lt, skinny=skinny)
    assert {key: {n: t["chosen"] for n, t in rows.items()} for key, rows in timings.items()} == {
        (8, 12, True): {2: "skinny", 16: "skinny", 64: "cublaslt"},
        (4, 8, False): {2: "cublaslt", 16: "cublaslt", 64: "cublaslt"},  # 4 input features: not supported
    }
    assert timings[(8, 12, True)][2] == {"cublas": 1.0, "cublaslt": 0.5, "skinny": 2.0, "chosen": "skinny"}
    assert model.qkv_proj.by_rows == {2: skinny, 16: skinny, 64: lt}
    x = torch.randn(16, 8)
    torch.testing.assert_close(model.qkv_proj(x), F.linear(x, model.qkv_proj.weight, model.qkv_proj.bias) - 1000.0)
    monkeypatch.setenv("MINIPIC_CUBLASLT", "0")
    model = Block()
    wrap_linears(model)
    timings = route_many_row_linears(model, [2, 64], timer=timer, cublaslt=lt, skinny=skinny)
    assert timings[(8, 12, True)] == {2: {"cublas": 1.0, "cublaslt": float("inf"), "skinny": 2.0, "chosen": "skinny"},
                                      64: {"cublas": 1.0, "cublaslt": float("inf"), "chosen": "cublas"}}  # fmt: skip
    assert model.qkv_proj.by_rows == {2: skinny} and model.o_proj.by_rows == {}


def test_a_failing_skinny_route_leaves_the_librarys_with_a_warning(caplog):
    model = Block()
    wrap_linears(model)
    skinny = StandInSkinny([], fails=True)

    def timer(fn, group, x):
        fn(x, group[0].weight, group[0].bias)
        return 1.0

    timings = route_many_row_linears(model, [2], timer=timer, cublaslt=recording([]), skinny=skinny)
    assert timings[(8, 12, True)][2] == {"cublas": 1.0, "cublaslt": 1.0, "chosen": "cublas"}
    assert all(m.by_rows == {} for m in model.modules() if isinstance(m, RoutedLinear))
    assert "skinny matmul left out for (8, 12, True) at 2 rows: RuntimeError: no TMA here" in caplog.text


def test_the_skinny_route_is_on_unless_turned_off(monkeypatch):
    from minipic_lite.models.routed_linear import skinny_enabled

    monkeypatch.delenv("MINIPIC_SKINNY_MATMUL", raising=False)
    assert skinny_enabled()
    monkeypatch.setenv("MINIPIC_SKINNY_MATMUL", "0")
    assert not skinny_enabled()
    monkeypatch.setenv("MINIPIC_SKINNY_MATMUL", "1")
    assert skinny_enabled()
    monkeypatch.setenv("MINIPIC_CUBLASLT", "0")
    model = Block()
    wrap_linears(model)  # CPU weights: the real route supports none of them, and each keeps cuBLAS
    assert route_many_row_linears(model, [2], timer=lambda *a: 1.0) == {
        key: {2: {"cublas": 1.0, "cublaslt": float("inf"), "chosen": "cublas"}}
        for key in [(8, 12, True), (4, 8, False)]
    }
