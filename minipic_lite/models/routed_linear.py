"""Linear layers that, on CUDA, route each step's matmul to the kernel a start-up probe found fastest for its rows.

One row (batch-1 decode) may take an Inductor reduction kernel instead of cuBLAS's matmul; more rows (the CUDA graphs'
buckets) cuBLASLt's instead of cuBLAS's, and on Hopper ops/skinny_matmul.py's (see `route_many_row_linears`).

At batch-1 decode each projection reads its weights once, so it should run at the copy rate. cuBLAS does not always:
on the H200 with Llama-3-8B's shapes it read `qkv` at 0.82 of the copy rate (its 64-column tiles leave SMs idle) and
`o` at 0.66 (split-K plus a reduction kernel). With coordinate-descent tuning on, Inductor writes a one-row matmul
as a sum over the input features, a reduction kernel whose block sizes it tunes at its first call (`one_row_matmul`
under ONE_ROW_OPTIONS); the same sum written out (`sum_over_features`) gets Inductor's default reduction settings.
Which one wins depends on the shape, the GPU and the tuning's outcome, so `route_one_row_linears` times cuBLAS and
each candidate at start-up on each group of same-shaped projections (every layer's weights in turn, so they come
from memory as in a decode step, not from L2) and keeps the fastest candidate unless cuBLAS beats it by
CUBLAS_MARGIN (the probe favours cuBLAS: see the note there). On the H200 (`bench/results/gemv29-a7031d9-*`, a pass
over 32 layers): `qkv` 418 µs against cuBLAS's 491, `o` 330 against 402, `gate_up` 1,716 against 1,787, `down` 908
(the written-out sum) against 996, the LM head 243 against 252; batch-1 decode 225.7 tok/s against 203.3 with cuBLAS
everywhere. The probe adds to a CUDA engine's start-up: the 8B-shaped bench's engine started in 57 s against 39 s
without it, with Inductor's cache carried from earlier runs (a fresh cache also tunes each shape once).
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

# Inductor's settings for `one_row_matmul` (max-autotune's, without its CUDA graphs): coordinate-descent tuning is
# what makes Inductor write a one-row matmul as a reduction; max-autotune tries every reduction config first
ONE_ROW_OPTIONS = {"max_autotune": True, "coordinate_descent_tuning": True}
# NOTE: the probe's graph of one shape's calls times the reductions slower against cuBLAS than a decode step runs
# them. H200, batch-1 decode profiles: `qkv` 12.9 µs a call routed (de9b6e7) against cuBLAS's 15.8 (99f00ed), where
# the probe had 513 against 526 µs a pass (16.0 against 16.4 a call); `gate_up` 54.5 routed (de9b6e7) against 58.9
# (19a158b), the probe 1,744 against 1,812 and 1,803 against 1,815. So the candidate is taken unless cuBLAS beats it
# by this much (before 3c5afae a candidate had to beat cuBLAS by 2%, and near ties kept cuBLAS: b1 0.769 at 19a158b,
# 0.798 with every projection routed at de9b6e7). 5% since stop 27 (2% from 3c5afae): on one code the probe had
# cuBLAS's `gate_up` 3.7% ahead in one call of four (1,774 against 1,841 µs a pass at 7bfa47a: b1 0.761 there, 0.785 /
# 0.817 / 0.783 in the three calls that routed it), and across those calls one kernel's pass spread by up to 11%
CUBLAS_MARGIN = 0.05
PROBE_PASSES = 3  # timed passes over a group's weights, after a warm-up pass (which also compiles and tunes)


def one_row_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear; compiled with ONE_ROW_OPTIONS, Inductor decomposes it for x [1, in] into a tuned reduction."""
    return F.linear(x, weight, bias)


