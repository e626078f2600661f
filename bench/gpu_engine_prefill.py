"""Long-prompt prefill on a GPU: minipic_lite vs HF transformers, Llama-3-8B shape, random bf16, same weights.

The prefill rows of ``bench/gpu_engine.py`` at longer prompts, where attention dominates: 4 x 2048, 1 x 8k,
1 x 16k and 1 x 32k tokens, each timed as the median of 3 runs after a warm-up, ours and HF in one process.
Ours runs position-free (keys rotated by the op); prompts are chunked by ``max_num_batched_tokens`` (8192, as
in ``gpu_engine.py``), and the 16k / 32k rows are repeated as one chunk. HF runs each prompt in one forward
(``logits_to_keep=1``), with torch SDPA's default backend choice.

    python bench/gpu_engine_prefill.py --out results.json   # on the H200
    python bench/gpu_engine_prefill.py --tiny               # a small model on the CPU: checks the script runs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from provenance import git_sha  # bench/provenance.py, beside this file

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.gpu_engine import LLAMA3_8B, TINY, bench_prefill, ceilings, check_logits, hf_from_engine  # noqa: E402

MAX_LEN = 32768 + 64
CHUNK = 8192
ROWS = [(4, 2048, CHUNK), (1, 8192, CHUNK), (1, 16384, CHUNK), (1, 32768, CHUNK), (1, 16384, 16384), (1, 32768, 32768)]
TINY_ROWS = [(2, 128, 256), (1, 512, 256), (1, 512, 512)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import minipic_lite as mp

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = dict(TINY if args.tiny else LLAMA3_8B, max_position_embeddings=2048 if args.tiny else MAX_LEN + 1024)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    results = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "model": cfg}
    results["git_sha"] = git_sha()
    results["ceilings"] = ceil = ceilings(device)
    print("ceilings", ceil, flush=True)
    model_dir = Path(tempfile.mkdtemp()) / "llama3-8b-shape"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(cfg))
    llm = mp.LLM(
        str(model_dir),
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        load_format="dummy",
        position_free=True,
        max_model_len=1024 if args.tiny else MAX_LEN,
        max_num_seqs=8,
        max_num_batched_tokens=512 if args.tiny else CHUNK,
        memory_utilization=0.5,
    )  # fmt: skip  NOTE: not enforce_eager: that also turns off the compiled elementwise kernels
    hf = hf_from_engine(llm, cfg, device, dtype)
    results["logits_check"] = check_logits(llm, hf, cfg["vocab_size"], device)
    print("logits", results["logits_check"], flush=True)
    model = llm.engine.runner.model
    num_params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    default = llm.engine.scheduler.config
    results["prefill"] = []
    for batch, length, chunk in TINY_ROWS if args.tiny else ROWS:
        llm.engine.scheduler.config = dataclasses.replace(default, max_num_batched_tokens=chunk)
        try:
            r = bench_prefill(llm, hf, cfg["vocab_size"], device, batch, length, num_params, cfg,
                              ceil["matmul_tflops"])  # fmt: skip
        except torch.OutOfMemoryError as exc:
            r = {"error": str(exc)[:200]}
        r |= {"batch": batch, "length": length, "chunk": chunk}
        results["prefill"].append(r)
        print("prefill", r, flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2))
    llm.engine.scheduler.config = default
    print(summary(results))


def summary(results: dict) -> str:
    lines = [f"device {results['device']}  sha {results['git_sha']}  matmul "
             f"{results['ceilings']['matmul_tflops']:.0f} TFLOP/s",
             f"{'prompt':>10s} {'chunk':>6s} {'ours tok/s':>11s} {'HF tok/s':>10s} {'ours MFU':>8s} {'HF MFU':>7s} "
             f"{'ours/HF':>7s}"]  # fmt: skip
    for r in results["prefill"]:
        if "error" in r:
            lines.append(f"{r['batch']}x{r['length']:<8d} {r['chunk']:6d} {r['error']}")
            continue
        lines.append(
            f"{r['batch']}x{r['length']:<8d} {r['chunk']:6d} {r['ours_tok_s']:11.0f} {r['hf_tok_s']:10.0f} "
            f"{r['ours_mfu']:8.2f} {r['hf_mfu']:7.2f} {r['ratio_ours_over_hf']:7.2f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
