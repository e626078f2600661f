"""CPU matmuls: decode steps on oneDNN-prepacked weights or the native C loop (the probe picks per row count),
F.linear (MKL) for everything else."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import minipic_lite as mp
from minipic_lite import model_runner
from minipic_lite.models import packed_linear
from minipic_lite.models.packed_linear import (
    MatmulRoute,
    PackedLinear,
    can_pack,
    decode_routes,
    drop_packed_weights,
    pack_linears,
    read_routes,
    route_for_rows,
    routes_path,
    write_routes,
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
    route.kind = "packed"
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
    route = MatmulRoute(kind="packed")
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
    "routes, rows, expected",
    [({1: "native", 2: "native", 4: "packed", 8: "packed"}, 1, "native"),
     ({1: "native", 2: "native", 4: "packed", 8: "packed"}, 3, "native"),
     ({1: "native", 2: "native", 4: "packed", 8: "packed"}, 4, "packed"),
     ({1: "native", 2: "linear", 4: "packed", 8: "linear"}, 64, "linear"),
     ({2: "packed", 4: "linear"}, 1, "packed"),
     ({}, 5, "linear")],
)  # fmt: skip
def test_a_step_takes_the_route_chosen_at_the_largest_probe_not_above_its_rows(routes, rows, expected):
    assert route_for_rows(routes, rows) == expected


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bf16)])
def test_decode_routes_times_every_route_the_layers_hold_and_leaves_the_route_off(dtype):
    model = nn.Sequential(nn.Linear(64, 256, dtype=dtype), nn.Linear(256, 64, dtype=dtype))
    route = pack_linears(model)
    routes = decode_routes(model)
    assert set(routes) == {1, 2, 4, 8} and set(routes.values()) <= {"linear", "packed", "native"}
    assert route.kind == "linear"
    drop_packed_weights(model)  # without the packed copies the probe cannot choose them
    assert "packed" not in decode_routes(model).values()


def test_the_step_contract_routes_decode_steps_to_the_probes_choice(llm):
    engine = llm.engine
    route = engine.runner.model.matmul_route
    routes, engine.runner.decode_routes = engine.runner.decode_routes, {1: "packed"}  # the start-up timing aside
    request_id = engine.add_request(llm.encode("The capital of France is")[0], mp.SamplingParams(max_tokens=3))
    out = engine.scheduler.schedule()  # prefill
    assert engine.runner.prepare(out).meta.cpu_matmul == "linear"
    engine.scheduler.postprocess(out, engine.runner.execute(out), engine._stops)
    assert route.kind == "linear"  # the model set the route from the step's metadata
    out = engine.scheduler.schedule()  # decode
    assert engine.runner.prepare(out).meta.cpu_matmul == "packed"
    engine.scheduler.postprocess(out, engine.runner.execute(out), engine._stops)
    assert route.kind == "packed"
    engine.abort(request_id)
    engine.runner.decode_routes = {1: "linear", 2: "native"}  # a decode step of one row stays on F.linear
    request_id = engine.add_request(llm.encode("The capital of France is")[0], mp.SamplingParams(max_tokens=3))
    for _ in range(2):  # prefill, then decode
        out = engine.scheduler.schedule()
        assert engine.runner.prepare(out).meta.cpu_matmul == "linear"
        engine.scheduler.postprocess(out, engine.runner.execute(out), engine._stops)
    engine.abort(request_id)
    engine.runner.decode_routes = routes


def test_an_engine_whose_probe_never_packs_frees_the_packed_copies(monkeypatch):
    """When the packed weights win at no probed row count, they (as large as the model's) are freed."""
    monkeypatch.setattr("minipic_lite.model_runner.decode_routes", lambda model: {1: "native", 8: "linear"})
    monkeypatch.setattr("minipic_lite.model_runner.read_routes", lambda path: None)  # no picks kept: the probe runs
    monkeypatch.setattr("minipic_lite.model_runner.write_routes", lambda path, routes: None)  # nor are these kept
    llm = mp.LLM(max_model_len=256)
    model = llm.engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert linears and all(m.packed is None for m in linears)
    out = llm.generate("The capital of France is", mp.SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert len(out.token_ids) == 4 and model.matmul_route.kind == "native"  # its last step a one-row decode
    llm.close()


def test_drop_packed_weights_keeps_the_f_linear_route():
    linear = nn.Linear(8, 4)
    model = nn.Sequential(linear)
    route = pack_linears(model)
    drop_packed_weights(model)
    route.kind = "packed"  # even if asked, a layer without its packed copy runs F.linear
    x = torch.randn(3, 8)
    assert model[0].packed is None and torch.equal(model(x), F.linear(x, linear.weight, linear.bias))


def test_the_first_start_keeps_the_probes_picks_and_the_next_start_reads_them(monkeypatch, tmp_path):
    """The probe runs once per machine: a second engine reads the picks back and packs no copies they do not use."""
    monkeypatch.setattr(packed_linear, "cache_root", lambda: tmp_path)
    calls = []
    monkeypatch.setattr(model_runner, "decode_routes", lambda model: calls.append(1) or decode_routes(model))
    packs = []  # each start's `pack`: whether it builds the packed copies
    monkeypatch.setattr(model_runner, "pack_linears", lambda m, pack: packs.append(pack) or pack_linears(m, pack))
    llm = mp.LLM(max_model_len=256)
    first = llm.engine.runner.decode_routes
    llm.close()
    [kept] = (tmp_path / "routes").iterdir()
    assert len(calls) == 1 and read_routes(kept) == first and set(first) == {1, 2, 4, 8}
    write_routes(kept, {1: "linear", 2: "native", 4: "linear", 8: "linear"})  # picks that never pack
    llm = mp.LLM(max_model_len=256)
    assert len(calls) == 1 and llm.engine.runner.decode_routes == {1: "linear", 2: "native", 4: "linear", 8: "linear"}
    linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, PackedLinear)]
    assert linears and all(m.packed is None for m in linears) and packs[1:] == [False]  # never built, not dropped
    out = llm.generate("The capital of France is", mp.SamplingParams(max_tokens=3, temperature=0.0))[0]
    assert len(out.token_ids) == 3
    llm.close()


