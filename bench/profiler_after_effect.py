"""Does torch's profiler slow what a process times after it? A cached 8 x 2,048 next question through `generate`
(two tokens, block size 32), timed before and after one run under `torch.profiler` in the same process, rounds
alternating with plain rounds (so a drift of the GPU's clocks shows as such, not as the profiler).

    python bench/profiler_after_effect.py --device cuda --llama3-8b-shape      # the H200 (results: bench/results)
    python bench/profiler_after_effect.py                                     # CPU scale, a tiny random Llama
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def ttfts(llm, composer, docs, num: int, tag: str) -> list[float]:
    """TTFTs (s) of `num` new questions after the cached documents, through generate."""
    from ttft_spans import QUESTION, SYSTEM, TWO_TOKENS  # bench/ttft_spans.py, beside this file

    out = []
    for i in range(num):
        (o,) = llm.generate(composer.block_attention(SYSTEM, docs, QUESTION + f" {tag}" * (i + 2)), TWO_TOKENS,
                            use_tqdm=False)  # fmt: skip
        out.append(o.metrics.ttft)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--llama3-8b-shape", action="store_true")
    parser.add_argument("--doc-tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--questions", type=int, default=9)
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results' folder")
    args = parser.parse_args()
    from loop_handoff import build, save  # bench/loop_handoff.py, beside this file
    from ttft_spans import TWO_TOKENS, TokenIdRecipes, random_documents  # bench/ttft_spans.py, beside this file

    llm = build(args)
    composer = TokenIdRecipes(llm)
    docs = random_documents(8, args.doc_tokens)
    llm.generate(composer.span_prompts("block_attention", docs), TWO_TOKENS, use_tqdm=False)
    ttfts(llm, composer, docs, 3, "warm")
    runs = {"before": ttfts(llm, composer, docs, args.questions, "B1")}
    runs["before_again"] = ttfts(llm, composer, docs, args.questions, "B2")
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities):
        ttfts(llm, composer, docs, 1, "P")
    runs["after"] = ttfts(llm, composer, docs, args.questions, "A1")
    runs["after_again"] = ttfts(llm, composer, docs, args.questions, "A2")
    medians = {k: statistics.median(v) for k, v in runs.items()}
    print(", ".join(f"{k} {1e3 * v:.3f} ms" for k, v in medians.items()), flush=True)
    save("profiler_after_effect", args, {"median_s": medians, "runs": runs})
    llm.close()


if __name__ == "__main__":
    main()
