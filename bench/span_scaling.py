"""Uncached span prefill scaling: prefill time of n uncached SSEP spans against one causal prompt of the same length.

Each SSEP span attends only to itself, so the attention work of n spans of L tokens grows as n * L^2 (linear in
n), while one causal prompt of n * L tokens grows as (n * L)^2. Both prompts are block-attention-shaped (a
short system turn, the documents, a question); the causal one is the same tokens without span markers. TTFT on
an empty cache, the minimum over repeats.

    python bench/span_scaling.py                                       # CPU: SmolLM2, 256-token spans
    python bench/span_scaling.py --device cuda --llama3-8b-shape --span-tokens 2048 --ns 1,2,4,8,16

Results go to bench/results/span_scaling-<sha>-<device>.{json,md} (`--out` names another folder).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from provenance import git_sha  # bench/provenance.py, beside this file
from rag import CONTROL, LLAMA3_8B, RESULTS  # bench/rag.py, beside this file

import minipic_lite as mp
from minipic_lite.prompts import Piece
from minipic_lite.spans import SegmentKind

ONE_TOKEN = mp.SamplingParams(max_tokens=1, temperature=0.0)


def prompts(composer, n: int, span_tokens: int, seed: int) -> tuple[mp.Prompt, mp.Prompt]:
    g = torch.Generator().manual_seed(seed)
    docs = [tuple(torch.randint(100, 40000, (span_tokens - 1,), generator=g).tolist()) for _ in range(n)]
    system, question = tuple(range(100, 132)), tuple(range(200, 216))
    spans = [Piece(system), *(Piece(d, SegmentKind.SSEP) for d in docs), Piece(question, SegmentKind.PDEP)]
    causal = [Piece(system), *(Piece(d) for d in docs), Piece(question)]
    return composer.compose(spans, "block_attention"), composer.compose(causal, "prefix")


def ttft(llm: mp.LLM, prompt, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        llm.engine.kv.reset_prefix_cache()
        times.append(llm.generate(prompt, ONE_TOKEN, use_tqdm=False)[0].metrics.ttft)
    return min(times)


def table_rows(rows: list[dict]) -> list[str]:
    """The table's rows; the first row's n spans are the ratios' unit."""
    base = rows[0]
    return [
        f"| {r['n']} | {r['tokens']} | {1e3 * r['spans_s']:.1f} | {1e3 * r['causal_s']:.1f} "
        f"| {r['spans_s'] / base['spans_s']:.2f}x | {r['causal_s'] / base['spans_s']:.2f}x "
        f"| {r['causal_s'] / r['spans_s']:.2f}x |"
        for r in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--llama3-8b-shape", action="store_true")
    parser.add_argument("--span-tokens", type=int, default=256)
    parser.add_argument("--ns", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results' folder")
    args = parser.parse_args()
    ns = [int(n) for n in args.ns.split(",")]
    model_dir, load_format = None, "auto"
    if args.llama3_8b_shape:
        model_dir = Path(tempfile.mkdtemp()) / "llama3-8b-shape"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(LLAMA3_8B))
        model_dir, load_format = str(model_dir), "dummy"
    max_len = max(ns) * args.span_tokens + 256
    llm = mp.LLM(model_dir, device=args.device, control_tokens=CONTROL, load_format=load_format,
                 max_model_len=max_len, max_num_batched_tokens=max_len)  # fmt: skip
    composer = mp.PromptComposer(None, CONTROL, llm.config.cache.block_size, chat=False)
    llm.generate([list(range(10, 300))], ONE_TOKEN, use_tqdm=False)  # warm-up
    rows = []
    for n in ns:
        spans, causal = prompts(composer, n, args.span_tokens, seed=n)
        row = {"n": n, "tokens": len(spans), "spans_s": ttft(llm, spans, args.repeats)}
        row["causal_s"] = ttft(llm, causal, args.repeats)
        rows.append(row)
        print(f"n={n:>3} ({row['tokens']} tokens): spans {1e3 * row['spans_s']:9.1f} ms   causal "
              f"{1e3 * row['causal_s']:9.1f} ms", flush=True)  # fmt: skip
    lines = [
        f"Uncached span prefill scaling, {'llama3-8b-shape (random bf16)' if args.llama3_8b_shape else 'SmolLM2'}, "
        f"spans of {args.span_tokens} tokens, TTFT on an empty cache (min of {args.repeats}); git {git_sha()}.",
        "",
        "| spans | prompt tokens | n spans (ms) | one causal prompt (ms) | spans / 1 span | causal / 1 span "
        "| causal / spans |",
        "|---|---|---|---|---|---|---|",
    ]
    md = "\n".join(lines + table_rows(rows))
    print("\n" + md)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    result = {"bench": "span_scaling", "git_sha": git_sha(), "device": device, "span_tokens": args.span_tokens,
              "rows": rows, "time": time.time()}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"span_scaling-{result['git_sha']}-{'cuda' if args.device.startswith('cuda') else 'cpu'}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(md + "\n")
    print(f"saved {stem}.json and .md")


if __name__ == "__main__":
    main()
