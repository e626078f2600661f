"""The bench scripts still run: each CPU script's smallest main path in its own process, outputs to tmp_path.

A bench is not run by anything else, so a renamed stat or a changed signature would otherwise surface only on the
next measuring day. Each test runs the script as the README does (`PYTHONPATH=. python bench/<script>.py`) and
checks what its results must hold, not its timings. Left out, as their smallest run takes 30 s (rag.py), 42 s
(cpu_prefill.py), 13 s only with a warm Inductor cache (cpu_decode_layers.py) or minutes (cpu_long_decode.py,
cpu_busy_core.py, cpu_openmp_pools.py): measured on the 2 CPU cores of stop 50; the gpu_* scripts need CUDA.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
SCRIPT_TIMEOUT_S = 180  # NOTE: a hang (a dead engine loop leaves its caller waiting) fails instead of stalling


def run_bench(tmp_path: Path, script: str, *args) -> str:
    """Run bench/<script>.py with `args`; its stdout. Fails with the script's stderr on a non-zero exit."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # NOTE: conftest's; not a bench's
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    # NOTE: one OpenMP thread: on a shared machine two threads' pools spin against the other load (a SmolLM2 step
    # ran ~20x slower with 2 threads than with 1 here); the governor stays off, as in the rest of the suite
    env.update(OMP_NUM_THREADS="1", MINIPIC_ADAPT_THREADS="0")
    env["TMPDIR"] = str(tmp_path)  # NOTE: the scripts' own temporary folders (random models' configs) go too
    cmd = [sys.executable, str(ROOT / "bench" / f"{script}.py"), *map(str, args)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


def only(folder: Path, pattern: str) -> dict:
    (path,) = folder.glob(pattern)
    return json.loads(path.read_text())


def test_sched_replay(tmp_path):
    out = tmp_path / "sched.json"
    run_bench(tmp_path, "sched_replay", "--synthetic", "--samples", 8, "--repeats", 1, "--cost-model", "--json", out)
    rows = json.loads(out.read_text())["results"]
    assert {r["policy"] for r in rows} == {"inline", "isps", "barrier"}
    roomy = [r for r in rows if r["num_blocks"] == max(r["num_blocks"] for r in rows)]
    # a cache that holds every prompt: each policy computes each distinct prompt token once, and preempts nothing
    assert len({r["prompt_computed"] for r in roomy}) == 1 and not any(r["preemptions"] for r in roomy)
    assert all(r["computed"] >= r["prompt_computed"] > 0 and r["modeled_s"] > 0 for r in rows)


def test_checkpoint_placement(tmp_path):
    run_bench(tmp_path, "checkpoint_placement", "--num-requests", 40, "--num-prefixes", 4, "--num-entries", 4,
              "--budgets", 1, 2, "--out", tmp_path)  # fmt: skip
    rows = only(tmp_path, "checkpoint_placement-*.json")["rows"]
    assert {r["stream"] for r in rows} == {"essay_questions", "system_prompts"}
    assert {"none", "dp | entry", "sqrt"} <= {r["policy"] for r in rows}
    assert all(r["factor"] == 1.0 for r in rows if r["policy"] == "none")
    assert all(r["factor"] >= 1.0 for r in rows)  # a cache never makes a replay compute more than no cache
    assert list(tmp_path.glob("checkpoint_placement-*.png"))


def test_host_ttft(tmp_path):
    run_bench(tmp_path, "host_ttft", "--docs", 2, "--doc-tokens", 64, "--runs", 3, "--out", tmp_path)
    result = only(tmp_path, "host_ttft-*-cpu.json")
    # the documents and the system turn hit; only the question's block (and the sampled position) is computed
    assert result["num_tokens"] > 2 * 64 and 0 < result["num_computed_tokens"] <= 2 * result["block_size"]
    assert result["median_s"]["ttft"] >= result["median_s"]["forward"] > 0


def test_loop_handoff(tmp_path):
    run_bench(tmp_path, "loop_handoff", "--doc-tokens", 64, "--questions", 2, "--rounds", 1,
              "--ways", "blocking,polling,direct", "--out", tmp_path)  # fmt: skip
    medians = only(tmp_path, "loop_handoff-*-cpu-b32.json")["median_s"]
    assert set(medians) == {"blocking", "polling", "direct"} and all(m["ttft"] > 0 for m in medians.values())


def test_profiler_after_effect(tmp_path):
    run_bench(tmp_path, "profiler_after_effect", "--doc-tokens", 64, "--questions", 2, "--out", tmp_path)
    medians = only(tmp_path, "profiler_after_effect-*-cpu.json")["median_s"]
    assert set(medians) == {"before", "before_again", "after", "after_again"} and min(medians.values()) > 0


def test_hybrid_checkpoints_and_trace(tmp_path):
    streams = tmp_path / "streams.json"
    run_bench(tmp_path, "hybrid_checkpoints", "--num-requests", 2, "--budgets", 1, "--streams", streams,
              "--stream-names", "system_prompts", "--policies", "none", "dp", "--side-by-side",
              "--prefill-len", 64, "--decode-tokens", 8, "--out", tmp_path)  # fmt: skip
    result = only(tmp_path, "hybrid_checkpoints-*-cpu.json")
    rows = {r["policy"]: r for r in result["rows"]}
    assert rows["none"]["recomputed_per_request"] == rows["none"]["prompt_tokens_per_request"] > 0
    assert rows["dp"]["recomputed_per_request"] <= rows["dp"]["prompt_tokens_per_request"]
    assert set(result["gpu"]) == {"prefill", "decode_b1", "decode_b32", "capture"}
    assert result["gpu"]["capture"]["bytes_per_checkpoint"] == int(result["args"]["checkpoint_bytes"])

    stdout = run_bench(tmp_path, "hybrid_trace", "--streams", streams, "--num-requests", 2, "--max-len", 1024)
    rows = re.findall(r"tokens +(\d+) +deepest overlap +(\d+) +resume +(\d+)", stdout)
    assert len(rows) == 2 * 2  # dp and sqrt, the 2 requests each
    assert all(int(resume) <= int(depth) < int(tokens) for tokens, depth, resume in rows)  # no resume past a match


def test_ptxas_stats(tmp_path):
    stdout = run_bench(tmp_path, "ptxas_stats", "--config", "128,32,4,2,0")
    (row,) = [line for line in stdout.splitlines() if line.startswith("| 128 | 32 | 4 | 2 |")]
    registers = int(row.split("|")[6])
    assert 0 < registers <= 255


def test_ptxas_stats_of_a_decode_holding_its_splits_block_ids(tmp_path):
    """SPLIT_IDS takes the block-table loads out of the decode's key loop: fewer instructions an iteration."""
    args = ("--decode", "--config", "16,32,4,2,128")
    rows = [run_bench(tmp_path, "ptxas_stats", *args, *more) for more in ((), ("--split-ids", 8))]
    body = [int(next(line for line in r.splitlines() if line.startswith("| 16 |")).split("|")[12].split("/")[1])
            for r in rows]  # fmt: skip
    assert 0 < body[1] < body[0]


def test_span_scaling(tmp_path):
    run_bench(tmp_path, "span_scaling", "--span-tokens", 32, "--ns", "1,2", "--repeats", 1, "--out", tmp_path)
    rows = only(tmp_path, "span_scaling-*-cpu.json")["rows"]
    assert [r["n"] for r in rows] == [1, 2] and rows[1]["tokens"] > rows[0]["tokens"]
    assert all(r["spans_s"] > 0 and r["causal_s"] > 0 for r in rows)


def test_ttft_spans(tmp_path):
    run_bench(tmp_path, "ttft_spans", "--doc-tokens", 32, "--ks", 2, "--repeats", 1, "--out", tmp_path)
    (row,) = only(tmp_path, "ttft_spans-*-cpu.json")["tables"]["32"]
    assert row["pic_cold"]["num_cached_tokens"] == 0
    # the documents, cached as spans on their own, hit at their new offsets; a shuffled prefix hits less
    assert row["pic_cached"]["num_cached_tokens"] >= 2 * 32 > row["prefix_shuf"]["num_cached_tokens"]


def test_cpu_engine(tmp_path):
    out = tmp_path / "cpu_engine.json"
    run_bench(tmp_path, "cpu_engine", "--batches", 2, "--new-tokens", 8, "--runs", 1, "--out", out)
    result = json.loads(out.read_text())
    assert result["batch_2"]["identical_outputs"] == "2/2"  # fp32: our greedy tokens are transformers'
    assert result["step_breakdown_ms"]["step"] > 0


def test_sampling_cost(tmp_path):
    out = tmp_path / "sampling_cost.json"
    run_bench(tmp_path, "sampling_cost", "--batch", 2, "--new-tokens", 4, "--rounds", 1, "--out", out)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["batch"] == 2 and row["logprobs_tokens_equal_plain"]  # logprobs change no token
    assert set(row["ratio_to_plain"]) == {"plain", "penalties", "logprobs5"} and row["ratio_to_plain"]["plain"] == 1


def test_prompt_scoring(tmp_path):
    out = tmp_path / "prompt_scoring.json"
    run_bench(tmp_path, "prompt_scoring", "--texts", 2, "--tokens", 64, "--rounds", 1, "--out", out)
    result = json.loads(out.read_text())
    assert result["scored_tokens"] == 2 * 63 and result["max_abs_logprob_diff"] < 1e-3  # transformers' logprobs
    assert set(result["tok_per_s"]) == {"ours", "transformers"} and result["ratio"] > 0
