"""The CPU's native decode matmul (models/native.py) held to F.linear, and its build: cached per source,
compiler and CPU; off with a reason where it cannot run, the engine then on oneDNN."""

import logging
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minipic_lite as mp
from minipic_lite.models import native
from minipic_lite.models.native import native_gemv as gemv
from minipic_lite.models.packed_linear import MatmulRoute, PackedLinear

pytestmark = pytest.mark.skipif(native.load() is None, reason="no C compiler or not Linux: the loop is off")


@pytest.fixture
def fresh_load(monkeypatch, tmp_path):
    """`load()` run afresh (its cache cleared before and after) into an empty cache directory."""
    monkeypatch.setenv("MINIPIC_CACHE_DIR", str(tmp_path))
    native.load.cache_clear()
    yield native.load
    native.load.cache_clear()


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 13])
@pytest.mark.parametrize("k", [576, 100, 7])  # 100 and 7: a sum whose length no vector width divides
@pytest.mark.parametrize("bias", [False, True])
def test_float32_equals_f_linear_to_float32_rounding(rows, k, bias):
    torch.manual_seed(rows * k)
    linear = nn.Linear(k, 333, bias=bias)
    x = torch.randn(rows, k)
    exact = x.double() @ linear.weight.double().T + (linear.bias.double() if bias else 0)
    out = gemv(x, linear.weight, linear.bias)
    assert out.dtype == torch.float32 and out.shape == (rows, 333)
    scale = exact.abs().max().item()
    mkl = F.linear(x, linear.weight, linear.bias)
    err, mkl_err = ((y.double() - exact).abs().max().item() / scale for y in (out, mkl))
    print(f"relative error {err:.2e}, F.linear's {mkl_err:.2e}")
    assert err < 1e-6


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_bfloat16_is_the_float32_sum_rounded_to_nearest_even(rows):
    """A sum of one product of two bf16 numbers is exact in float32, so the output must be torch's rounding of it
    bit for bit; longer sums part from F.linear's (oneDNN's order of additions) by at most one bf16 step."""
    torch.manual_seed(rows)
    x, w = torch.randn(rows, 1, dtype=torch.bfloat16), torch.randn(4096, 1, dtype=torch.bfloat16)
    assert torch.equal(gemv(x, w), (x.float() @ w.float().T).to(torch.bfloat16))
    x, w = torch.randn(rows, 576, dtype=torch.bfloat16), torch.randn(960, 576, dtype=torch.bfloat16)
    out, ref = gemv(x, w), F.linear(x, w)
    step = ref.float().abs() * 2**-7  # one bf16 step (8 significant bits) at the value's scale
    assert out.dtype == torch.bfloat16 and bool(((out.float() - ref.float()).abs() <= step).all())
    assert (out == ref).float().mean() > 0.9


def test_special_values_pass_through_as_torch_passes_them():
    x = torch.tensor([[1.0, 2.0], [float("nan"), 0.0], [float("inf"), 1.0], [3e38, 3e38]], dtype=torch.bfloat16)
    w = torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=torch.bfloat16)
    out = gemv(x, w)
    ref = (x.float() @ w.float().T).to(torch.bfloat16)  # exact float32 sums, rounded
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out[~ref.isnan()], ref[~ref.isnan()])
    assert out[1].isnan().all() and out[3, 0].isinf()  # 6e38 is past float32's range


def test_leading_dims_are_kept_and_an_unsupported_weight_is_refused():
    torch.manual_seed(0)
    w = torch.randn(6, 8)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(gemv(x, w), F.linear(x, w))
    assert gemv(x, w).shape == (2, 3, 6)
    assert native.supports(w) and not native.supports(w.t())  # transposed: not contiguous
    assert not native.supports(w.half()) and not native.supports(w[0])


