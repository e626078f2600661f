"""Scheduler host time per step on the RAG workload, without a model: `Scheduler.schedule()` and the postprocess.

On a GPU the scheduler runs on the host between two steps, not overlapped with them, so its time is added to
every step. This replays bench/rag.py's workload (64 samples: a system prompt, 10 SSEP passages of 100-300
tokens with reuse 0.5, a question, 32 new tokens) through the scheduler as the engine drives it: schedule,
advance each scheduled request (token 7 sampled wherever a chunk ends a sequence, once per burst step), finish
a request at 32 new tokens. Nothing is computed, so only the host's bookkeeping is timed.

The samples are bench/rag.py's dataset (bench/data/rag-64-reuse0.5, written by `rag.py --build-only`; `--data`
names another copy). Without one, token ids are synthesized in the same shape (`--synthetic`): a pool of
passages of 100-300 random ids, each sample 10 of them (half seen in earlier samples when it can), 4 system
prompts of 96 ids, a question of 20 ids.

    python bench/sched_replay.py                               # roomy (8,000 blocks) and tight caches, 3 policies
    python bench/sched_replay.py --num-blocks 8000 --policies isps --repeats 5
    python bench/sched_replay.py --data bench/data/rag-64-reuse0.9 --num-blocks 267 --max-num-seqs 4 \
        --budget 4096 --repeats 1                             # the offload bench's device cache (rag.py --offload)

`--cost-model` also prices every step with the H200's step times (Llama-3-8B shape, bf16): a step that only
decodes takes DECODE_S, plus DECODE_SEQ_S a sequence and KV_READ_S a token of their contexts (its burst's steps
each); a step with prefill tokens the larger of that and its tokens at PREFILL_TOK_S (a GPU step reads every weight
once however few tokens it holds, and turns compute-bound past a few hundred). A step that a CUDA graph's bucket
holds (the engine's buckets for these limits) computes the bucket's tokens, padding included; one that none holds
runs eagerly and takes EAGER_STEP_S at least (the host dispatching 32 layers). It prints the samples/s and the
TTFT p50 / p99 (all samples arrive at once) the schedules would give. Against the H200's RAG table at c0b23ad
(rag-c0b23ad-cuda.md), samples/s at reuse 0.5: isps capped at 256 ahead 27.1 modeled against 24.4 measured, isps
31.2 against 27.8, inline 31.0 against 28.6, barrier 30.5 against 28.6 (6-12% high: the host's time per step is
left out); the cap's loss against the whole budget, 0.87x modeled, 0.88x measured. Without EAGER_STEP_S the model
had the cap 8% ahead (290089e): its many small eager steps were priced as graphs.
`--span-ahead-tokens` sets isps's cap (see scheduler.py).

Prints a table; `--json PATH` also writes the figures. `decisions` is a digest of every step's decisions
(scheduled requests, query ranges, kv_len, sampling, preemptions, block tables): equal digests, equal schedules.
`computed` counts the tokens every scheduled chunk computes (prompt tokens of finals and span prefills, a decode
token per scheduled decode, once per burst), `prompt computed` those at prompt positions: on a cache too small
to hold what the prompts share, a policy that evicts what it will hit again computes more of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import time
from pathlib import Path

from rag import (  # beside this file
    CONTROL,
    DATA,
    NEW_TOKENS,
    NUM_PASSAGES,
    PASSAGE_TOKENS,
    SYSTEM_TOKENS,
    compose,
    sample_rows,
)

import minipic_lite as mp
from minipic_lite.chunks import SchedulerOutput
from minipic_lite.config import (
    CUDA_GRAPH_BATCH_SIZES,
    CUDA_GRAPH_MAX_TOKENS_PER_SEQ,
    CUDA_GRAPH_TOKEN_SIZES,
    SchedulerConfig,
)
from minipic_lite.cuda_graphs import graph_shapes, pick_shape
from minipic_lite.hashing import root_hash
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.request import Request
from minipic_lite.scheduler import Scheduler
from minipic_lite.spans import SpanHashMemo

BLOCK_SIZE, MAX_NUM_SEQS, TOKEN_BUDGET, BURST = 16, 32, 8192, 8  # bench/rag.py's H200 run; CUDA's default burst
# the H200's step times (next33d-de9b6e7: decode b1 4.46 ms, b64 over ~576 keys 7.0 ms; rag-d3699f1: prefill at
# 43,139 tok/s; a key of context costs its K and V of 32 layers, 131 KB, at ~4 TB/s; rag-c0b23ad: capped isps's
# ~25 small eager steps took ~17 ms more each than the model's 7.5 ms a step)
DECODE_S, DECODE_SEQ_S, KV_READ_S, PREFILL_TOK_S, EAGER_STEP_S = 4.4e-3, 0.022e-3, 33e-9, 1 / 43_000, 24e-3


def step_seconds(out: SchedulerOutput, shapes: list[tuple[int, int]]) -> float:
    """The cost model's seconds for a step (its burst's steps together). A step that one of `shapes` (the engine's
    CUDA-graph buckets) holds computes the bucket's tokens, padding included; one that none holds runs eagerly and
    takes EAGER_STEP_S at least."""
    num_tokens, num_seqs = out.num_batched_tokens, len(out.scheduled)
    shape = pick_shape(shapes, num_seqs, num_tokens)
    eager_s = EAGER_STEP_S if shape is None else 0.0
    num_tokens = num_tokens if shape is None else shape[1]
    context = sum(s.kv_len for s in out.scheduled if s.num_query_tokens == 1)
    floor = DECODE_S + DECODE_SEQ_S * num_seqs + KV_READ_S * context  # every weight read once, and the decodes' keys
    if all(s.num_query_tokens == 1 for s in out.scheduled):
        return out.num_steps * max(floor, eager_s)
    return max(floor, num_tokens * PREFILL_TOK_S, eager_s)


ROOT = root_hash("bench.sched_replay")


def synthesize(num_samples: int, reuse: float, seed: int = 0) -> list[dict]:
    """bench/rag.py's build_dataset with random token ids in place of the essays and system prompts."""
    rng = random.Random(seed)
    pool = [
        [rng.randrange(6, 49000) for _ in range(rng.randint(*PASSAGE_TOKENS))]
        for _ in range(NUM_PASSAGES * num_samples)
    ]
    systems = [[rng.randrange(6, 49000) for _ in range(SYSTEM_TOKENS)] for _ in range(4)]
    return sample_rows(pool, systems, num_samples, reuse, rng, lambda i: [rng.randrange(6, 49000) for _ in range(20)])


