"""A mixed step's attention on the GPU: its decodes read in a launch of their own (the op's `num_decode_seqs` hint,
what the engine passes for eager steps) against one launch for the whole batch, side by side in one run.

One launch for a prefill-like batch copies every sequence's keys and values first (the dense path's gather, or the
pre-rotation), the decodes' long contexts too, each then read by one query row. The cases are the RAG table's
steps (Llama-3-8B heads, bf16, shuffled paged blocks): decodes of ~2,200 tokens beside a prompt's prefill chunk.

    python bench/gpu_mixed_step.py            # -> bench/results/gpu_mixed_step_<sha>.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_ops import Clock  # noqa: E402
from gpu_short_prefill import HEADS  # noqa: E402
from provenance import git_sha  # noqa: E402

from ops import rope_paged_attention  # noqa: E402
from ops.testing import SeqSpec, make_problem  # noqa: E402

# (decodes, keys each, prefill tokens, keys cached before the prefill): reuse 0's full budget, a chunk beside a few
# decodes, a final over cached passages (reuse 0.9), and a prefill with no decode beside it (nothing to split)
CASES = [(28, 2200, 8192, 0), (8, 2200, 2048, 0), (31, 2200, 400, 1800), (0, 0, 8192, 0)]


def measure(num_decodes: int, keys: int, prefill: int, cached: int, clock: Clock, device) -> dict:
    seqs = [SeqSpec.decode(keys - 37 * i) for i in range(num_decodes)]
    seqs.append(SeqSpec(cached + prefill, ((cached, cached + prefill),)))
    p = make_problem(seqs, HEADS["num_heads"], HEADS["num_kv_heads"], HEADS["head_dim"], 16, torch.bfloat16,
                     device=device, seed=num_decodes + prefill)  # fmt: skip
    args = list(p.args())
    args[8] = args[8].to(torch.bfloat16)  # the engine's table dtype
    one = rope_paged_attention(*args, check=False)
    split = rope_paged_attention(*args, check=False, num_decode_seqs=num_decodes)
    row = dict(decodes=num_decodes, keys=keys, prefill=prefill, cached=cached)
    row["max_abs_diff"] = (one.float() - split.float()).abs().max().item()
    row["one_launch_ms"] = clock(lambda: rope_paged_attention(*args, check=False))
    row["decodes_apart_ms"] = clock(lambda: rope_paged_attention(*args, check=False, num_decode_seqs=num_decodes))
    row["speedup"] = row["one_launch_ms"] / row["decodes_apart_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    device, clock = torch.device("cuda"), Clock(smoke=False)
    sha = git_sha()
    result = dict(git_sha=sha, device=torch.cuda.get_device_name(), rows=[])
    for case in CASES:
        row = measure(*case, clock, device)
        result["rows"].append(row)
        print(f"{row['decodes']:3d} decodes x {row['keys']:5d} keys + a prefill of {row['prefill']:5d} over "
              f"{row['cached']:5d} cached: one launch {row['one_launch_ms']:.3f} ms, decodes apart "
              f"{row['decodes_apart_ms']:.3f} ms ({row['speedup']:.2f}x; max |diff| {row['max_abs_diff']:.2e})",
              flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gpu_mixed_step_{sha}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
