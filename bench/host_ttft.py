"""Host time in the TTFT of a cached span prompt (issue 10): what the engine does outside the model's forward.

A tiny random Llama on the CPU (its forward is cheap, so what is left is host work) serves the H200 grid's
heaviest cached row: a block_attention prompt of `--docs` documents of `--doc-tokens` tokens, each cached
before as an SSEP span on its own, then [PDEP question] with a new question every run (so, as on the GPU, the
question's block is computed and everything else hits: 8 x 2048 gives 16,561 tokens, 17 computed).
`--shuffle` puts the documents in another order every run (the same spans after other prefixes).

The engine is driven directly (no loop thread), one request at a time, and its methods are timed where they
are called, so the sections are the engine's own code:

    validate       make_request's checks and span layout (arrival_time is set as it starts: in the TTFT)
    request        the rest of make_request: the ids' copy (a composed prompt packed them as it was made), the
                   Request record and its block hashes
    schedule       lookup and admission, the chunk plan, publishing (Scheduler.schedule)
    report         the cache report's admission snapshot and the prompt's copy for the first output
                   (LLMEngine._report_admissions, _copy_prompts; after the launch, so on CUDA the device computes
                   meanwhile and `forward`'s wait is that much shorter)
    prepare        the step's host metadata and its tensors (ModelRunner.prepare)
    forward        the model and the sampler (ModelRunner.launch and wait, less prepare)
    post           postprocess, stop checks, the output (the rest of LLMEngine.step)
    host           ttft - forward: everything the TTFT holds besides the forward
    gc             Python's garbage collector in the run, whichever section it interrupted

Each figure is the median over `--runs` runs (and the minimum: the machine may be shared). Results go to
bench/results/host_ttft-<sha>-cpu[-shuffle].json (`--out` names another folder).

    PYTHONPATH=. python bench/host_ttft.py                   # 8 x 2048, 30 runs
    PYTHONPATH=. python bench/host_ttft.py --shuffle         # the documents in another order every run
    PYTHONPATH=. python bench/host_ttft.py --profile         # and a cProfile of the runs (top functions)
    python bench/host_ttft.py --device cuda --llama3-8b-shape  # the H200: forward = the GPU's share too

On CUDA `forward` holds the device time (the sampled token is read back), so `host` is still the rest.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import json
import os
import pstats
import random
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from provenance import git_is_dirty, git_sha  # bench/provenance.py, beside this file

import minipic_lite as mp
from minipic_lite.config import EngineConfig, ModelConfig
from minipic_lite.engine import LLMEngine
from minipic_lite.prompts import Piece, Prompt, PromptComposer
from minipic_lite.spans import SegmentKind

CONTROL = mp.ControlTokens(ssep_id=3, pdep_id=4, pad_id=5)
TINY_LLAMA = {"model_type": "llama", "vocab_size": 50000, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 65536,
              "tie_word_embeddings": True}  # fmt: skip
ONE_TOKEN = mp.SamplingParams(max_tokens=1, temperature=0.0)
SECTIONS = ("validate", "request", "schedule", "report", "prepare", "forward", "post", "host", "gc", "ttft")


def build_engine(max_model_len: int, device: str = "cpu", shape: dict = TINY_LLAMA, block_size: int = 16) -> LLMEngine:
    model_dir = Path(tempfile.mkdtemp()) / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(shape))
    options = {"load_format": "dummy", "max_model_len": max_model_len, "max_num_batched_tokens": max_model_len,
               "block_size": block_size}  # fmt: skip
    dtype = "float32" if device == "cpu" else "bfloat16"
    config = EngineConfig.from_options(model_dir, ModelConfig.from_dir(model_dir), device, CONTROL, dtype, **options)
    return LLMEngine(config, None)


class Timer:
    """Wraps engine methods in place; `times[name]` collects seconds per call of the current run, and "gc" the
    garbage collector's."""

    def __init__(self):
        self.times: dict[str, float] = defaultdict(float)
        self.gc_start = 0.0
        gc.callbacks.append(self.on_gc)

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.gc_start = time.perf_counter()
        else:
            self.times["gc"] += time.perf_counter() - self.gc_start

    def wrap(self, obj, name: str, section: str) -> None:
        fn = getattr(obj, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.times[section] += time.perf_counter() - start

        setattr(obj, name, timed)


def run_once(engine: LLMEngine, timer: Timer, prompt: Prompt) -> dict[str, float]:
    timer.times.clear()
    start = time.perf_counter()
    req = engine.make_request(prompt, ONE_TOKEN, require_spans=True)  # NOTE: as generate() passes a composed prompt
    timer.times["make_request"] = time.perf_counter() - start
    engine.add(req)
    step_times = []
    while req.first_token_time is None:
        step_start = time.perf_counter()
        engine.step()
        step_times.append(time.perf_counter() - step_start)
    return split_sections(dict(timer.times), step_times, req)


def split_sections(t: dict, step_times: list[float], req) -> dict[str, float]:
    """The run's sections (SECTIONS) from the timed methods' seconds `t` (make_request and the validate within it,
    schedule, report, prepare and execute: launch and wait, which holds prepare), each step's seconds and the
    request's times."""
    t.setdefault("gc", 0.0)
    t["request"] = t.pop("make_request") - t["validate"]
    t["ttft"] = req.first_token_time - req.arrival_time
    t["forward"] = t.pop("execute") - t["prepare"]
    t["post"] = sum(step_times) - t["schedule"] - t["report"] - t["prepare"] - t["forward"]
    t["host"] = t["ttft"] - t["forward"]
    return t


def summarize(rows: list[dict]) -> tuple[dict, dict]:
    """Each section's median and minimum over the runs."""
    medians = {name: statistics.median(r[name] for r in rows) for name in SECTIONS}
    return medians, {name: min(r[name] for r in rows) for name in SECTIONS}


def prompts(composer: PromptComposer, num_docs: int, doc_tokens: int, num_runs: int, shuffle: bool = False):
    g, rng = torch.Generator().manual_seed(0), random.Random(0)
    docs = [tuple(torch.randint(100, 40000, (doc_tokens,), generator=g).tolist()) for _ in range(num_docs)]
    system = Piece(tuple(range(100, 132)), label="system")
    spans = [composer.compose([Piece(d, SegmentKind.SSEP)], "block_attention", pad_end=True) for d in docs]
    spans.append(composer.compose([system, Piece(tuple(range(200, 216)), SegmentKind.PDEP)], "block_attention"))
    finals = []
    for run in range(num_runs):
        question = Piece(tuple(range(1000 + 16 * run, 1016 + 16 * run)), SegmentKind.PDEP, "question")
        order = rng.sample(docs, len(docs)) if shuffle else docs
        pieces = [system, *(Piece(d, SegmentKind.SSEP) for d in order), question]
        finals.append(composer.compose(pieces, "block_attention"))
    return spans, finals


def prefill(engine: LLMEngine, prompts) -> None:
    for prompt in prompts:
        engine.add(engine.make_request(prompt, ONE_TOKEN, require_spans=True))
    while engine.has_unfinished():
        engine.step()


def save(args, medians: dict, minima: dict, num_tokens: int, num_computed: float) -> None:
    sha = git_sha()
    result = {
        "bench": "host_ttft",
        "git_sha": sha,
        "git_dirty": git_is_dirty(),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "model": "llama3-8b-shape (random bf16)" if args.llama3_8b_shape else "tiny llama (random fp32)",
        "docs": args.docs,
        "doc_tokens": args.doc_tokens,
        "shuffle": args.shuffle,
        "threads": args.threads,
        "block_size": args.block_size,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "fresh": args.fresh,
        "runs": args.runs,
        "num_tokens": num_tokens,
        "num_computed_tokens": num_computed,
        "load_average": os.getloadavg(),
        "median_s": medians,
        "min_s": minima,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    passive = os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive"
    flags = (("shuffle", args.shuffle), ("fresh", args.fresh), (f"t{args.threads}", args.threads != 1))
    flags += (("omp-passive", passive), (f"b{args.block_size}", args.block_size != 16))
    tags = "".join(f"-{tag}" for tag, on in flags if on)
    path = args.out / f"host_ttft-{sha}-{args.device}{tags}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--shuffle", action="store_true", help="the documents in another order every run")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the measured runs")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--llama3-8b-shape", action="store_true", help="random bf16 weights of bench/rag.py's shape")
    parser.add_argument("--block-size", type=int, default=16, help="KV block size (the per-block host work scales "
                        "with the prompt's number of blocks)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (ttft_spans keeps torch's)")
    parser.add_argument("--fresh", action="store_true", help="before each run, reset the cache and prefill the "
                        "documents again (as ttft_spans does): a first prompt on fresh blocks")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="the results' folder")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from rag import LLAMA3_8B  # bench/rag.py, beside this file

    shape = LLAMA3_8B if args.llama3_8b_shape else TINY_LLAMA
    max_model_len = args.docs * (args.doc_tokens + 2 * args.block_size) + 256  # NOTE: each span padded to blocks
    engine = build_engine(max_model_len, args.device, shape, args.block_size)
    composer = PromptComposer(None, CONTROL, engine.config.cache.block_size, chat=False)
    num_profiled = 10 if args.profile else 0
    spans, finals = prompts(composer, args.docs, args.doc_tokens, 3 + args.runs + num_profiled, args.shuffle)
    prefill(engine, spans)  # the documents cached as spans, and the system turn
    timer = Timer()
    timer.wrap(engine, "_check", "validate")
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(engine, "_report_admissions", "report")
    timer.wrap(engine, "_copy_prompts", "report")
    timer.wrap(engine.runner, "prepare", "prepare")
    for name in ("launch", "wait"):  # NOTE: queue the step, read its tokens: together what execute does
        timer.wrap(engine.runner, name, "execute")
    for prompt in finals[:3]:  # warm-up
        run_once(engine, timer, prompt)
    rows, computed = [], 0
    for prompt in finals[3 : 3 + args.runs]:
        if args.fresh:
            engine.kv.reset_prefix_cache()
            prefill(engine, spans)
        num_computed_before = engine.stats.num_computed_tokens
        rows.append(run_once(engine, timer, prompt))
        computed += engine.stats.num_computed_tokens - num_computed_before
    n = len(finals[-1])
    print(f"{args.docs} x {args.doc_tokens} cached: prompts of {n} tokens, {computed / len(rows):.0f} computed each;")
    print(f"median of {len(rows)} runs (ms):")
    medians, minima = summarize(rows)
    for name in SECTIONS:
        print(f"  {name:<9} {1e3 * medians[name]:8.3f}   (min {1e3 * minima[name]:.3f})")
    save(args, medians, minima, n, computed / len(rows))
    if args.profile:  # more runs under cProfile, after the measured ones (its overhead is not in the figures)
        profiler = cProfile.Profile()
        for prompt in finals[3 + args.runs :]:
            profiler.enable()
            run_once(engine, timer, prompt)
            profiler.disable()
        s = io.StringIO()
        stats = pstats.Stats(profiler, stream=s)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_callees(r"\((step|prepare|execute|stage|run|postprocess)\)")
        print(s.getvalue())


if __name__ == "__main__":
    main()
