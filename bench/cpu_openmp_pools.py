"""Two OpenMP pools on a small CPU: the engine loop letting idle pools go (engine_loop.release_openmp_threads)
against the same run with that switched off, side by side, each case in a fresh process.

libgomp keeps a pool per thread that runs torch ops and counts them all; once they hold more threads than cores,
each pool spin-waits 100 turns between parallel regions instead of 300,000, and a decode step is ~120 small regions.
Three cases, each with the release on and off (off: the function replaced by a no-op), alternated `--rounds` times:

1. `alone`: `generate()` of 64 tokens at batch 1 on the embedded SmolLM2 (a short prompt, greedy, EOS ignored), in
   tokens/s over the whole call (median of 5), nothing else in the process;
2. `after_caller_work`: the same, after the caller ran torch work of its own on its thread (a notebook that runs
   transformers before the engine);
3. `caller_beside_idle_engine`: the caller's own small torch ops (3,000 x a 4 x 576 by 576 x 1,536 matmul and a
   SiLU) before the engine exists and once it has served a request and waits, in ms.

    python bench/cpu_openmp_pools.py [--rounds 2] [--out F]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from provenance import git_sha  # bench/provenance.py, beside this file

CASE = """
import json, statistics, sys, time
import torch
import minipic_lite
import minipic_lite.engine_loop as engine_loop
from minipic_lite import SamplingParams
case, release = sys.argv[1], sys.argv[2] == "on"
if not release:
    engine_loop.release_openmp_threads = lambda: False
w, x = torch.randn(576, 1536), torch.randn(4, 576)
def caller_ops_ms():
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(3000):
            torch.nn.functional.silu(x @ w)
        best = min(best, time.perf_counter() - start)
    return best * 1e3
result = {}
if case == "after_caller_work":
    a = torch.randn(512, 512)
    for _ in range(50):
        torch.softmax(a @ a, -1)
if case == "caller_beside_idle_engine":
    caller_ops_ms()
    result["caller_ms_before_engine"] = caller_ops_ms()
llm = minipic_lite.LLM()
params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
if case == "caller_beside_idle_engine":
    llm.generate(["Tell me a story about a cat."], params, use_tqdm=False)
    time.sleep(0.5)
    result["caller_ms_beside_idle_engine"] = caller_ops_ms()
else:
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        llm.generate(["Tell me a story about a cat."], params, use_tqdm=False)
        rates.append(64 / (time.perf_counter() - start))
    result["tok_per_s"] = statistics.median(rates)
    result["runs"] = rates
print(json.dumps(result))
"""


def run_case(case: str, release: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CASE, case, release], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{case} ({release}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    sha = git_sha()
    cases = ("alone", "after_caller_work", "caller_beside_idle_engine")
    rows: dict[str, dict[str, list[dict]]] = {case: {"on": [], "off": []} for case in cases}
    for round_ in range(args.rounds):
        for case in cases:
            for release in ("on", "off") if round_ % 2 == 0 else ("off", "on"):
                rows[case][release].append(run_case(case, release))
                print(case, release, rows[case][release][-1], flush=True)
    summary = {}
    for case in cases:
        on, off = rows[case]["on"], rows[case]["off"]
        if case == "caller_beside_idle_engine":
            summary[case] = {
                key: {"on": statistics.median(r[key] for r in on), "off": statistics.median(r[key] for r in off)}
                for key in ("caller_ms_before_engine", "caller_ms_beside_idle_engine")
            }
        else:
            rate_on = statistics.median(r["tok_per_s"] for r in on)
            rate_off = statistics.median(r["tok_per_s"] for r in off)
            summary[case] = {"tok_per_s_on": rate_on, "tok_per_s_off": rate_off, "on_over_off": rate_on / rate_off}
    print(json.dumps(summary, indent=1))
    out = args.out or Path(__file__).parent / "results" / f"cpu_openmp_pools_{sha}.json"
    out.write_text(json.dumps({"git_sha": sha, "machine": platform.processor() or platform.machine(),
                               "cpus": len(__import__("os").sched_getaffinity(0)), "summary": summary,
                               "rows": rows}, indent=1))  # fmt: skip
    print("wrote", out)


if __name__ == "__main__":
    main()