def test_the_native_route_runs_the_loop_and_falls_back_to_f_linear_where_the_layer_cannot(monkeypatch):
    torch.manual_seed(0)
    calls = []
    monkeypatch.setattr(native, "native_gemv", lambda x, w, b: calls.append(x.shape) or F.linear(x, w, b))
    linear = PackedLinear(nn.Linear(16, 8), MatmulRoute(kind="native"), pack=False)
    x = torch.randn(2, 16)
    linear(x)
    assert calls == [(2, 16)]
    linear.native = False  # e.g. a weight the loop does not support
    torch.testing.assert_close(linear(x), F.linear(x, linear.weight, linear.bias))
    assert calls == [(2, 16)]
    wide = PackedLinear(nn.Linear(16, 8, dtype=torch.float64), MatmulRoute(kind="native"), pack=False)
    assert not wide.native  # a weight the loop does not support (float64): its layer never takes the loop
    torch.testing.assert_close(wide(x.double()), F.linear(x.double(), wide.weight, wide.bias))
    assert calls == [(2, 16)]


def test_the_build_is_cached_and_keyed_by_the_cpu(fresh_load, tmp_path, monkeypatch):
    assert fresh_load() is not None
    (path,) = (tmp_path / "native").glob("kernels-*.so")
    mtime = path.stat().st_mtime_ns
    native.load.cache_clear()
    assert fresh_load() is not None and path.stat().st_mtime_ns == mtime  # read from the cache, not rebuilt
    monkeypatch.setattr(native, "cpu_signature", lambda: "another CPU")
    native.load.cache_clear()
    assert fresh_load() is not None
    assert len(list((tmp_path / "native").glob("kernels-*.so"))) == 2  # -march=native: one library per CPU