def load_samples(args) -> tuple[list[dict], str]:
    path = Path(args.data) if args.data else DATA / f"rag-{args.samples}-reuse{args.reuse}"
    if args.synthetic or not path.exists():
        return synthesize(args.samples, args.reuse), "synthetic"
    import datasets

    return list(datasets.load_from_disk(str(path))), str(path)


def make_requests(samples: list[dict], recipe: str = "block_attention") -> list[Request]:
    composer = mp.PromptComposer(None, CONTROL, BLOCK_SIZE, chat=False)
    params = mp.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    prompts, memo = [compose(composer, s, recipe) for s in samples], SpanHashMemo()  # as the engine
    return [Request(str(i), list(p.token_ids), params, BLOCK_SIZE, ROOT, p.layout, hash_memo=memo)
            for i, p in enumerate(prompts)]  # fmt: skip


def digest_step(h, out: SchedulerOutput) -> None:
    for s in out.scheduled:
        h.update(repr((s.seq.request_id, s.seq.is_span_prefill, s.query_ranges, s.kv_len, s.do_sample,
                       s.seq.block_table)).encode())  # fmt: skip
    h.update(repr(([r.request_id for r in out.preempted], out.num_steps)).encode())


def count_computed(counts: dict, out: SchedulerOutput) -> None:
    """Add the step's computed tokens, and those of them at prompt positions, to `counts`."""
    for s in out.scheduled:
        counts["computed"] += s.num_query_tokens
        num_prompt_tokens = s.seq.num_prompt_tokens
        counts["prompt_computed"] += sum(max(0, min(end, num_prompt_tokens) - start) for start, end in s.query_ranges)