def test_kept_picks_read_back_only_when_whole(tmp_path):
    path = tmp_path / "cache" / "routes" / "key.json"  # no cache folder yet: write_routes makes it
    assert read_routes(path) is None  # none kept
    write_routes(path, {1: "native", 8: "packed"})
    assert read_routes(path) == {1: "native", 8: "packed"}
    write_routes(path, {1: "native", 2: "linear", 8: "packed"})  # written again, its folder there; every route
    assert read_routes(path) == {1: "native", 2: "linear", 8: "packed"}
    for text in ("{", "[1, 2]", "{}", '{"1": "mystery"}', '{"one": "linear"}'):
        path.write_text(text)
        assert read_routes(path) is None, text
    (tmp_path / "a file").touch()
    write_routes(tmp_path / "a file" / "routes.json", {1: "linear"})  # its folder is a file: skipped, no error
    assert (tmp_path / "a file").is_file() and read_routes(tmp_path / "a file" / "routes.json") is None


def test_the_picks_key_changes_with_what_they_depend_on(monkeypatch, tmp_path):
    monkeypatch.setattr(packed_linear, "cache_root", lambda: tmp_path)

    def model(width=64, dtype=torch.float32):
        return nn.Sequential(nn.Linear(width, 128, dtype=dtype), nn.Linear(128, width, dtype=dtype))

    path = routes_path(model())
    assert path.parent == tmp_path / "routes" and routes_path(model()) == path  # the same model: the same picks
    assert routes_path(model(width=32)) != path and routes_path(model(dtype=torch.bfloat16)) != path
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert routes_path(model()) != path
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(packed_linear.native, "cpu_signature", lambda: "another CPU")
    assert routes_path(model()) != path