def sum_over_features(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [1, in] @ weight [out, in]^T (+ bias) as a float32 sum over `in`: a reduction kernel under any settings."""
    out = (x[:, None, :].float() * weight.float()).sum(-1)  # (1, out)
    return (out if bias is None else out + bias.float()).to(x.dtype)


def one_row_candidates(compile_fn) -> dict:
    """{name: fn(x, weight, bias)}: the compiled one-row matmuls the probe times against cuBLAS."""
    return {
        "tuned_reduction": compile_fn(one_row_matmul, options=ONE_ROW_OPTIONS, dynamic=False),
        "reduction": compile_fn(sum_over_features, dynamic=False),
    }


class RoutedLinear(nn.Module):
    """`nn.Linear`'s weight and bias, multiplied by `one_row` when the input has one row and the probe chose one
    (`route_one_row_linears`), by `by_rows[n]` when it has n rows and the probe chose cuBLASLt for n
    (`route_many_row_linears`), by `F.linear` otherwise."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.one_row = None  # fn(x, weight, bias), or None: cuBLAS
        self.by_rows = {}  # {rows: fn(x, weight, bias)}; rows not in it: F.linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: x.shape[0] is fixed within a CUDA graph's bucket, so a captured step holds one branch
        if x.dim() == 2:
            fn = self.one_row if x.shape[0] == 1 else self.by_rows.get(x.shape[0])
            if fn is not None:
                return fn(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def wrap_linears(model: nn.Module) -> list[RoutedLinear]:
    """Replace every `nn.Linear` of `model` by a RoutedLinear sharing its parameters (state dict unchanged)."""
    wrapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                wrapped.append(RoutedLinear(child))
                setattr(parent, name, wrapped[-1])
    return wrapped


def group_by_shape(linears: list[RoutedLinear]) -> dict[tuple, list[RoutedLinear]]:
    """Projections that share a kernel: same (in, out) features and whether they have a bias."""
    groups = defaultdict(list)
    for m in linears:
        groups[(*m.weight.shape[::-1], m.bias is not None)].append(m)
    return dict(groups)


def _seconds(fn, group: list[RoutedLinear], x: torch.Tensor) -> float:
    """GPU seconds of one pass of `fn` over every weight of `group`, replayed as a CUDA graph (as a decode step runs
    it: eager launches of a compiled function would time Python's dispatch, ~50 µs a call, not the GPU): the least
    of PROBE_PASSES replays."""
    for m in group:  # warm-up: compiles (and tunes) the reduction at its first call
        fn(x, m.weight, m.bias)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for m in group:
            fn(x, m.weight, m.bias)
    graph.replay()
    best = float("inf")
    for _ in range(PROBE_PASSES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def choose_route(seconds: dict[str, float]) -> str:
    """The fastest candidate of `seconds` ({"cublas": s, candidate: s, ...}), unless cuBLAS is faster than it by
    CUBLAS_MARGIN: then "cublas"."""
    best = min((name for name in seconds if name != "cublas"), key=seconds.get)
    return best if seconds[best] * (1 - CUBLAS_MARGIN) <= seconds["cublas"] else "cublas"


def route_one_row_linears(model: nn.Module, candidates: dict, timer=None) -> dict[tuple, dict]:
    """Wrap `model`'s linears (CUDA, weights loaded) and time, per shape group, cuBLAS and each of `candidates`
    ({name: fn(x, weight, bias)}) on one row; the fastest candidate is taken unless cuBLAS beats it by CUBLAS_MARGIN.
    A candidate that fails to compile or run is left out (with a warning). `MINIPIC_ONE_ROW_MATMUL=0` keeps cuBLAS
    everywhere. `timer(fn, group, x)` -> seconds (default: CUDA-graph replays). Returns {(in, out, bias):
    {"cublas": s, name: s, ..., "chosen": name or "cublas"}} (empty when off)."""
    linears = wrap_linears(model)
    if os.environ.get("MINIPIC_ONE_ROW_MATMUL", "1") == "0":
        return {}
    timer = timer or _seconds
    timings = {}
    with torch.inference_mode():
        for key, group in group_by_shape(linears).items():
            w = group[0].weight
            x = torch.randn(1, w.shape[1], device=w.device, dtype=w.dtype)
            seconds = {"cublas": timer(F.linear, group, x)}
            for name, fn in candidates.items():
                try:
                    seconds[name] = timer(fn, group, x)
                except Exception as e:  # noqa: BLE001 (a candidate is an optimization: cuBLAS still works)
                    logger.warning("one-row matmul %s left out for %s: %s: %s", name, key, type(e).__name__, e)
                    seconds[name] = float("inf")
            chosen = choose_route(seconds)
            for m in group:
                m.one_row = candidates.get(chosen)
            timings[key] = seconds | {"chosen": chosen}
    return timings


# -- steps of more rows: cuBLAS or cuBLASLt ---------------------------------------------------------------------
# NOTE: on the H200 with Llama-3-8B's shapes (bench/results/next82c-299009c-*) the two libraries' heuristics pick
# different kernels at some row counts: at 64 rows `down` 31.3 µs through cuBLASLt (one 48x64-tile kernel) against
# 36.4 through cuBLAS (split-K plus a reduction), `gate_up` 60.7 against 62.6; at 17 rows `down` 34.1 against 32.3.
# Batch-64 decode with cuBLASLt everywhere: 10,134 tok/s against 9,880. So each graph bucket's row count is timed.
LT_MARGIN = 0.02  # cuBLASLt is taken where it is this much faster than cuBLAS (a tie keeps the default: no switch)


def through_blas(library: str):
    """fn(x, weight, bias): F.linear with torch's preferred BLAS library set to `library` ("cublas", "cublaslt")
    for the call and restored after. Captured in a CUDA graph, the call replays that library's kernel."""

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        before = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library(library)
        try:
            return F.linear(x, weight, bias)
        finally:
            torch.backends.cuda.preferred_blas_library(before)

    return linear


def choose_library(seconds: dict[str, float]) -> str:
    """The library a row count takes: cuBLASLt where it beats cuBLAS by LT_MARGIN, else cuBLAS (`seconds`:
    {"cublas": s, "cublaslt": s})."""
    return "cublaslt" if seconds["cublaslt"] < seconds["cublas"] * (1 - LT_MARGIN) else "cublas"


def skinny_enabled() -> bool:
    """The graphs' buckets of few rows take ops/skinny_matmul.py's Triton matmul wherever it can run, unless
    `MINIPIC_SKINNY_MATMUL=0` (on by default since stop 61: the cached 8 x 2,048 prompt's step measured faster with it
    on an H200 and an H100, and the engine's decode no slower; `bench/results/ttft_spans-5a1675b-*`)."""
    return os.environ.get("MINIPIC_SKINNY_MATMUL", "1") != "0"


def route_many_row_linears(
    model: nn.Module, rows: list[int], timer=None, cublaslt=None, skinny=None
) -> dict[tuple, dict]:
    """Time, per shape group of `model`'s RoutedLinears (CUDA, weights loaded) and per row count of `rows` (the
    CUDA graphs' buckets; one row is `route_one_row_linears`'s), F.linear through torch's default library (cuBLAS)
    and `cublaslt` (default: `through_blas("cublaslt")`), and route that row count to cuBLASLt where
    `choose_library` says so; where cuBLASLt fails (a torch built without it) the default stays, with a warning.
    `MINIPIC_CUBLASLT=0` keeps the default everywhere. `skinny` (default: ops/skinny_matmul.py's `SkinnyRoute`
    unless `MINIPIC_SKINNY_MATMUL=0`) is timed too where `skinny.supports(rows, weight)`, and taken there whatever
    the timings: alone it ran 1.02x cuBLAS on the H200, and what it gains in a step (no split-K reduction kernels, a
    launch while the kernel before drains) only the step shows; a failure leaves the library's route, with a
    warning. `timer(fn, group, x)` -> seconds (default: CUDA-graph replays). Returns {(in, out, bias): {rows:
    {"cublas": s, "cublaslt": s, ["skinny": s,] "chosen": name}}} (empty when every route is off)."""
    if skinny is None and skinny_enabled():
        from ops.skinny_matmul import SkinnyRoute

        skinny = SkinnyRoute()
    use_lt = os.environ.get("MINIPIC_CUBLASLT", "1") != "0"
    if not use_lt and skinny is None:
        return {}
    timer, cublaslt = timer or _seconds, cublaslt or through_blas("cublaslt")
    linears = [m for m in model.modules() if isinstance(m, RoutedLinear)]
    timings = defaultdict(dict)
    with torch.inference_mode():
        for key, group in group_by_shape(linears).items():
            w = group[0].weight
            for n in sorted(set(rows) - {1}):
                x = torch.randn(n, w.shape[1], device=w.device, dtype=w.dtype)
                seconds = {"cublas": timer(F.linear, group, x), "cublaslt": float("inf")}
                if use_lt:
                    try:
                        seconds["cublaslt"] = timer(cublaslt, group, x)
                    except Exception as e:  # noqa: BLE001 (a torch built without cuBLASLt: the default still works)
                        logger.warning("cuBLASLt left out for %s at %d rows: %s: %s", key, n, type(e).__name__, e)
                chosen = choose_library(seconds)
                if skinny is not None and skinny.supports(n, w):
                    try:
                        seconds["skinny"] = timer(skinny, group, x)
                        chosen = "skinny"
                    except Exception as e:  # noqa: BLE001 (an experiment: the libraries still work)
                        logger.warning("skinny matmul left out for %s at %d rows: %s: %s", key, n, type(e).__name__, e)
                route = {"cublaslt": cublaslt, "skinny": skinny}.get(chosen)
                if route is not None:
                    for m in group:
                        m.by_rows[n] = route
                timings[key][n] = seconds | {"chosen": chosen}
    return dict(timings)
