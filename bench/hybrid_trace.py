"""Per request, what a checkpoint policy did on one stream: resume position, planned and saved checkpoints, and the
request's deepest overlap with any earlier prompt (the best a resume could do, to a block). For reading why one
policy recomputes more than another; token counts do not depend on the device, so the CPU answers for the H200.

    PYTHONPATH=. python bench/hybrid_trace.py --stream system_prompts --budget 1 --policies dp sqrt
    PYTHONPATH=. python bench/hybrid_trace.py --stream essay_questions --budget 8 --max-len 8192  # whole essays
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

import minipic_lite as mp

MAX_LEN, NUM_ENTRIES = 4096, 4  # the CPU savings runs' engine (hybrid_checkpoints.py; KV blocks: max_len // 4)


def overlap(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    mismatch = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(mismatch[0]) if mismatch.size else n


def trace(model_dir: Path, requests: list[list[int]], policy: str, budget: int, ckpt_bytes: int,
          max_len: int = MAX_LEN, turn_start_id: int | None = None) -> list[dict]:  # fmt: skip
    llm = mp.LLM(str(model_dir), device="cpu", load_format="dummy", num_blocks=max_len // 4, max_model_len=max_len,
                 max_num_batched_tokens=2048, max_num_seqs=4, checkpoint_policy=policy, checkpoints_per_entry=budget,
                 state_cache_gib=(NUM_ENTRIES * budget + 0.5) * ckpt_bytes / 2**30,
                 checkpoint_turn_start_id=turn_start_id)  # fmt: skip
    params = mp.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    rows = []
    for i, tokens in enumerate(requests):
        report = llm.generate([tokens], params, use_tqdm=False)[0].state_report
        depth = max((overlap(tokens, requests[j]) for j in range(i)), default=0)
        rows.append(dict(request=i, tokens=len(tokens), depth=depth, resume=report.resume_position,
                         planned=report.planned_checkpoints, saved=report.saved_checkpoints))  # fmt: skip
    return rows


def main() -> None:
    import hybrid_checkpoints as bench  # bench/, beside this

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=Path, default=Path(__file__).parent / "data" / "hybrid_streams_gpu.json")
    parser.add_argument("--stream", default="system_prompts")
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--budget", type=int, default=1, help="checkpoints per entry (M)")
    parser.add_argument("--policies", nargs="+", default=["dp", "sqrt"])
    parser.add_argument("--max-len", type=int, default=MAX_LEN, help="context; longer prompts keep max_len - 1 tokens")
    args = parser.parse_args()
    max_len = args.max_len
    requests = [r[: max_len - 1] for r in json.loads(args.streams.read_text())[args.stream]][: args.num_requests]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = bench.write_config(Path(tmp), bench.CPU_SHAPE, bench.SMOLLM2_VOCAB, max_len)
        ckpt_bytes = bench.checkpoint_bytes(
            model_dir, argparse.Namespace(device="cpu", num_blocks=max_len // 4, max_len=max_len)
        )
        for policy in args.policies:
            rows = trace(model_dir, requests, policy, args.budget, ckpt_bytes, max_len, bench.SMOLLM2_TURN_START_ID)
            recomputed = sum(r["tokens"] - r["resume"] for r in rows) / len(rows)
            print(f"{policy} M={args.budget}: {recomputed:.1f} prompt tokens recomputed per request")
            for r in rows:
                print(f"  {r['request']:3} tokens {r['tokens']:5}  deepest overlap {r['depth']:5}  "
                      f"resume {r['resume']:5}  planned {r['planned']}  saved {r['saved']}")  # fmt: skip


if __name__ == "__main__":
    main()