def replay(samples: list[dict], policy: str, num_blocks: int, max_num_seqs: int = MAX_NUM_SEQS,
           budget: int = TOKEN_BUDGET, max_steps: int = 100_000,
           span_ahead_tokens: int | None = None, recipe: str = "block_attention") -> dict:  # fmt: skip
    """Every sample through the scheduler; host seconds of each step's schedule() and postprocess(), and the cost
    model's seconds of each step and each request's first token."""
    ahead = {} if span_ahead_tokens is None else {"span_ahead_tokens": span_ahead_tokens}
    config = SchedulerConfig(max_num_seqs, budget, 65536, num_scheduler_steps=BURST, span_policy=policy, **ahead)
    sched = Scheduler(config, KVCacheManager(num_blocks))
    token_sizes = tuple(t for t in CUDA_GRAPH_TOKEN_SIZES if t <= budget)  # as ModelRunner picks them
    shapes = graph_shapes(CUDA_GRAPH_BATCH_SIZES, max_num_seqs, token_sizes, CUDA_GRAPH_MAX_TOKENS_PER_SEQ)
    for req in make_requests(samples, recipe):
        sched.add(req)

    def stops(req: Request) -> bool:
        if req.num_output_tokens >= NEW_TOKENS:
            sched.finish(req, "length")
        return req.is_finished

    schedule_s, post_s, h, num_preempted = [], [], hashlib.sha256(), 0
    counts = {"computed": 0, "prompt_computed": 0}
    modeled_s, first_token_s = 0.0, {}
    for _ in range(max_steps):
        if not sched.has_unfinished:
            break
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        digest_step(h, out)
        count_computed(counts, out)
        modeled_s += step_seconds(out, shapes)
        for s in out.scheduled:
            if s.do_sample:
                first_token_s.setdefault(s.seq.request_id, modeled_s)
        sampled = [[7] * out.num_steps if s.do_sample else [] for s in out.scheduled]
        t2 = time.perf_counter()
        sched.postprocess(out, sampled, stops)
        t3 = time.perf_counter()
        schedule_s.append(t1 - t0)
        post_s.append(t3 - t2)
        num_preempted += len(out.preempted)
    else:
        raise RuntimeError(f"{policy}: not finished after {max_steps} steps")
    sched.kv.check_integrity()
    return {"schedule_s": schedule_s, "post_s": post_s, "preemptions": num_preempted, "decisions": h.hexdigest()[:16],
            "modeled_s": modeled_s, **modeled_ttft(first_token_s), **counts}  # fmt: skip


def modeled_ttft(first_token_s: dict[str, float]) -> dict[str, float]:
    """The TTFT p50 and p99 of the requests' first tokens (modeled seconds; all requests arrive at 0)."""
    ttft = sorted(first_token_s.values())
    return {"modeled_ttft_p50_s": statistics.median(ttft), "modeled_ttft_p99_s": percentile(ttft, 0.99)}


def percentile(sorted_values: list[float], q: float) -> float:
    """The `q` quantile of `sorted_values`: the value at rank q * (n - 1), rounded down."""
    return sorted_values[int(q * (len(sorted_values) - 1))]


def summarize(runs: list[dict]) -> dict:
    """Figures of the fastest repeat (by total), in ms."""
    best = min(runs, key=lambda r: sum(r["schedule_s"]) + sum(r["post_s"]))
    per_step = sorted(a + b for a, b in zip(best["schedule_s"], best["post_s"], strict=True))
    sched_sorted = sorted(best["schedule_s"])
    assert len({r["decisions"] for r in runs}) == 1, "repeats scheduled differently"
    return {
        "steps": len(per_step),
        "preemptions": best["preemptions"],
        "schedule_median_ms": 1e3 * statistics.median(sched_sorted),
        "schedule_p90_ms": 1e3 * percentile(sched_sorted, 0.9),
        "schedule_total_ms": 1e3 * sum(sched_sorted),
        "step_median_ms": 1e3 * statistics.median(per_step),
        "step_p90_ms": 1e3 * percentile(per_step, 0.9),
        "step_total_ms": 1e3 * sum(per_step),
        "decisions": best["decisions"],
        "computed": best["computed"],
        "prompt_computed": best["prompt_computed"],
        "modeled_s": best["modeled_s"],
        "modeled_ttft_p50_s": best["modeled_ttft_p50_s"],
        "modeled_ttft_p99_s": best["modeled_ttft_p99_s"],
    }