@pytest.mark.parametrize(
    "env, patches, reason",
    [({"MINIPIC_NATIVE": "0"}, {}, "MINIPIC_NATIVE=0"),
     ({"CC": "/bin/false"}, {}, "its build failed (/bin/false exited with 1"),
     ({}, {"platform.system": lambda: "Darwin"}, "it is built for Linux only (this is Darwin)"),
     ({}, {"shutil.which": lambda name: None}, "no C compiler (cc or gcc) on PATH"),
     ({}, {"_torch_uses_gnu_openmp": lambda: False}, "torch's OpenMP runtime is not GNU's libgomp")],
)  # fmt: skip
def test_where_it_cannot_run_load_says_why_and_returns_none(fresh_load, monkeypatch, caplog, env, patches, reason):
    monkeypatch.delenv("CC", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name, value in patches.items():
        monkeypatch.setattr(f"minipic_lite.models.native.{name}", value)
    with caplog.at_level(logging.INFO, logger="minipic_lite.models.native"):
        assert fresh_load() is None
    assert reason in caplog.text and "decode steps use oneDNN" in caplog.text


def test_without_the_loop_an_engine_decodes_on_onednn_with_the_same_tokens(monkeypatch, llm):
    """With the loop off the engine's probe leaves it out; float32 greedy tokens are the same as the loop's."""
    params = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompt = "The history of the printing press"
    routes, llm.engine.runner.decode_routes = llm.engine.runner.decode_routes, {1: "native"}
    on = llm.generate(prompt, params)[0].token_ids
    llm.engine.runner.decode_routes = routes
    monkeypatch.setenv("MINIPIC_NATIVE", "0")
    native.load.cache_clear()
    try:
        off = mp.LLM(max_model_len=256)
        assert "native" not in off.engine.runner.decode_routes.values()
        assert off.generate(prompt, params)[0].token_ids == on
        off.close()
    finally:
        native.load.cache_clear()


def test_a_cpu_model_has_a_decode_route_where_onednn_packs_or_the_loop_runs(monkeypatch):
    from minipic_lite.models import packed_linear

    cpu = torch.device("cpu")
    assert packed_linear.can_route(cpu, torch.float32) and packed_linear.can_route(cpu, torch.bfloat16)
    assert not packed_linear.can_route(cpu, torch.float16)  # neither packs nor takes float16
    assert not packed_linear.can_route(torch.device("meta"), torch.float32)
    monkeypatch.setattr(packed_linear, "can_pack", lambda device, dtype: False)  # a torch without oneDNN
    assert packed_linear.can_route(cpu, torch.bfloat16)  # the loop alone is a route
    model = nn.Sequential(nn.Linear(64, 128, dtype=torch.bfloat16))
    packed_linear.pack_linears(model, pack=False)
    assert model[0].packed is None and model[0].native
    assert set(packed_linear.decode_routes(model).values()) <= {"linear", "native"}


def test_a_failed_build_logs_the_compilers_errors_on_one_line(fresh_load, monkeypatch, caplog, tmp_path):
    compiler = tmp_path / "fake-cc"
    script = ["#!/bin/sh", '[ "$1" = --version ] && exit 0', 'echo "gemv.c:1: error: boom" >&2', 'echo "one more" >&2']
    compiler.write_text("\n".join([*script, "exit 3", ""]))
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    with caplog.at_level(logging.INFO, logger="minipic_lite.models.native"):
        assert fresh_load() is None
    assert f"its build failed ({compiler} exited with 3: gemv.c:1: error: boom one more)" in caplog.text


def test_a_long_build_failure_is_logged_on_one_line_cut_short(fresh_load, monkeypatch, caplog, tmp_path):
    compiler = tmp_path / "fake-cc"
    script = ["#!/bin/sh", '[ "$1" = --version ] && exit 0', "printf '%0600d' 0 >&2", "exit 1", ""]
    compiler.write_text("\n".join(script))
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    with caplog.at_level(logging.INFO, logger="minipic_lite.models.native"):
        assert fresh_load() is None
    assert f"its build failed ({compiler} exited with 1: 000" in caplog.text
    assert "0" * 500 not in caplog.text and not any("\n" in r.getMessage() for r in caplog.records)


def test_an_input_in_another_dtype_or_layout_is_cast_and_made_contiguous():
    """The loop reads x as a contiguous matrix of weight's type: a float32 input to a bf16 weight is rounded first, and
    a transposed input is read by its values, not its memory order."""
    torch.manual_seed(0)
    w = torch.randn(24, 16, dtype=torch.bfloat16)
    x = torch.randn(3, 16)
    assert torch.equal(gemv(x, w), gemv(x.to(torch.bfloat16), w))
    w32, xt = w.float(), torch.randn(16, 3).t()  # (3, 16), not contiguous
    assert not xt.is_contiguous()
    torch.testing.assert_close(gemv(xt, w32), F.linear(xt, w32))


def test_a_build_that_times_out_is_off_with_a_reason(fresh_load, monkeypatch, caplog):
    def run(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(native.subprocess, "run", run)
    with caplog.at_level(logging.INFO, logger="minipic_lite.models.native"):
        assert fresh_load() is None
    compiler = Path(native._compiler()).name
    assert f"its build failed ({compiler} took over 30 s to print its version)" in caplog.text


def test_a_compile_that_hangs_is_cut_off_and_the_kernels_are_off(fresh_load, monkeypatch, caplog):
    run, timeouts = subprocess.run, []

    def compile_hangs(command, **kwargs):
        if command[1:] == ["--version"]:
            return run(command, **kwargs)
        timeouts.append(kwargs.get("timeout"))
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(native.subprocess, "run", compile_hangs)
    with caplog.at_level(logging.INFO, logger="minipic_lite.models.native"):
        assert fresh_load() is None
    assert len(timeouts) == 1 and 30 <= timeouts[0] <= 600  # time for a cold compile, not forever
    # NOTE: the compile command is long (flags, temporary paths): the reason still says it timed out, and after what
    assert f"took over {timeouts[0]:g} s compiling the kernels)" in caplog.text


def test_the_build_is_keyed_by_the_compilers_version(fresh_load, tmp_path, monkeypatch):
    """The same compiler path after an upgrade (another `--version`) builds its own library."""
    compiler = tmp_path / "versioned-cc"
    script = ["#!/bin/sh", '[ "$1" = --version ] && { echo "cc $FAKE_CC_VERSION"; exit 0; }', 'exec cc "$@"', ""]
    compiler.write_text("\n".join(script))
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    for version in ("12.2.0", "13.1.0"):
        monkeypatch.setenv("FAKE_CC_VERSION", version)
        native.load.cache_clear()
        assert fresh_load() is not None
    assert len(list((tmp_path / "native").glob("kernels-*.so"))) == 2
