"""A busy core beside the CPU engine: the thread governor (cpu_threads.py) against the engine's fixed thread count,
side by side, each run in a fresh process.

Cases, each with the governor on and off (`MINIPIC_ADAPT_THREADS=0`), alternated `--rounds` times: `idle` (nothing
else runs) and `busy` (a shell's busy loop holds one core for the whole run). A run: the embedded SmolLM2, fp32,
`generate()` of 64 tokens at batch 1 (a short prompt, greedy, EOS ignored) `--calls` times in a row, tokens/s over
each whole call; the median of the calls after the first (the governor looks at the machine every 0.5 s of serving).

    python bench/cpu_busy_core.py [--rounds 2] [--calls 6] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from provenance import git_sha  # bench/provenance.py, beside this file

RUN = """
import json, sys, time, torch
import minipic_lite
from minipic_lite import SamplingParams
llm = minipic_lite.LLM()
params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
rates, threads = [], []
for _ in range(int(sys.argv[1])):
    start = time.perf_counter()
    llm.generate(["Tell me a story about a cat."], params, use_tqdm=False)
    rates.append(64 / (time.perf_counter() - start))
    threads.append(llm._loop.call(lambda engine: torch.get_num_threads()))
print(json.dumps({"tok_per_s": rates, "threads": threads}))
"""


def run(case: str, governor: bool, calls: int) -> dict:
    env = {**os.environ, "MINIPIC_ADAPT_THREADS": "1" if governor else "0"}
    hog = subprocess.Popen(["sh", "-c", "while :; do :; done"]) if case == "busy" else None
    try:
        done = subprocess.run([sys.executable, "-c", RUN, str(calls)], capture_output=True, text=True, env=env,
                              timeout=900)  # fmt: skip
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    if done.returncode != 0:
        raise RuntimeError(f"{case} (governor {governor}) failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["median_tok_per_s"] = statistics.median(result["tok_per_s"][1:])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.calls < 2:  # NOTE: the first call is the warm-up; the median is over the calls after it
        parser.error(f"--calls {args.calls}: at least 2 (the first call is not counted)")
    sha = git_sha()
    rows: dict[str, dict[str, list[dict]]] = {case: {"on": [], "off": []} for case in ("idle", "busy")}
    for round_ in range(args.rounds):
        for case in rows:
            for governor in (True, False) if round_ % 2 == 0 else (False, True):
                result = run(case, governor, args.calls)
                rows[case]["on" if governor else "off"].append(result)
                print(case, "governor", "on" if governor else "off", round(result["median_tok_per_s"], 1),
                      "threads", result["threads"], flush=True)  # fmt: skip
    summary = {
        case: {key: statistics.median(r["median_tok_per_s"] for r in runs) for key, runs in by.items()}
        for case, by in rows.items()
    }
    for case in summary:
        summary[case]["on_over_off"] = summary[case]["on"] / summary[case]["off"]
    print(json.dumps(summary, indent=1))
    out = args.out or Path(__file__).parent / "results" / f"cpu_busy_core_{sha}.json"
    machine, cpus = platform.processor() or platform.machine(), len(os.sched_getaffinity(0))
    record = {"git_sha": sha, "machine": machine, "cpus": cpus, "summary": summary, "rows": rows}
    out.write_text(json.dumps(record, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