def table_row(num_blocks: int, name: str, r: dict, num_samples: int | None) -> str:
    """A row of the printed table: `r` is summarize's; with `num_samples` (--cost-model) the modeled columns."""
    modeled = (f" {num_samples / r['modeled_s']:.2f} | {1e3 * r['modeled_ttft_p50_s']:.0f} / "
               f"{1e3 * r['modeled_ttft_p99_s']:.0f} |") if num_samples is not None else ""  # fmt: skip
    return (f"| {num_blocks} | {name} | {r['steps']} | {r['preemptions']} | {r['computed']:,} | "
            f"{r['prompt_computed']:,} | {r['schedule_median_ms']:.3f} / "
            f"{r['schedule_p90_ms']:.3f} / {r['schedule_total_ms']:.0f} | {r['step_median_ms']:.3f} / "
            f"{r['step_p90_ms']:.3f} / {r['step_total_ms']:.0f} | {r['decisions']} |{modeled}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--reuse", type=float, default=0.5)
    parser.add_argument("--data", default=None, help="a dataset written by bench/rag.py (default: bench/data/...)")
    parser.add_argument("--synthetic", action="store_true", help="random token ids of the same shape")
    parser.add_argument(
        "--num-blocks", default="8000,1100,200", help="device caches: roomy, a quarter of the working set, one request"
    )
    parser.add_argument("--max-num-seqs", type=int, default=MAX_NUM_SEQS)
    parser.add_argument("--budget", type=int, default=TOKEN_BUDGET, help="max_num_batched_tokens")
    parser.add_argument("--policies", default="inline,isps,barrier", help="span policies; `vanilla`: the prompts "
                        "without markers (bench/rag.py's prefix recipe), inline")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cost-model", action="store_true", help="price the steps with the H200's step times")
    parser.add_argument("--span-ahead-tokens", default=None, help="isps's caps to replay, comma-separated (default: "
                        "the config's)")  # fmt: skip
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    samples, source = load_samples(args)
    print(f"{len(samples)} samples from {source}; block size {BLOCK_SIZE}, max_num_seqs {args.max_num_seqs}, "
          f"budget {args.budget}, burst {BURST}", flush=True)  # fmt: skip
    results = []
    model = " modeled samples/s | modeled TTFT p50 / p99 ms |" if args.cost_model else ""
    print(f"| blocks | policy | steps | preempt | computed | prompt computed | schedule() median / p90 / total ms | "
          f"+ postprocess median / p90 / total ms | decisions |{model}\n|---|---|---|---|---|---|---|---|---|"
          + "---|---|" * args.cost_model)  # fmt: skip
    caps = [None] if args.span_ahead_tokens is None else [int(c) for c in args.span_ahead_tokens.split(",")]
    for num_blocks in map(int, args.num_blocks.split(",")):
        for policy, cap in [(p, c) for p in args.policies.split(",") for c in (caps if p == "isps" else [None])]:
            recipe, span_policy = ("prefix", "inline") if policy == "vanilla" else ("block_attention", policy)
            runs = [replay(samples, span_policy, num_blocks, args.max_num_seqs, args.budget, span_ahead_tokens=cap,
                           recipe=recipe) for _ in range(args.repeats)]  # fmt: skip
            r = summarize(runs)
            name = policy if cap is None else f"{policy} (ahead {cap})"
            results.append({"num_blocks": num_blocks, "max_num_seqs": args.max_num_seqs, "budget": args.budget,
                            "policy": policy, "span_ahead_tokens": cap, **r})  # fmt: skip
            print(table_row(num_blocks, name, r, len(samples) if args.cost_model else None), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"source": source, "results": results}, indent=1))


if __name__ == "__main__":
    main()
