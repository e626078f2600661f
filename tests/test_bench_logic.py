"""The arithmetic behind the bench scripts' reported figures, on hand-made measurements: ratios, percentiles,
bounds, hit rates, medians and the table rows that carry them.

test_bench_smoke.py runs each script and checks that its results hold one field; here each function that turns
measurements into a figure gets numbers whose answer is known, so a flipped operator, a percentile one rank off
or a swapped column fails. The scripts live in bench/ (not a package) and import each other by name, as they do
when run from there.
"""

import importlib
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

BENCH = Path(__file__).parent.parent / "bench"


def bench(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


# -- provenance.py ----------------------------------------------------------------------------------------------


def test_git_sha_takes_the_environment_first(monkeypatch):
    monkeypatch.setenv("GIT_SHA", "abc1234")
    monkeypatch.setenv("PATH", "")  # NOTE: no git to ask: the variable alone answers
    assert bench("provenance").git_sha() == "abc1234"


def test_git_sha_asks_git_from_any_folder(monkeypatch, tmp_path):
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    monkeypatch.setenv("GIT_SHA", "")  # NOTE: empty counts as unset
    monkeypatch.chdir(tmp_path)
    assert bench("provenance").git_sha() == done.stdout.strip()


def test_git_sha_without_git_is_unknown(monkeypatch, tmp_path):
    provenance = bench("provenance")
    monkeypatch.delenv("GIT_SHA", raising=False)
    monkeypatch.setenv("GIT_DIR", str(tmp_path))  # git runs, exits 128: not a repository
    assert provenance.git_sha() == "unknown" and not provenance.git_is_dirty()
    monkeypatch.setenv("PATH", "")  # no git at all: OSError
    assert provenance.git_sha() == "unknown" and not provenance.git_is_dirty()


# -- rag.py -----------------------------------------------------------------------------------------------------

COUNTERS = ("num_computed_tokens", "num_preemptions", "num_host_hit_blocks", "num_rerotated_blocks")


def test_rag_run_figures():
    rag = bench("rag")
    before = dict(zip(COUNTERS, (1000, 1, 2, 3), strict=True))
    # 4 prompts of 200 tokens in all, 4 new tokens each: 3 decode tokens a request past its 80 computed prompt tokens
    after = dict(zip(COUNTERS, (1000 + 80 + 4 * 3, 4, 7, 10), strict=True))
    r = rag.run_figures(2.0, [0.3, 0.1, 0.4, 0.2], [100, 50, 30, 20], 4, before, after)
    assert list(r) == ["samples_per_s", "wall_s", "ttft_p50_s", "ttft_p99_s", "prompt_tokens",
                       "computed_prompt_tokens", "cached_fraction", "preemptions", "host_hit_blocks",
                       "rerotated_blocks"]  # fmt: skip
    assert r["samples_per_s"] == 2.0 and r["wall_s"] == 2.0
    assert r["ttft_p50_s"] == pytest.approx(0.25)
    assert r["ttft_p99_s"] == 0.4  # rank round(0.99 * 3) = 3 of the sorted TTFTs (not the unsorted list's 0.2)
    assert (r["prompt_tokens"], r["computed_prompt_tokens"]) == (200, 80)
    assert r["cached_fraction"] == pytest.approx(0.6)
    assert (r["preemptions"], r["host_hit_blocks"], r["rerotated_blocks"]) == (3, 5, 7)


def test_rag_run_figures_p99_rank_rounds_to_nearest():
    rag = bench("rag")
    counters = dict.fromkeys(COUNTERS, 0)
    ttfts = [float(i) for i in range(12)]  # rank 0.99 * 11 = 10.89: the 12th value, not the 11th
    assert rag.run_figures(1.0, ttfts, [1] * 12, 1, counters, counters)["ttft_p99_s"] == 11.0
    ttfts = [float(i) for i in range(101)]  # rank 99 exactly
    assert rag.run_figures(1.0, ttfts, [1] * 101, 1, counters, counters)["ttft_p99_s"] == 99.0


def test_rag_ceiling():
    rag = bench("rag")
    assert rag.NEW_TOKENS == 32
    prefill = {"computed_prompt_tokens": 1000, "wall_s": 2.0}  # 500 tok/s
    c = rag.ceiling(prefill, first_s=0.5, whole_s=0.81, num_samples=4, barrier_s=4.62)
    assert c["prefill_tok_s"] == 500.0
    assert c["tokens"] == 1000 + 4 * 31
    assert c["decode_step_s"] == pytest.approx(0.31 / 31)
    # the last prompt's decodes after every prefill (2 + 31 x 0.01 s) outlast all tokens at the prefill rate (2.248)
    assert c["floor_s"] == pytest.approx(2.31)
    assert c["barrier_s"] == 4.62 and c["max_gain_over_barrier"] == pytest.approx(2.0)


def test_rag_ceiling_floor_is_the_token_bound_when_decodes_are_free():
    rag = bench("rag")
    prefill = {"computed_prompt_tokens": 1000, "wall_s": 2.0}
    c = rag.ceiling(prefill, first_s=0.5, whole_s=0.4, num_samples=4, barrier_s=4.496)  # a noisy whole run: 0 s
    assert c["decode_step_s"] == 0.0
    assert c["floor_s"] == pytest.approx(1124 / 500)
    assert c["max_gain_over_barrier"] == pytest.approx(2.0)


def test_rag_num_agreeing():
    rag = bench("rag")
    barrier, inline, isps = [[1, 2], [3], [4, 5]], [[1, 2], [3], [4, 6]], [[1, 2], [9], [4, 5]]
    assert rag.num_agreeing([barrier, inline, isps]) == 1
    assert rag.num_agreeing([barrier, barrier]) == 3


def test_rag_sample_rows_reuses_a_share_of_earlier_passages():
    rag = bench("rag")
    pool = [[100 + p] for p in range(40)]
    rows = rag.sample_rows(pool, [[1], [2]], 3, 0.3, random.Random(0), lambda i: [50 + i])
    assert [r["system"] for r in rows] == [[1], [2], [1]]
    assert [r["question"] for r in rows] == [[50], [51], [52]]
    assert sorted(rows[0]["passage_ids"]) == list(range(10))
    for i, r in enumerate(rows):
        assert r["passages"] == [pool[p] for p in r["passage_ids"]] and len(set(r["passage_ids"])) == 10
        earlier = {p for row in rows[:i] for p in row["passage_ids"]}
        fresh = sorted(set(r["passage_ids"]) - earlier)
        assert len(fresh) == (10 if i == 0 else 7)  # round(0.3 * 10) seen before
        assert fresh == list(range(len(earlier), len(earlier) + len(fresh)))  # the pool's next ones, in order


def test_rag_sample_rows_rounds_the_reused_share():
    rag = bench("rag")
    pool = [[p] for p in range(40)]
    rows = rag.sample_rows(pool, [[1]], 2, 0.27, random.Random(0), lambda i: [])
    assert len(set(rows[1]["passage_ids"]) & set(rows[0]["passage_ids"])) == 3  # round(2.7), not int(2.7)


def test_rag_schedule_ceiling_times_one_sample_with_one_and_all_new_tokens(monkeypatch):
    rag = bench("rag")
    walls = {(4, 1): 2.0, (1, 1): 0.5, (1, rag.NEW_TOKENS): 0.81}  # (samples, new tokens) -> wall seconds

    def run_system(llm, samples, recipe, policy, new_tokens=rag.NEW_TOKENS):
        assert (recipe, policy) == ("block_attention", "inline")
        return {"wall_s": walls[len(samples), new_tokens], "computed_prompt_tokens": 250 * len(samples)}

    class Samples(list):
        def select(self, indices):
            return Samples(self[i] for i in indices)

    monkeypatch.setattr(rag, "run_system", run_system)
    c = rag.schedule_ceiling(None, Samples([{}] * 4), {"wall_s": 4.62})
    assert c == rag.ceiling({"wall_s": 2.0, "computed_prompt_tokens": 1000}, 0.5, 0.81, 4, 4.62)
    assert c["decode_step_s"] == pytest.approx(0.01)


def test_rag_num_distinct_blocks_and_offload_sizing():
    rag = bench("rag")
    import minipic_lite as mp

    rng = random.Random(1)
    sample = {"system": [rng.randrange(6, 40000) for _ in range(20)], "question": [7, 8, 9],
              "passages": [[rng.randrange(6, 40000) for _ in range(n)] for n in (40, 50)]}  # fmt: skip
    composer = mp.PromptComposer(None, rag.CONTROL, 16, chat=False)
    num_tokens = len(rag.compose(composer, sample, "block_attention"))
    assert rag.num_distinct_blocks([sample, sample], 16) == -(-num_tokens // 16)  # every block once
    # a second sample that shares nothing: its blocks add up; the device cache is a quarter of the working set
    other = {**sample, "passages": [[t + 1 for t in p] for p in sample["passages"]] * 5}
    samples = [sample, other]
    longest = len(rag.compose(composer, other, "block_attention")) + rag.NEW_TOKENS
    working_set = rag.num_distinct_blocks(samples, 16)
    args = SimpleNamespace(max_model_len=None, num_blocks=None, host_cache_gib=0.0, device="cpu")
    rag.size_offload_cache(args, samples, 16)
    assert args.max_model_len == -(-longest // 16) * 16 and args.max_model_len >= longest
    assert args.num_blocks == args.max_model_len // 16 > working_set // 4  # at least one request's context
    assert args.host_cache_gib == rag.OFFLOAD_HOST_GIB["cpu"]
    big = [sample] + [{**sample, "passages": [[t + k for t in p] for p in sample["passages"]]} for k in range(1, 40)]
    args = SimpleNamespace(max_model_len=None, num_blocks=None, host_cache_gib=0.0, device="cuda:0")
    rag.size_offload_cache(args, big, 16)
    assert args.num_blocks == rag.num_distinct_blocks(big, 16) // 4 > args.max_model_len // 16
    assert args.host_cache_gib == rag.OFFLOAD_HOST_GIB["cuda"]


KINDS = {"decode": {"steps": 64, "ms": 410.2}, "graph_prefill": {"steps": 0, "ms": 0.0},
         "eager": {"steps": 8, "ms": 1520.4}}  # fmt: skip


def rag_row(samples_per_s: float) -> dict:
    return {"samples_per_s": samples_per_s, "ttft_p50_s": 0.1234, "ttft_p99_s": 0.5, "cached_fraction": 0.25,
            "host_hit_blocks": 3, "rerotated_blocks": 0, "engine_steps": 10, "step_ms": 12.34, "step_kinds": KINDS,
            "compiles": 0}  # fmt: skip


def test_rag_kinds_cell():
    rag = bench("rag")
    assert rag.kinds_cell({"step_kinds": KINDS}) == "64 / 0 / 8 steps, 410 / 0 / 1,520 ms"
    assert rag.kinds_cell({}) == "-"


def test_rag_table_rows_and_ceiling():
    rag = bench("rag")
    ceiling = rag.ceiling({"computed_prompt_tokens": 1000, "wall_s": 2.0}, 0.5, 0.81, 4, 4.62)
    result = {"model": "m", "device": "d", "samples": 4, "passages": 10, "passage_tokens": (100, 300),
              "new_tokens": 32, "max_num_seqs": 8, "max_num_batched_tokens": 512, "git_sha": "abc", "block_size": 16,
              "num_blocks": None, "host_cache_gib": 0.0,
              "rows": {0.5: {"vanilla_prefix": rag_row(2.0), "barrier": rag_row(4.0), "isps": rag_row(5.0),
                             "ceiling": ceiling},
                       0.9: {"isps_host_tier": rag_row(3.0), "isps_recompute": rag_row(1.5)}}}  # fmt: skip
    lines = rag.table(result).splitlines()
    rest = "| 123 | 500 | 0.25 | 3 | 0 | 10 | 12.3 | 64 / 0 / 8 steps, 410 / 0 / 1,520 ms | 0 |"
    header = lines[4].split(" | ")
    assert header[2:5] == ["samples/s", "vs vanilla (offload: vs recompute)", "vs barrier"]
    assert lines[6:11] == [
        "| 0.5 | vanilla_prefix | 2.00 | 1.00x | 0.50x " + rest,
        "| 0.5 | barrier | 4.00 | 2.00x | 1.00x " + rest,
        "| 0.5 | isps | 5.00 | 2.50x | 1.25x " + rest,
        "| 0.9 | isps_host_tier | 3.00 | 2.00x | - " + rest,
        "| 0.9 | isps_recompute | 1.50 | 1.00x | - " + rest,
    ]
    assert "Device KV blocks of 16 tokens: from memory; host tier: 0.0 GiB." in lines
    assert lines[-1] == (
        "Reuse 0.5: the engine computes 1,124 tokens in every schedule, at its prefill rate (500 tok/s, the same "
        "prompts with one new token); with the last prompt's decode steps after them (10.00 ms each, one sample "
        "timed) no schedule takes less than 2.31 s, against barrier's 4.62 s: none beats barrier by more than 2.00x."
    )


# -- ttft_spans.py ----------------------------------------------------------------------------------------------


class FakeSpansLLM:
    """An LLM whose TTFTs are scripted: the cached prompt hits only after its spans' prefill since the last reset;
    every next question takes the next of `next_s` (one list per suffix)."""

    def __init__(self, cached_s, cold_s, shuffled_s, next_s):
        self.cached_s, self.cold_s, self.shuffled_s, self.next_s = list(cached_s), cold_s, shuffled_s, next_s
        self.has_spans = False
        self.tokenizer, self.composer = object(), self
        self.config = SimpleNamespace(device="cpu")
        self.engine = SimpleNamespace(kv=SimpleNamespace(reset_prefix_cache=self.reset))

    def reset(self):
        self.has_spans = False

    # the composer's recipes: (recipe, docs, question) tuples
    def block_attention(self, system, docs, question):
        return ("pic", tuple(docs), question)

    def prefix(self, system, docs, question):
        return ("prefix", tuple(docs), question)

    def span_prompts(self, recipe, docs):
        return [("span", d) for d in docs]

    def generate(self, prompt, params, use_tqdm=False):
        if isinstance(prompt, list):  # the spans' (and system turn's) prefill
            self.has_spans = True
            return [SimpleNamespace(metrics=SimpleNamespace(ttft=0.0), num_cached_tokens=0) for _ in prompt]
        kind, docs, question = prompt
        ts = bench("ttft_spans")
        if kind == "prefix":
            seconds, cached = (0.0, 0) if docs == tuple(sorted(docs)) else (self.shuffled_s, 3)  # the cached order
        elif question == ts.QUESTION:
            seconds, cached = (self.cached_s.pop(0), 2) if self.has_spans else (self.cold_s, 0)
        else:
            suffix = question[len(ts.QUESTION) : len(ts.QUESTION) + 5]
            seconds, cached = (self.next_s[suffix].pop(0) if suffix in self.next_s else 0.001), 5
        return [SimpleNamespace(metrics=SimpleNamespace(ttft=seconds), num_cached_tokens=cached)]


def test_ttft_spans_measure_takes_the_minimum():
    ts = bench("ttft_spans")
    llm = FakeSpansLLM([0.012, 0.010, 0.011], 0.08, 0.05, {})
    docs = ["a", "b"]
    r = ts.measure(llm, lambda: llm.generate([("span", d) for d in docs], None), ("pic", ("a", "b"), ts.QUESTION), 3)
    assert r == {"ttft_s": 0.010, "ttft_all_s": [0.012, 0.010, 0.011], "num_cached_tokens": 2, "num_tokens": 3}


def test_ttft_spans_run_k_ratios():
    ts = bench("ttft_spans")
    assert ts.NEXT_QUESTIONS == 7
    why = [0.007, 0.003, 0.005, 0.001, 0.009, 0.002, 0.008]  # median 5 ms, min 1 ms
    how = [0.004, 0.004, 0.02, 0.01, 0.01, 0.01, 0.03]  # median 10 ms, min 4 ms
    # the warm-up questions (" Warm?") come first and take 0 s; timed questions take the lists in turn
    llm = FakeSpansLLM([0.012, 0.010], 0.08, 0.05, {" Why?": why, " How?": how})
    row = ts.run_k(llm, ["a", "b", "c"], 3, 2, random.Random(0))
    assert row["pic_cached"]["ttft_s"] == 0.010 and row["pic_cold"]["ttft_s"] == 0.08
    assert row["prefix_shuf"]["ttft_s"] == 0.05 and row["prefix_shuf"]["num_cached_tokens"] == 3  # a shuffled order
    assert row["next_question"]["ttft_s"] == 0.001 and row["next_question"]["ttft_median_s"] == 0.005
    assert row["next_question_2tok"]["ttft_s"] == 0.004 and row["next_question_2tok"]["ttft_median_s"] == 0.01
    assert row["cold_over_cached"] == pytest.approx(8.0)
    assert row["prefix_shuf_over_cached"] == pytest.approx(5.0)
    assert row["cold_over_next"] == pytest.approx(16.0)
    assert row["cold_over_next_2tok"] == pytest.approx(8.0)


def test_ttft_spans_run_k_shuffles_two_documents():
    ts = bench("ttft_spans")
    llm = FakeSpansLLM([0.010], 0.08, 0.05, {})
    row = ts.run_k(llm, ["a", "b"], 2, 1, random.Random(0))
    assert row["prefix_shuf"]["ttft_s"] == 0.05 and row["prefix_shuf_over_cached"] == pytest.approx(5.0)


def test_ttft_spans_profile_k_ratios(monkeypatch):
    ts = bench("ttft_spans")
    profiled = {"device_s": 0.004, "device_span_s": 0.005, "ttft_profiled_s": 0.011, "top_kernels": [],
                "top_host_ops": [], "gaps_us": 1000.0, "gaps_by_pair": []}  # fmt: skip
    monkeypatch.setattr(ts, "device_time", lambda llm, setup, prompt, fresh=True: dict(profiled))
    row = {"k": 2, "pic_cached": {"ttft_s": 0.010}}
    ts.profile_k(FakeSpansLLM([], 0.08, 0.05, {}), ["a", "b"], row)
    first = row["pic_cached"]
    assert first["ttft_s"] == 0.010 and first["device_s"] == 0.004
    assert first["ttft_over_device"] == pytest.approx(2.5) and first["ttft_over_device_span"] == pytest.approx(2.0)
    assert first["next_question"] == profiled


def test_ttft_spans_kernel_gaps_by_the_pair_either_side():
    """Gaps run from the latest end so far (a copy overlapping a kernel leaves none) to the next start, each counted
    under the pair of names around it; the pairs come by total idle time, longest first."""
    ts = bench("ttft_spans")
    kernels = [
        ("gemm", 0.0, 10.0),
        ("copy", 2.0, 4.0),  # inside the gemm: no gap, and the gemm stays the latest end
        ("norm", 13.0, 14.0),  # 3 after the gemm
        ("gemm", 14.0, 20.0),  # back to back: no gap
        ("norm", 21.0, 22.0),  # 1 after the gemm
        ("attention", 22.5, 30.0),  # 0.5 after the norm
    ]
    got = ts.kernel_gaps(list(reversed(kernels)))  # any order
    assert got["gaps_us"] == pytest.approx(4.5)
    assert got["by_pair"] == [("gemm", "norm", 2, pytest.approx(4.0)), ("norm", "attention", 1, pytest.approx(0.5))]
    assert ts.kernel_gaps(kernels, top=1)["by_pair"] == [("gemm", "norm", 2, pytest.approx(4.0))]
    assert ts.kernel_gaps([]) == {"gaps_us": 0.0, "by_pair": []}
    long = "x" * 60
    assert ts.kernel_gaps([(long + "a", 0.0, 1.0), (long + "b", 2.0, 3.0)])["by_pair"][0][:2] == ("x" * 48,) * 2


def test_ttft_spans_table_row():
    ts = bench("ttft_spans")
    row = {"k": 2, "pic_cached": {"num_tokens": 300, "ttft_s": 0.0104, "num_cached_tokens": 256},
           "pic_cold": {"ttft_s": 0.0832}, "prefix_shuf": {"ttft_s": 0.052, "num_cached_tokens": 48},
           "next_question": {"ttft_median_s": 0.0051, "ttft_s": 0.0012, "ttft_all_s": [0.0] * 7},
           "next_question_2tok": {"ttft_median_s": 0.0102, "ttft_s": 0.0041},
           "cold_over_cached": 8.0, "prefix_shuf_over_cached": 5.0, "cold_over_next": 16.3,
           "cold_over_next_2tok": 8.157}  # fmt: skip
    lines = ts.table([row], 128).splitlines()
    assert lines[0].startswith("Documents of 128 tokens;") and "a next question: 7 new questions" in lines[0]
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    cells = [c.strip() for c in lines[4].strip("|").split("|")]
    assert dict(zip(header, cells, strict=True)) == {
        "k": "2", "prompt tokens": "300", "PIC cached TTFT (ms)": "10.4", "PIC cold (ms)": "83.2",
        "prefix, shuffled (ms)": "52.0", "cold / cached": "8.00x", "prefix shuffled / cached": "5.00x",
        "cached tokens (PIC / prefix)": "256 / 48", "cached: GPU busy (ms)": "-", "cached TTFT / GPU": "-",
        "GPU span (ms)": "-", "cached TTFT / span": "-", "cached TTFT, engine driven directly (ms)": "-",
        "next question TTFT, median / min (ms)": "5.1 / 1.2", "cold / next question (median)": "16.30x",
        "next question of 2 tokens, TTFT median / min (ms)": "10.2 / 4.1", "cold / next question of 2 tokens": "8.16x",
    }  # fmt: skip
    row["pic_cached"].update(device_s=0.004, ttft_over_device=2.6, device_span_s=0.0052, ttft_over_device_span=2.0,
                             ttft_direct_s=0.0093)  # fmt: skip
    cells = [c.strip() for c in ts.table([row], 128).splitlines()[4].strip("|").split("|")]
    assert cells[8:13] == ["4.0", "2.60x", "5.2", "2.00x", "9.3"]


# -- span_scaling.py --------------------------------------------------------------------------------------------


def test_span_scaling_table_rows():
    span_scaling = bench("span_scaling")
    base = {"n": 1, "tokens": 300, "spans_s": 0.010, "causal_s": 0.012}
    row = {"n": 4, "tokens": 1100, "spans_s": 0.040, "causal_s": 0.100}
    assert span_scaling.table_rows([base, row]) == [  # ratios to the first row's one span
        "| 1 | 300 | 10.0 | 12.0 | 1.00x | 1.20x | 1.20x |",
        "| 4 | 1100 | 40.0 | 100.0 | 4.00x | 10.00x | 2.50x |",
    ]


def test_span_scaling_ttft_is_the_minimum_over_fresh_caches():
    span_scaling = bench("span_scaling")
    times, resets = [0.3, 0.1, 0.2], []

    def generate(prompt, params, use_tqdm=False):
        return [SimpleNamespace(metrics=SimpleNamespace(ttft=times[len(resets) - 1]))]

    llm = SimpleNamespace(generate=generate, engine=SimpleNamespace(kv=SimpleNamespace(
        reset_prefix_cache=lambda: resets.append(1))))  # fmt: skip
    assert span_scaling.ttft(llm, "prompt", 3) == 0.1 and len(resets) == 3


# -- cpu_engine.py ----------------------------------------------------------------------------------------------


def test_cpu_engine_batch_figures():
    cpu_engine = bench("cpu_engine")
    floor = {"weight_bytes": 300, "kv_bytes": 100}
    r = cpu_engine.batch_figures(4, 10, [2.0, 1.0, 4.0], [4.0, 8.0, 5.0], [8.0, 20.0, 10.0], 3, floor, 1000.0)
    assert list(r) == ["requests", "new_tokens", "ours_s", "onednn_s", "hf_s", "ours_tok_s", "onednn_tok_s",
                       "hf_tok_s", "identical_outputs", "weight_bytes", "kv_bytes", "floor_tok_s", "speedup",
                       "over_onednn"]  # fmt: skip
    assert (r["requests"], r["new_tokens"], r["identical_outputs"]) == (4, 40, "3/4")
    assert (r["ours_tok_s"], r["onednn_tok_s"], r["hf_tok_s"]) == (20.0, 8.0, 4.0)  # 40 tokens / each median
    assert r["speedup"] == 5.0 and r["over_onednn"] == 2.5
    assert r["floor_tok_s"] == 10.0  # 4 tokens a step, a step reading 400 bytes at 1,000 bytes/s


def test_cpu_engine_mean_kv_len():
    cpu_engine = bench("cpu_engine")
    assert cpu_engine.mean_kv_len([40, 61, 80], 128) == 124  # 60.33 prompt tokens + 64: half the new tokens


def test_cpu_engine_per_step_ms():
    cpu_engine = bench("cpu_engine")
    times = {"schedule": 0.1, "prepare": 0.2, "forward": 1.0, "sample": 0.05, "postprocess": 0.15,
             "detokenize": 0.08, "step": 1.6}  # fmt: skip
    ms = cpu_engine.per_step_ms(times, 10)
    assert list(ms) == [*cpu_engine.PHASES, "other", "step"]
    expected = {"schedule": 10, "prepare": 20, "forward": 100, "sample": 5, "postprocess": 15, "detokenize": 8,
                "other": 10, "step": 160}  # fmt: skip
    assert ms == pytest.approx(expected)  # detokenize runs inside postprocess: not taken from "other" again


def test_cpu_engine_decode_step_bytes_counts_a_tied_head_once():
    cpu_engine = bench("cpu_engine")
    embed, mlp = torch.nn.Linear(8, 32, bias=False), torch.nn.Linear(8, 8, bias=False)
    head = torch.nn.Linear(8, 32, bias=False)
    head.weight = embed.weight
    model = torch.nn.ModuleList([embed, mlp, head])
    cfg = SimpleNamespace(num_attention_layers=3, num_kv_heads=2, head_dim=4)
    llm = SimpleNamespace(engine=SimpleNamespace(runner=SimpleNamespace(model=model)),
                          config=SimpleNamespace(model=cfg))  # fmt: skip
    r = cpu_engine.decode_step_bytes(llm, batch=5, kv_len=7)
    assert r == {"weight_bytes": (8 * 32 + 8 * 8) * 4, "kv_bytes": 5 * 7 * 2 * 3 * 2 * 4 * 4}


# -- host_ttft.py -----------------------------------------------------------------------------------------------


def test_host_ttft_split_sections():
    host_ttft = bench("host_ttft")
    t = {"validate": 0.001, "make_request": 0.004, "schedule": 0.002, "report": 0.0005, "prepare": 0.003,
         "execute": 0.010}  # fmt: skip
    req = SimpleNamespace(arrival_time=100.0, first_token_time=100.0225)
    s = host_ttft.split_sections(t, [0.009, 0.008], req)
    assert set(host_ttft.SECTIONS) <= set(s) and "execute" not in s and "make_request" not in s
    expected = {"validate": 1, "gc": 0, "request": 3, "ttft": 22.5, "schedule": 2, "report": 0.5, "prepare": 3,
                "forward": 7, "post": 4.5, "host": 15.5}  # fmt: skip
    assert {k: 1e3 * v for k, v in s.items()} == pytest.approx(expected)


def test_host_ttft_summarize():
    host_ttft = bench("host_ttft")
    rows = [dict.fromkeys(host_ttft.SECTIONS, v) for v in (3.0, 1.0, 2.0, 10.0)]
    rows[0]["gc"] = 0.0
    medians, minima = host_ttft.summarize(rows)
    assert medians == {**dict.fromkeys(host_ttft.SECTIONS, 2.5), "gc": 1.5}
    assert minima == {**dict.fromkeys(host_ttft.SECTIONS, 1.0), "gc": 0.0}


# -- checkpoint_placement.py ------------------------------------------------------------------------------------


def placement_rows(cp, stream="s"):
    Row = cp.Row
    rows = []
    for i, policy in enumerate([*cp.BASELINES, "dp | entry"]):
        for m in (1, 2):
            rows.append(Row(stream, policy, m, 1.0 + i / 10 + m, 2.0 + i / 10 + m, float(m * i), 0.0))
    rows.append(Row(stream, cp.CEILING, 1, 9.5, 9.75, 40.0, 0.0))
    return rows


def test_checkpoint_placement_steady_factor_skips_the_warmup():
    cp = bench("checkpoint_placement")
    assert cp.steady_factor([10, 20, 30, 40], [10, 10, 5, 15], 2) == 70 / 20
    assert cp.steady_factor([10, 20, 30, 40], [10, 10, 5, 15], 0) == 100 / 40


def test_checkpoint_placement_run_stream():
    cp = bench("checkpoint_placement")
    rng = random.Random(0)
    prefix = [rng.randrange(50) for _ in range(64)]
    requests = [np.array(prefix + [rng.randrange(50) for _ in range(16 + 8 * (i % 3))]) for i in range(6)]
    args = SimpleNamespace(warmup_fraction=0.0, budgets=[1, 2], bin_size=16, num_entries=4)
    rows = cp.run_stream("s", requests, args)
    assert [(r.policy, r.budget) for r in rows] == [
        *((p, m) for p in (*cp.BASELINES, *cp.DP_VARIANTS) for m in (1, 2)),
        (cp.CEILING, 1),
    ]
    assert all(r.steady_factor == pytest.approx(r.factor) for r in rows)  # no warm-up: the same requests
    none = rows[0]
    assert none.policy == "none" and none.factor == 1.0
    args.warmup_fraction = 0.5  # the last 3 requests: later ones hit more
    (row,) = [r for r in cp.run_stream("s", requests, args) if (r.policy, r.budget) == ("balanced", 2)]
    result = cp.simulate(requests, cp.make_planner("balanced", 2, 16), num_entries=4)
    steady = sum(map(len, requests[3:])) / sum(result.recomputed_per_request[3:])
    assert row.factor == result.savings_factor and row.steady_factor == pytest.approx(steady) != row.factor


def test_checkpoint_placement_table_and_margins():
    cp = bench("checkpoint_placement")
    rows = placement_rows(cp) + placement_rows(cp, "other")
    lines = cp.table(rows, "s", [1, 2], "steady_factor")
    assert lines[:2] == ["| policy | M=1 | M=2 |", "|---|---|---|"]
    assert lines[2] == "| none | 3.000 (0.0) | 4.000 (0.0) |"
    assert lines[3] == "| kv_only | 3.100 (1.0) | 4.100 (2.0) |"
    assert lines[8] == "| dp | entry | 3.600 (6.0) | 4.600 (12.0) |"
    assert len(lines) == 2 + 7 + 2
    assert lines[-1] == "Upper bound, a checkpoint at every aligned position (40 per request): 9.750"
    assert cp.table(rows, "s", [1, 2], "factor")[-1].endswith(": 9.500")
    # dp | entry (i = 6) against the best baseline (sqrt, i = 5): +0.1 at each budget
    assert cp.margins(rows, "s", [1, 2], "factor") == pytest.approx([0.1, 0.1])
    assert cp.policies_of(rows) == [*cp.BASELINES, "dp | entry"]
    assert cp.ceiling_of(rows, "other").stream == "other"


# -- hybrid_checkpoints.py --------------------------------------------------------------------------------------


def test_hybrid_make_row():
    hc = bench("hybrid_checkpoints")
    stats = {"num_checkpoints_saved": 7, "state_memory_bytes": 3 * 2**20}
    row = hc.make_row("s", "dp", 2, [100, 200, 300, 400], [100, 50, 300, 150], [0.01, 0.04, 0.02, 0.09], stats)
    assert row == hc.Row("s", "dp", 2, 4, 250, 150, 1000 / 600, 0.5, pytest.approx(40.0), pytest.approx(30.0), 7, 3.0)
    none = hc.make_row("s", "none", 1, [10, 20], [0, 0], [0.001, 0.003], {})
    assert none.savings_factor == 30.0 and none.resumed_fraction == 1.0  # nothing recomputed: no division by 0
    assert (none.checkpoints_saved, none.state_memory_mib) == (0, 0.0)


def test_hybrid_resumed_share_counts_strictly_fewer_tokens():
    hc = bench("hybrid_checkpoints")
    assert hc.resumed_share([10, 9, 0, 5], [10, 10, 10, 10]) == 0.75


def hybrid_row(hc, policy, budget, recomputed):
    return hc.Row("s", policy, budget, 3, 100.0, recomputed, 100 / recomputed, 0.5, 12.4, 11.0, 0, 0.0)


def test_hybrid_report():
    hc = bench("hybrid_checkpoints")
    rows = [hybrid_row(hc, "none", 1, 100.0), hybrid_row(hc, "sqrt", 1, 60.0), hybrid_row(hc, "sqrt", 2, 50.0),
            hybrid_row(hc, "dp", 1, 60.0), hybrid_row(hc, "dp", 2, 40.0)]  # fmt: skip
    args = SimpleNamespace(budgets=[1, 2], policies=["none", "sqrt", "dp"], device="cpu")
    lines = hc.report(rows, args, "abc", {}).splitlines()
    assert lines[4] == "## s: 3 requests, 100 prompt tokens per request"
    assert lines[8:14] == [
        "| policy | M=1 | M=2 |",
        "|---|---|---|",
        "| none | 100 (12 ms; 50%) | 100 (12 ms; 50%) |",
        "| sqrt | 60 (12 ms; 50%) | 50 (12 ms; 50%) |",
        "| dp | 60 (12 ms; 50%) | 40 (12 ms; 50%) |",
        "",
    ]
    assert lines[14] == "dp <= every other policy at every budget: True"
    rows[-1] = hybrid_row(hc, "dp", 2, 50.5)
    assert "dp <= every other policy at every budget: False" in hc.report(rows, args, "abc", {})


def test_hybrid_timeline_busy_is_the_union_of_kernels():
    hc = bench("hybrid_checkpoints")
    from torch.autograd import DeviceType

    def event(name, start, end, device=DeviceType.CUDA):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end))

    events = [event("host", 0, 50, DeviceType.CPU), event("k1", 100, 300), event("k2", 200, 400),
              event("k3", 1400, 1500), event("phase:schedule", 500, 900), event("k4", 450, 460),
              event("k5", 120, 150)]  # fmt: skip  # NOTE: k5 runs inside k1 (another stream): no gap after it
    r = hc.timeline(events)
    assert r["kernel_busy_ms"] == pytest.approx((300 + 10 + 100) / 1e3)  # 100-400, 450-460, 1400-1500 (us)
    assert r["kernel_span_ms"] == pytest.approx(1.4) and r["first_kernel_ms"] == pytest.approx(0.1)
    assert r["idle_gaps"] == [{"ms": 0.94, "at_ms": 0.46, "after": "k4", "before": "k3"},
                              {"ms": 0.05, "at_ms": 0.4, "after": "k2", "before": "k4"}]  # fmt: skip
    assert r["phases"] == [("phase:schedule", 0.5, 0.4)]


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_hybrid_capture_cost_is_per_checkpoint(monkeypatch):
    hc = bench("hybrid_checkpoints")
    clock, positions = FakeClock(), []
    monkeypatch.setattr(hc, "time", SimpleNamespace(perf_counter=clock))

    def step():  # a prefill takes 1 s, and 0.1 s more a checkpoint
        clock.now += 1.0 + 0.1 * len(engine.req.checkpoint_positions)
        positions.append(engine.req.checkpoint_positions)
        engine.req.is_finished = True

    engine = SimpleNamespace(
        pool=SimpleNamespace(reset_prefix_cache=lambda: None), kv=SimpleNamespace(states=SimpleNamespace(reset=dict)),
        make_request=lambda prompt, params: SimpleNamespace(is_finished=False), step=step,
        config=SimpleNamespace(cache=SimpleNamespace(block_size=16)),
        runner=SimpleNamespace(device=SimpleNamespace(type="cpu"), state_tensors=SimpleNamespace(checkpoint_bytes=99)),
    )  # fmt: skip
    engine.add = lambda req: setattr(engine, "req", req)
    r = hc.capture_cost(engine, list(range(250)))
    assert positions[1] == [16, 48, 80, 112, 144, 176, 208]  # each eighth of the prompt, down to a block
    assert r == {"ms_per_checkpoint": pytest.approx(100.0), "bytes_per_checkpoint": 99, "prompt_len": 250}


def test_hybrid_decode_rates_leave_out_the_prefill(monkeypatch):
    hc = bench("hybrid_checkpoints")
    clock = FakeClock()
    monkeypatch.setattr(hc, "time", SimpleNamespace(perf_counter=clock))

    def generate(prompts, params, use_tqdm=False):
        clock.now += 2.0
        return [SimpleNamespace(token_ids=[0] * params.max_tokens, metrics=SimpleNamespace(ttft=0.1 * (i + 1)))
                for i in range(len(prompts))]  # fmt: skip

    # 4 requests of 8 tokens: 7 decode tokens each after the last first token (0.4 s) of a 2 s run
    assert hc.engine_decode(SimpleNamespace(generate=generate), [[1]] * 4, 8) == pytest.approx(28 / 1.6)

    delays = iter([0.0, 0.0, 0.2, 0.0])  # the warm-up, two prefills alone (the second disturbed), the run

    def hf_generate(ids, max_new_tokens, **kwargs):
        clock.now += 0.5 + 0.1 * max_new_tokens + next(delays)  # a prefill of 0.5 s, then 0.1 s a token
        return ids

    hf = SimpleNamespace(generate=hf_generate)
    assert hc.hf_decode(hf, [[1, 2], [3, 4]], 11, "cpu") == pytest.approx(2 * 10 / (1.6 - 0.6))


# -- sched_replay.py --------------------------------------------------------------------------------------------


def step(*seqs, num_steps: int = 1):
    """A SchedulerOutput-like step: `seqs` as (num_query_tokens, kv_len)."""
    scheduled = [SimpleNamespace(num_query_tokens=q, kv_len=kv) for q, kv in seqs]
    return SimpleNamespace(scheduled=scheduled, num_batched_tokens=sum(q for q, _ in seqs), num_steps=num_steps)


def test_sched_replay_step_seconds():
    sr = bench("sched_replay")
    shapes = [(1, 1), (2, 2), (4, 4), (1, 64), (2, 64), (4, 512)]  # (seqs, tokens), by tokens
    decode = sr.DECODE_S + 2 * sr.DECODE_SEQ_S + 1000 * sr.KV_READ_S
    assert sr.step_seconds(step((1, 400), (1, 600), num_steps=8), shapes) == pytest.approx(8 * decode)
    # no bucket for 8 sequences: eager, each step of the burst at least EAGER_STEP_S
    eight = step(*[(1, 10)] * 8, num_steps=2)
    assert sr.step_seconds(eight, shapes) == pytest.approx(2 * sr.EAGER_STEP_S)
    # a prefill of 300 tokens beside a decode runs in the (4, 512) bucket: 512 tokens at the prefill rate
    mixed = step((300, 300), (1, 1000))
    assert sr.step_seconds(mixed, shapes) == pytest.approx(512 * sr.PREFILL_TOK_S)
    # a short prefill beside a decode of a long context: the floor (the weights and that decode's keys) is larger
    short = step((3, 3), (1, 1_000_000))
    assert sr.step_seconds(short, shapes) == pytest.approx(sr.DECODE_S + 2 * sr.DECODE_SEQ_S + 1e6 * sr.KV_READ_S)
    # past every bucket: eager, and its tokens unpadded
    big = step((2000, 2000), (1, 10))
    assert sr.step_seconds(big, shapes) == pytest.approx(2001 * sr.PREFILL_TOK_S)
    assert sr.step_seconds(step((5, 5), (1, 10)), [(1, 1)]) == sr.EAGER_STEP_S


def test_sched_replay_count_computed():
    sr = bench("sched_replay")

    def sched(num_prompt_tokens, ranges):
        seq = SimpleNamespace(num_prompt_tokens=num_prompt_tokens)
        return SimpleNamespace(seq=seq, query_ranges=ranges, num_query_tokens=sum(e - s for s, e in ranges))

    counts = {"computed": 5, "prompt_computed": 2}
    out = SimpleNamespace(scheduled=[sched(100, [(0, 32), (64, 96)]), sched(50, [(40, 51)]), sched(20, [(25, 26)])])
    sr.count_computed(counts, out)
    assert counts == {"computed": 5 + 64 + 11 + 1, "prompt_computed": 2 + 64 + 10}


def test_sched_replay_percentile_rounds_the_rank_down():
    sr = bench("sched_replay")
    assert sr.percentile([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 0.9) == 9  # rank 9.9
    assert sr.percentile(list(range(12)), 0.99) == 10  # rank 10.89
    assert sr.percentile([5.0], 0.99) == 5.0
    assert sr.percentile(list(range(11)), 0.9) == 9  # rank 9.0, not 0.9 x 11 - 1


def test_sched_replay_modeled_ttft():
    sr = bench("sched_replay")
    first_token_s = {str(i): float(t) for i, t in enumerate([5, 1, 9, 3, 7, 11, 2, 8, 4, 10, 6, 0])}
    assert sr.modeled_ttft(first_token_s) == {"modeled_ttft_p50_s": 5.5, "modeled_ttft_p99_s": 10.0}


def test_sched_replay_replay_times_each_first_token():
    sr = bench("sched_replay")
    r = sr.replay(sr.synthesize(12, 0.5), "inline", 8000, max_num_seqs=4, budget=1024)
    # after its first token a request decodes NEW_TOKENS - 1 more, each in a step of DECODE_S at least
    assert 0 < r["modeled_ttft_p50_s"] <= r["modeled_ttft_p99_s"] <= r["modeled_s"] - (sr.NEW_TOKENS - 1) * sr.DECODE_S
    assert r["computed"] >= r["prompt_computed"] > 0 and r["preemptions"] == 0


def test_sched_replay_table_row():
    sr = bench("sched_replay")
    r = {"steps": 40, "preemptions": 1, "computed": 12345, "prompt_computed": 12000, "schedule_median_ms": 0.1234,
         "schedule_p90_ms": 0.2, "schedule_total_ms": 6.4, "step_median_ms": 0.3, "step_p90_ms": 0.5,
         "step_total_ms": 15.5, "decisions": "abc", "modeled_s": 2.0, "modeled_ttft_p50_s": 0.4321,
         "modeled_ttft_p99_s": 1.5}  # fmt: skip
    row = "| 8000 | isps | 40 | 1 | 12,345 | 12,000 | 0.123 / 0.200 / 6 | 0.300 / 0.500 / 16 | abc |"
    assert sr.table_row(8000, "isps", r, None) == row
    assert sr.table_row(8000, "isps", r, 64) == row + " 32.00 | 432 / 1500 |"


def test_sched_replay_summarize_takes_the_fastest_repeat():
    sr = bench("sched_replay")
    figures = {"preemptions": 2, "decisions": "d", "computed": 10, "prompt_computed": 8, "modeled_s": 3.0,
               "modeled_ttft_p50_s": 1.0, "modeled_ttft_p99_s": 2.0}  # fmt: skip
    fast = {"schedule_s": [0.004, 0.001, 0.002, 0.003], "post_s": [0.001, 0.001, 0.001, 0.010], **figures}
    slow = {"schedule_s": [0.002] * 4, "post_s": [0.010] * 4, **figures, "preemptions": 9}  # less schedule()
    r = sr.summarize([slow, fast])
    assert r["steps"] == 4 and r["preemptions"] == 2
    ms = {k: v for k, v in r.items() if k.endswith("_ms")}
    assert ms == pytest.approx({"schedule_median_ms": 2.5, "schedule_p90_ms": 3.0, "schedule_total_ms": 10.0,
                                "step_median_ms": 4.0, "step_p90_ms": 5.0, "step_total_ms": 23.0})  # fmt: skip
    assert {k: r[k] for k in figures if k != "preemptions"} == {k: v for k, v in figures.items() if k != "preemptions"}
    with pytest.raises(AssertionError, match="scheduled differently"):
        sr.summarize([fast, {**slow, "decisions": "e"}])
