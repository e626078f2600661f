"""The short read inside the engine against the same read in the op bench (issue 10's cached TTFT, issue 13).

Inside the engine the attention kernel of a cached 8 x 2048 prompt (17 new tokens over 16.5k keys) took 71-82 us a
layer under the profiler, where bench/gpu_read_profile.py reads the same shape in 56 us. This script takes the
engine's own arguments and times the kernel on them alone, so the difference is either in the arguments (the CUDA
graph's padded bucket: a padding sequence, 32 query tokens, block tables max_model_len wide) or in what runs around
the kernel inside a step:

    engine_graph    the kernel's device time per layer inside the engine's replayed step (torch profiler)
    engine_eager    the same step run eagerly (no graph; the request's own block table width)
    bucket          the graph's arguments (its static buffers after the step), the kernel alone
    bucket_real     the same, the real sequence only (no padding sequence), tables as wide
    eager_args      the eager step's arguments (layer 0), the kernel alone
    op_bench        bench/gpu_short_prefill.py's problem (1 x 17 over 16,384 keys), the kernel alone
    next_question / first_after_prefill(_idle_1s)
                    whole TTFTs under the profiler: a new question after the same cached documents (host_ttft's
                    case), the first prompt after the documents were prefilled (ttft_spans' case), and the same
                    after a second of idle GPU: attention per layer, busy time, TTFT, forward, host

Alone: CUDA-graph replays of one call (bench/gpu_ops.py's Clock), each checked against the torch path.

    python bench/gpu_engine_read.py --out DIR      # DIR/engine_read_<sha>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_ops import Clock  # noqa: E402
from gpu_short_prefill import problem  # noqa: E402
from host_ttft import CONTROL, TINY_LLAMA, Timer, build_engine, prefill, prompts, run_once  # noqa: E402
from provenance import git_sha  # noqa: E402
from rag import LLAMA3_8B  # noqa: E402

from minipic_lite.models import llama  # noqa: E402
from minipic_lite.prompts import PromptComposer  # noqa: E402
from ops import triton_kernel  # noqa: E402
from ops.torch_impl import rope_paged_attention_torch  # noqa: E402

KERNEL = "_rope_paged_attention_kernel"


def device_profile(fn) -> dict:
    """While `fn` runs: the attention kernel's device time per call (us), the device's busy time (the union of
    its kernels' intervals, ms) and `fn`'s return value."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():  # --smoke on the CPU: no device kernels to read
        return dict(attention_us=[float("nan")], busy_ms=float("nan"), value=fn())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        value = fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    busy, end = 0.0, float("-inf")
    for start, stop in sorted((e.time_range.start, e.time_range.end) for e in kernels):
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    attention = [e.time_range.elapsed_us() for e in kernels if KERNEL in e.name]
    return dict(attention_us=attention, busy_ms=busy / 1e3, value=value)


def attention_kernel_us(fn) -> list[float]:
    """Device time (us) of every call of the attention kernel while `fn` runs."""
    return device_profile(fn)["attention_us"]


def scenario(engine, timer: Timer, token_ids, before=None) -> dict:
    """One TTFT under the profiler (after `before()`, outside it): the attention kernel, busy time, host sections."""
    if before is not None:
        before()
    prof = device_profile(lambda: run_once(engine, timer, token_ids))
    times = {k: 1e3 * v for k, v in prof["value"].items()}
    return dict(
        attention_median_us=statistics.median(prof["attention_us"]),
        attention_us=prof["attention_us"],
        busy_ms=prof["busy_ms"],
        ttft_ms=times["ttft"],
        forward_ms=times["forward"],
        host_ms=times["host"],
    )


def capture_layer0_args(engine, timer: Timer, token_ids) -> list:
    """The op's arguments of layer 0 in an eager run of `token_ids` (CUDA graphs switched off for it)."""
    captured, original = [], llama.paged_attention

    def recording(q, meta, k_cache, v_cache, cos_sin, scale):
        if not captured:
            captured.append([q.clone(), k_cache, v_cache, meta.block_tables.clone(), meta.cu_seqlens_q.clone(),
                             meta.positions.clone(), meta.kv_lens.clone(), meta.visible_start.clone(), cos_sin,
                             scale])  # fmt: skip
        return original(q, meta, k_cache, v_cache, cos_sin, scale)

    graphs, engine.runner.graphs = engine.runner.graphs, None
    llama.paged_attention = recording
    try:
        run_once(engine, timer, token_ids)
    finally:
        llama.paged_attention, engine.runner.graphs = original, graphs
    return captured[0]


def bucket_args(engine, eager: list, shape: tuple[int, int]) -> list:
    """The op's arguments as the replayed graph of `shape` passes them (its static buffers after the step)."""
    g = engine.runner.graphs
    seqs, tokens = shape
    q = torch.zeros(tokens, *eager[0].shape[1:], dtype=eager[0].dtype, device=eager[0].device)
    q[: eager[0].shape[0]] = eager[0]
    return [q, eager[1], eager[2], g.block_tables[:seqs].clone(), g.cu_seqlens_q[: seqs + 1].clone(),
            g.positions[:tokens].clone(), g.kv_lens[:seqs].clone(), g.visible_start[:tokens].clone(), eager[8],
            eager[9]]  # fmt: skip


def real_only(args: list, num_tokens: int) -> list:
    """The first sequence of `args` alone (its first `num_tokens` query tokens), tables as wide."""
    q, k, v, tables, cu, pos, lens, vis, cs, scale = args
    cu1 = torch.tensor([0, num_tokens], dtype=cu.dtype, device=cu.device)
    return [q[:num_tokens], k, v, tables[:1], cu1, pos[:num_tokens], lens[:1], vis[:num_tokens], cs, scale]


def timed(clock: Clock, args: list, real_tokens: int) -> dict:
    out = triton_kernel.rope_paged_attention_triton(*args)
    ref = rope_paged_attention_torch(*args)
    err = (out[:real_tokens].float() - ref[:real_tokens].float()).abs().max().item()
    q, tables = args[0], args[3]
    config = triton_kernel.config_for_args(q, args[1], tables, args[8])
    kernels = attention_kernel_us(lambda: [triton_kernel.rope_paged_attention_triton(*args) for _ in range(20)])
    return dict(ms=clock(lambda: triton_kernel.rope_paged_attention_triton(*args)), max_err=err,
                kernel_us_profiler=statistics.median(kernels), config=config, tokens=q.shape[0],
                seqs=tables.shape[0], table_keys=tables.shape[1] * args[1].shape[1],
                q_strides=list(q.stride()), cos_sin_dtype=str(args[8].dtype))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=2048)
    parser.add_argument("--out", default=".")
    parser.add_argument("--smoke", action="store_true", help="a tiny random Llama on the CPU (TRITON_INTERPRET=1): "
                        "the script's plumbing, no timing that means anything")  # fmt: skip
    args = parser.parse_args()
    device, shape = ("cpu", TINY_LLAMA) if args.smoke else ("cuda", LLAMA3_8B)
    engine = build_engine(args.docs * (args.doc_tokens + 32) + 256, device, shape)
    composer = PromptComposer(None, CONTROL, engine.config.cache.block_size, chat=False)
    spans, finals = prompts(composer, args.docs, args.doc_tokens, 16)
    prefill(engine, spans)
    used = {}
    if engine.runner.graphs is not None:
        original_run = engine.runner.graphs.run
        engine.runner.graphs.run = lambda inputs, shape: used.setdefault("shape", shape) and original_run(inputs, shape)
    timer = Timer()  # run_once reads its sections
    for obj, name, section in (
        (engine.scheduler, "schedule", "schedule"),
        (engine, "_report_admissions", "report"),
        (engine.runner, "prepare", "prepare"),
        (engine.runner, "launch", "execute"),  # NOTE: launch and wait: together what execute does
        (engine.runner, "wait", "execute"),
    ):
        timer.wrap(obj, name, section)
    for prompt in finals[:3]:  # warm-up
        run_once(engine, timer, list(prompt.token_ids))
    result = {"bench": "engine_read", "git_sha": git_sha(), "prompt_tokens": len(finals[3]),
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}  # fmt: skip
    in_graph = attention_kernel_us(lambda: run_once(engine, timer, list(finals[3].token_ids)))
    result["graph_shape"] = used.get("shape")
    result["engine_graph"] = dict(calls=len(in_graph), median_us=statistics.median(in_graph), all_us=in_graph)
    print("engine, replayed graph:", result["graph_shape"], result["engine_graph"]["median_us"], "us", flush=True)
    eager = capture_layer0_args(engine, timer, list(finals[4].token_ids))
    graphs, engine.runner.graphs = engine.runner.graphs, None
    in_eager = attention_kernel_us(lambda: run_once(engine, timer, list(finals[5].token_ids)))
    engine.runner.graphs = graphs
    result["engine_eager"] = dict(calls=len(in_eager), median_us=statistics.median(in_eager), all_us=in_eager)
    print("engine, eager:", result["engine_eager"]["median_us"], "us", flush=True)
    run_once(engine, timer, list(finals[6].token_ids))  # the graph's buffers now hold this step
    real_tokens = eager[0].shape[0]
    cases = {"eager_args": (eager, real_tokens)}
    if engine.runner.graphs is not None:
        bucket = bucket_args(engine, eager, result["graph_shape"])
        cases |= {"bucket": (bucket, real_tokens), "bucket_real": (real_only(bucket, real_tokens), real_tokens),
                  "op_bench": (problem(1, 17, 16384, "cuda"), 17)}  # fmt: skip
    clock = Clock(smoke=args.smoke)
    for name, (case, n) in cases.items():
        result[name] = timed(clock, case, n)
        print(name, {k: v for k, v in result[name].items() if k != "config"}, flush=True)
    # NOTE: ttft_spans times the first prompt after the documents were prefilled; host_ttft a next question
    fresh = lambda: (engine.kv.reset_prefix_cache(), prefill(engine, spans))  # noqa: E731
    idle = lambda: (fresh(), time.sleep(1.0))  # noqa: E731
    runs = {"next_question": None, "first_after_prefill": fresh, "first_after_prefill_idle_1s": idle}
    finals_left = iter(finals[7:])
    for name, before in runs.items():
        rows = [scenario(engine, timer, list(next(finals_left).token_ids), before) for _ in range(3)]
        result[name] = rows
        print(name, [{k: round(v, 2) for k, v in r.items() if k != "attention_us"} for r in rows], flush=True)
    path = Path(args.out) / f"engine_read_{result['git_sha']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print("saved", path)


if __name__ == "__main__":
    main()
