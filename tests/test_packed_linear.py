"""CPU matmuls: oneDNN-prepacked weights for decode steps, F.linear (MKL) for everything else."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import minipic_lite as mp
from minipic_lite.models.packed_linear import (
    MatmulRoute,
    PackedLinear,
    can_pack,
    drop_packed_weights,
    first_of_winning_tail,
    pack_linears,
    packed_min_rows,
)

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.float32), reason="torch lacks oneDNN")
needs_bf16 = pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN has no bf16 kernels for this CPU"
)


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_matmul_equals_f_linear_to_fp32_rounding(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(576, 960, bias=bias)
    route = MatmulRoute()
    packed = PackedLinear(linear, route)
    x = torch.randn(rows, 576)
    expected = x.double() @ linear.weight.double().T + (linear.bias.double() if bias else 0)
    assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias))  # route off: MKL exactly
    route.packed = True
    out = packed(x)
    assert out.shape == (rows, 960)
    err = (out.double() - expected).abs().max().item() / expected.abs().max().item()
    print(f"relative error {err:.2e}")
    assert err < 1e-5


@needs_bf16
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_bf16_packed_matmul_equals_f_linear_bit_for_bit(rows):
    """In bfloat16 F.linear is oneDNN too: the packed route changes the speed, not one bit of the result."""
    torch.manual_seed(rows)
    linear = nn.Linear(576, 1536, bias=False, dtype=torch.bfloat16)
    route = MatmulRoute(packed=True)
    x = torch.randn(rows, 576, dtype=torch.bfloat16)
    out = PackedLinear(linear, route)(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, F.linear(x, linear.weight))


def test_pack_linears_replaces_every_linear_and_shares_one_route():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4, bias=False)))
    route = pack_linears(model)
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(linears) == 2 and all(m.route is route for m in linears)
    assert not any(type(m) is nn.Linear for m in model.modules())


@pytest.mark.parametrize(
    "wins, expected",
    [([True] * 4, 1), ([False, False, True, True], 4), ([True, False, True, True], 4),
     ([True, True, True, False], None), ([False] * 4, None)],
)  # fmt: skip
def test_the_packed_route_starts_where_its_wins_run_to_the_largest_probe(wins, expected):
    assert first_of_winning_tail((1, 2, 4, 8), wins) == expected


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bf16)])
def test_packed_min_rows_times_both_routes_and_leaves_the_route_off(dtype):
    model = nn.Sequential(nn.Linear(64, 256, dtype=dtype), nn.Linear(256, 64, dtype=dtype))
    route = pack_linears(model)
    assert packed_min_rows(model) in (1, 2, 4, 8, None)  # its probes take the weights' dtype
    assert route.packed is False


def test_the_step_contract_routes_decode_steps_to_the_packed_weights(llm):
    engine = llm.engine
    route = engine.runner.model.matmul_route
    min_rows, engine.runner.packed_min_rows = engine.runner.packed_min_rows, 1  # the start-up timing aside
    request_id = engine.add_request(llm.encode("The capital of France is")[0], mp.SamplingParams(max_tokens=3))
    out = engine.scheduler.schedule()  # prefill
    assert engine.runner.prepare(out).meta.use_packed_weights is False
    engine.scheduler.postprocess(out, engine.runner.execute(out), engine._stops)
    assert route.packed is False  # the model set the route from the step's metadata
    out = engine.scheduler.schedule()  # decode
    assert engine.runner.prepare(out).meta.use_packed_weights is True
    engine.scheduler.postprocess(out, engine.runner.execute(out), engine._stops)
    assert route.packed is True
    engine.abort(request_id)
    engine.runner.packed_min_rows = 2  # a decode step of one row stays on F.linear
    request_id = engine.add_request(llm.encode("The capital of France is")[0], mp.SamplingParams(max_tokens=3))
    for _ in range(2):  # prefill, then decode
        out = engine.scheduler.schedule()
        assert engine.runner.prepare(out).meta.use_packed_weights is False
        engine.scheduler.postprocess(out, engine.runner.execute(out), engine._stops)
    engine.abort(request_id)
    engine.runner.packed_min_rows = min_rows


def test_an_engine_whose_probe_never_packs_frees_the_packed_copies(monkeypatch):
    """When F.linear wins at every probed row count, the packed weights (as large as the model's) are freed and
    every step runs F.linear."""
    monkeypatch.setattr("minipic_lite.model_runner.packed_min_rows", lambda model: None)
    llm = mp.LLM(max_model_len=256)
    model = llm.engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert linears and all(m.packed is None for m in linears)
    out = llm.generate("The capital of France is", mp.SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert len(out.token_ids) == 4 and model.matmul_route.packed is False
    llm.close()


def test_drop_packed_weights_keeps_the_f_linear_route():
    linear = nn.Linear(8, 4)
    model = nn.Sequential(linear)
    route = pack_linears(model)
    drop_packed_weights(model)
    route.packed = True  # even if asked, a layer without its packed copy runs F.linear
    x = torch.randn(3, 8)
    assert model[0].packed is None and torch.equal(model(x), F.linear(x, linear.weight, linear.bias))
