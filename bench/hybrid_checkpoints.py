"""Sparse recurrent-state checkpoints through the real engine: tokens recomputed and TTFT per policy and budget.

A Qwen3.5-shaped hybrid with random weights (`load_format="dummy"`) serves the request streams that
bench/checkpoint_placement.py replays (essay_questions: documents + questions; system_prompts: system prompt +
user turn) plus a synthetic `long_suffix` stream (a shared prefix, then a long unique suffix: where `last`, the
vLLM-like policy, never hits). Requests run one at a time, as the simulator replays them; every policy gets the
same KV cache and the same state memory: `--num-entries` × M checkpoints at M checkpoints per entry. Reported
per (stream, policy, M): prompt tokens recomputed per request (a no-cache run computes all of them), the
token-savings factor, the share of requests that resumed at depth > 0, and mean / median TTFT.

    python bench/hybrid_checkpoints.py                      # CPU, small: a 4-layer model, prefixes cut short
    python bench/hybrid_checkpoints.py --gpu                # H200: Qwen3.5 9B shape, bf16, plus the GPU part

The GPU part (`--gpu`, fla-core installed for both sides) also runs, side by side with transformers on the
same random bf16 weights: prefill tokens/s, decode tokens/s at batch 1 and 32, and the cost of capturing a
checkpoint (ms per extra chunk boundary, bytes per checkpoint).
Results: bench/results/hybrid_checkpoints-<sha>-<cpu|h200>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from provenance import git_sha  # bench/provenance.py, beside this file

import minipic_lite as mp
from minipic_lite.checkpoints import streams
from minipic_lite.config import DEFAULT_CHECKPOINT_PRIOR

POLICIES = ("none", "last", "block", "balanced", "logarithmic", "sqrt", "dp")
BUDGETS = (1, 2, 4, 8)
RESULTS_DIR = Path(__file__).parent / "results"
SMOLLM2_VOCAB = 49_152  # the streams are tokenized with SmolLM2's tokenizer
SMOLLM2_TURN_START_ID = 1  # its `<|im_start|>` (the model directory here has no tokenizer to read it from)
# CPU: a small hybrid (3 linear : 1 full attention) that keeps the 2-core run in minutes
CPU_SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, linear_key_head_dim=32, linear_value_head_dim=32,
                 linear_num_key_heads=2, linear_num_value_heads=4)  # fmt: skip
GPU_SHAPE = {}  # transformers' Qwen3_5TextConfig defaults: the Qwen3.5-9B shape (32 layers, hidden 4096)


@dataclass
class Row:
    stream: str
    policy: str
    budget: int
    num_requests: int
    prompt_tokens_per_request: float
    recomputed_per_request: float
    savings_factor: float
    resumed_fraction: float
    ttft_mean_ms: float
    ttft_median_ms: float
    checkpoints_saved: int
    state_memory_mib: float


def hybrid_config(shape: dict, vocab_size: int, max_len: int, num_layers: int = 0):
    """The hybrid's `Qwen3_5TextConfig`, cut to its first `num_layers` layers (0: all)."""
    from transformers import Qwen3_5TextConfig

    config = Qwen3_5TextConfig(vocab_size=vocab_size, max_position_embeddings=max_len, **shape)
    if num_layers:
        config.num_hidden_layers = num_layers
        config.layer_types = config.layer_types[:num_layers]
    return config


def write_config(path: Path, shape: dict, vocab_size: int, max_len: int, num_layers: int = 0) -> Path:
    """A config.json of the hybrid (the weights are random: load_format="dummy")."""
    hybrid_config(shape, vocab_size, max_len, num_layers).save_pretrained(path)
    return path


# -- the streams ----------------------------------------------------------------------------------------------


def truncated_streams(spec: streams.StreamSpec, max_prefix_chars: int | None) -> dict[str, list[list[int]]]:
    """The placement bench's streams, with each shared prefix (essay, system prompt) cut to `max_prefix_chars`."""
    load_essays, load_prompts = streams.load_essays, streams.load_system_prompts
    if max_prefix_chars:  # NOTE: the stream builders read these module functions: cut the texts they return
        streams.load_essays = lambda: {k: v[:max_prefix_chars] for k, v in load_essays().items()}
        streams.load_system_prompts = lambda: {k: v[:max_prefix_chars] for k, v in load_prompts().items()}
    try:
        tokenizer = streams.load_tokenizer()
        return {name: streams.tokenize(make(spec), tokenizer) for name, make in streams.STREAMS.items()}
    finally:
        streams.load_essays, streams.load_system_prompts = load_essays, load_prompts


def long_suffix_stream(num_requests: int, prefix_len: int, suffix_len: int, num_prefixes: int = 2, seed: int = 0):
    """A few shared prefixes, each request followed by its own long suffix (longer than a block of the plan)."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [torch.randint(0, SMOLLM2_VOCAB, (prefix_len,), generator=g).tolist() for _ in range(num_prefixes)]
    return [prefixes[i % num_prefixes] + torch.randint(0, SMOLLM2_VOCAB, (suffix_len,), generator=g).tolist()
            for i in range(num_requests)]  # fmt: skip


def request_streams(args) -> dict[str, list[list[int]]]:
    """The request streams as token ids: read from `--streams` when that file exists, else built (which needs the
    texts and SmolLM2's tokenizer, absent on the GPU machine) and written there when `--streams` is given."""
    if args.streams and args.streams.exists():
        return json.loads(args.streams.read_text())
    spec = streams.StreamSpec(num_requests=args.num_requests, num_prefixes=args.num_prefixes)
    built = truncated_streams(spec, args.max_prefix_chars or None)
    built["long_suffix"] = long_suffix_stream(args.num_requests // 2, prefix_len=384, suffix_len=256)
    if args.streams:
        args.streams.parent.mkdir(parents=True, exist_ok=True)
        args.streams.write_text(json.dumps(built))
        print(f"wrote {args.streams} ({', '.join(f'{k}: {len(v)}' for k, v in built.items())} requests)")
    return built


# -- token savings through the engine ---------------------------------------------------------------------------


def run_policy(model_dir, requests, policy, budget, args) -> tuple[list[int], list[float], dict]:
    # NOTE: equal state memory for every policy: room for exactly num_entries × M checkpoints
    state_cache_gib = (args.num_entries * budget + 0.5) * args.checkpoint_bytes / 2**30
    llm = mp.LLM(
        str(model_dir), device=args.device, load_format="dummy", num_blocks=args.num_blocks,
        max_model_len=args.max_len, max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=4,
        checkpoint_policy=policy, checkpoints_per_entry=budget, state_cache_gib=state_cache_gib,
        state_eviction=args.eviction, checkpoint_prior=args.prior,
        checkpoint_turn_start_id=None if args.no_turns else SMOLLM2_TURN_START_ID,
    )  # fmt: skip
    engine = llm.engine
    assert engine.kv.states.num_checkpoints == args.num_entries * budget
    params = mp.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    recomputed, ttfts = [], []
    for token_ids in requests:
        req = engine.make_request(token_ids, params)
        engine.add(req)
        start = time.perf_counter()
        while not req.is_finished:
            engine.step()
        sync(args.device)
        ttfts.append(time.perf_counter() - start)
        recomputed.append(len(token_ids) - req.num_resumed_tokens)
    states = engine.kv.states
    assert states.num_used_bytes <= states.budget_bytes
    return recomputed, ttfts, engine.cache_stats()


def checkpoint_bytes(model_dir, args) -> int:
    llm = mp.LLM(str(model_dir), device=args.device, load_format="dummy", num_blocks=args.num_blocks,
                 max_model_len=args.max_len, max_num_seqs=1, state_cache_gib=0.0)  # fmt: skip
    return llm.engine.runner.state_tensors.checkpoint_bytes


def resumed_share(recomputed: list[int], lengths: list[int]) -> float:
    return sum(r < n for r, n in zip(recomputed, lengths, strict=True)) / len(lengths)


def make_row(stream: str, policy: str, budget: int, lengths, recomputed, ttfts, stats: dict) -> Row:
    """A row from each request's prompt length, tokens recomputed and TTFT (s), and the engine's cache stats."""
    return Row(
        stream, policy, budget, len(lengths), statistics.mean(lengths), statistics.mean(recomputed),
        sum(lengths) / max(sum(recomputed), 1), resumed_share(recomputed, lengths),
        1e3 * statistics.mean(ttfts), 1e3 * statistics.median(ttfts),
        stats.get("num_checkpoints_saved", 0), stats.get("state_memory_bytes", 0) / 2**20,
    )  # fmt: skip


def savings_rows(model_dir, stream_requests, args) -> list[Row]:
    rows = []
    for stream, requests in stream_requests.items():
        lengths = [len(r) for r in requests]
        for policy in args.policies:
            for budget in args.budgets if policy != "none" else args.budgets[:1]:
                recomputed, ttfts, stats = run_policy(model_dir, requests, policy, budget, args)
                row = make_row(stream, policy, budget, lengths, recomputed, ttfts, stats)
                print(f"{stream:16} {policy:12} M={budget}: recomputed/request {row.recomputed_per_request:8.1f}  "
                      f"factor {row.savings_factor:5.2f}  resumed {row.resumed_fraction:4.0%}  "
                      f"TTFT {row.ttft_mean_ms:7.1f} ms", flush=True)  # fmt: skip
                rows.append(row)
    return rows


# -- GPU: the engine vs transformers on the same weights --------------------------------------------------------


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def side_by_side(args) -> dict:
    """Prefill and decode tokens/s of ours vs transformers (same random weights), and capture cost.

    On the H200 (`--gpu`): the 9B shape in bf16. `--side-by-side` on the CPU runs the same code on the small
    shape in fp32 (a smoke test of this part, not a measurement)."""
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(0)
    shape, dtype = (GPU_SHAPE, torch.bfloat16) if args.gpu else (CPU_SHAPE, torch.float32)
    config = hybrid_config(shape, args.vocab_size, args.max_len, args.num_layers)
    with torch.device(args.device):
        hf = Qwen3_5ForCausalLM(config).to(dtype).eval()
    with tempfile.TemporaryDirectory(prefix="hybrid_bench_") as tmp:  # NOTE: the weights are read once, here
        hf.save_pretrained(tmp)
        # NOTE: a budget that holds the 4 prompts: one step, as transformers runs them in one batched forward
        llm = mp.LLM(tmp, device=args.device, dtype=str(dtype).removeprefix("torch."), max_model_len=args.max_len,
                     checkpoint_policy="none", max_num_batched_tokens=max(4 * args.prefill_len, 2048))  # fmt: skip
    engine, out = llm.engine, {}
    prompt_len = args.prefill_len
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, args.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(4)]
    out["prefill"] = {"ours_tok_s": engine_prefill(engine, prompts), "hf_tok_s": hf_prefill(hf, prompts, args.device)}
    for batch in (1, 32):
        short = [p[:512] for p in (prompts * 8)[:batch]]
        out[f"decode_b{batch}"] = {"ours_tok_s": engine_decode(llm, short, args.decode_tokens),
                                   "hf_tok_s": hf_decode(hf, short, args.decode_tokens, args.device)}  # fmt: skip
    out["capture"] = capture_cost(engine, prompts[0])
    if args.profile:  # where each side's prefill time goes, for the gap issue 11 measured
        mark_phases(engine)
        out["profile"] = {
            "ours": top_kernels(lambda: engine_prefill(engine, prompts, warm_up=False), args.device),
            "hf": top_kernels(lambda: hf_prefill(hf, prompts, args.device, warm_up=False), args.device),
        }
    print(json.dumps(out, indent=1))
    return out


def top_kernels(run, device: str, num: int = 15) -> dict:
    """The wall time of `run()` under the profiler, the busy time of the device (kernels summed; CPU: ops) and
    the kernels (or ops) that took the most: (name, calls, self ms)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        start = time.perf_counter()
        run()
        wall_ms = 1e3 * (time.perf_counter() - start)
    from torch.autograd import DeviceType

    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: -getattr(e, key))
    host = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)  # where the host's time goes (syncs)
    # NOTE: on CUDA an op's entry holds its kernels' time again: busy and the count sum the kernels' entries only
    # (the results up to 4a3495f summed both: about twice the kernels' time)
    own = [e for e in events if not cuda or (e.device_type == DeviceType.CUDA and not e.key.startswith("phase:"))]
    return {"wall_ms": wall_ms, "busy_ms": sum(getattr(e, key) for e in own) / 1e3,
            "num_kernels": sum(e.count for e in own if getattr(e, key) > 0),
            "top": [(e.key[:90], e.count, getattr(e, key) / 1e3) for e in events[:num]],
            "host_top": [(e.key[:90], e.count, e.self_cpu_time_total / 1e3) for e in host[:num]],
            **(timeline(prof.events()) if cuda else {})}  # fmt: skip


def timeline(events, num_gaps: int = 8) -> dict:
    """Where the device sat idle: its kernels' busy time (union of their intervals) beside their span, the
    longest gaps between kernels (start ms from the first host event, length, kernels either side), and the
    host phases marked with `record_function("phase:...")`, so a gap can be read against what the host did."""
    from torch.autograd import DeviceType

    origin = min(e.time_range.start for e in events)
    # NOTE: the profiler copies each record_function range onto the device's timeline too: not a kernel
    kernels = sorted((e for e in events if e.device_type == DeviceType.CUDA and not e.name.startswith("phase:")),
                     key=lambda e: e.time_range.start)  # fmt: skip
    busy, gaps, end, last = 0.0, [], None, None
    for k in kernels:
        start, stop = k.time_range.start, k.time_range.end
        if end is not None and start > end:
            gaps.append(((start - end) / 1e3, (end - origin) / 1e3, last.name[:40], k.name[:40]))
        busy += max(0.0, stop - max(start, end or start))
        if end is None or stop > end:
            end, last = stop, k
    phases = [(e.name, (e.time_range.start - origin) / 1e3, (e.time_range.end - e.time_range.start) / 1e3)
              for e in events if e.name.startswith("phase:")]  # fmt: skip
    return {"kernel_busy_ms": busy / 1e3,
            "kernel_span_ms": (end - kernels[0].time_range.start) / 1e3 if kernels else 0.0,
            "first_kernel_ms": (kernels[0].time_range.start - origin) / 1e3 if kernels else 0.0,
            "idle_gaps": [dict(zip(("ms", "at_ms", "after", "before"), g, strict=True))
                          for g in sorted(gaps, reverse=True)[:num_gaps]],
            "phases": sorted(phases, key=lambda p: p[1])[:40]}  # fmt: skip


def mark_phases(engine) -> None:
    """Wrap the engine's host phases in profiler ranges (phase:add, phase:schedule, ...), for `timeline`."""

    def wrap(obj, name: str, label: str) -> None:
        fn = getattr(obj, name)

        def marked(*args, **kwargs):
            with torch.profiler.record_function(f"phase:{label}"):
                return fn(*args, **kwargs)

        setattr(obj, name, marked)

    wrap(engine, "add_request", "add")
    wrap(engine.scheduler, "schedule", "schedule")
    wrap(engine.runner, "prepare", "prepare")
    wrap(engine.runner.model, "forward", "forward")
    wrap(engine.runner, "launch", "launch")
    wrap(engine.runner, "wait", "wait")
    wrap(engine.scheduler, "postprocess", "postprocess")


def engine_prefill(engine, prompts, warm_up: bool = True) -> float:
    params = mp.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.pool.reset_prefix_cache()
    for prompt in prompts if warm_up else []:  # the timed step's shape, first
        engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    engine.pool.reset_prefix_cache()
    sync(engine.runner.device.type)
    start = time.perf_counter()
    for prompt in prompts:
        engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    sync(engine.runner.device.type)
    return sum(map(len, prompts)) / (time.perf_counter() - start)


@torch.inference_mode()
def hf_prefill(hf, prompts, device: str, warm_up: bool = True) -> float:
    """The prompts (of one length) as one batch in one forward, as the engine runs them in one step."""
    batch = torch.tensor(prompts, device=device)
    if warm_up:
        hf(batch, logits_to_keep=1)
    sync(device)
    start = time.perf_counter()
    hf(batch, logits_to_keep=1)
    sync(device)
    return batch.numel() / (time.perf_counter() - start)


def engine_decode(llm, prompts, num_tokens: int) -> float:
    params = mp.SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:1], mp.SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    ttft = max(o.metrics.ttft for o in outs)
    return sum(len(o.token_ids) - 1 for o in outs) / (elapsed - ttft)


@torch.inference_mode()
def hf_decode(hf, prompts, num_tokens: int, device: str) -> float:
    ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(ids)
    kwargs = dict(attention_mask=mask, do_sample=False, eos_token_id=None, pad_token_id=0)
    hf.generate(ids, max_new_tokens=4, **kwargs)  # warm-up at the measured batch size
    sync(device)
    first = float("inf")
    for _ in range(2):  # the prefill alone (one new token), subtracted below: the least disturbed of two
        start = time.perf_counter()
        hf.generate(ids, max_new_tokens=1, **kwargs)
        sync(device)
        first = min(first, time.perf_counter() - start)
    start = time.perf_counter()
    hf.generate(ids, max_new_tokens=num_tokens, **kwargs)
    sync(device)
    return len(prompts) * (num_tokens - 1) / (time.perf_counter() - start - first)


def capture_cost(engine, prompt) -> dict:
    """An extra chunk boundary per checkpoint (the whole cost of capturing in the same pass) and its bytes."""

    def prefill(positions) -> float:
        engine.pool.reset_prefix_cache()
        engine.kv.states.reset()
        req = engine.make_request(prompt, mp.SamplingParams(max_tokens=1))
        req.checkpoint_positions = positions
        sync(engine.runner.device.type)
        start = time.perf_counter()
        engine.add(req)
        while not req.is_finished:
            engine.step()
        sync(engine.runner.device.type)
        return time.perf_counter() - start

    block = engine.config.cache.block_size
    positions = [len(prompt) * i // 8 // block * block for i in range(1, 8)]
    prefill([]), prefill(positions)  # warm-up
    plain = statistics.median(prefill([]) for _ in range(3))
    cut = statistics.median(prefill(positions) for _ in range(3))
    return {"ms_per_checkpoint": 1e3 * (cut - plain) / len(positions), "bytes_per_checkpoint":
            engine.runner.state_tensors.checkpoint_bytes, "prompt_len": len(prompt)}  # fmt: skip


# -- report ---------------------------------------------------------------------------------------------------


def report(rows: list[Row], args, sha: str, extra: dict) -> str:
    lines = [f"# hybrid checkpoints through the engine ({sha}, {args.device})", "",
             f"args: {json.dumps({k: str(v) for k, v in vars(args).items()})}", ""]  # fmt: skip
    for stream in dict.fromkeys(r.stream for r in rows):
        of = [r for r in rows if r.stream == stream]
        lines += [f"## {stream}: {of[0].num_requests} requests, {of[0].prompt_tokens_per_request:.0f} prompt tokens "
                  "per request", "", "prompt tokens recomputed per request (TTFT mean, ms; share of requests resumed)",
                  "", "| policy | " + " | ".join(f"M={m}" for m in args.budgets) + " |",
                  "|---" * (len(args.budgets) + 1) + "|"]  # fmt: skip
        for policy in args.policies:
            cells = []
            for m in args.budgets:
                budget = args.budgets[0] if policy == "none" else m  # NOTE: `none` runs once
                row = next(r for r in of if r.policy == policy and r.budget == budget)
                cells.append(
                    f"{row.recomputed_per_request:.0f} ({row.ttft_mean_ms:.0f} ms; {row.resumed_fraction:.0%})"
                )
            lines.append(f"| {policy} | " + " | ".join(cells) + " |")
        best = {m: min((r for r in of if r.budget == m or r.policy == "none"), key=lambda r: r.recomputed_per_request)
                for m in args.budgets}  # fmt: skip
        if "dp" in args.policies and len(args.policies) > 1:
            dp_wins = all(next(r for r in of if r.policy == "dp" and r.budget == m).recomputed_per_request
                          <= best[m].recomputed_per_request + 1e-9 for m in args.budgets)  # fmt: skip
            lines += ["", f"dp <= every other policy at every budget: {dp_wins}"]
        lines += [""]
    if extra:
        lines += ["## GPU side by side", "", "```", json.dumps(extra, indent=1), "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="H200: the 9B shape in bf16, plus the GPU side by side")
    parser.add_argument("--num-requests", type=int, default=None, help="per stream (default: 24; GPU: 100)")
    parser.add_argument("--num-prefixes", type=int, default=4)
    parser.add_argument("--num-entries", type=int, default=4, help="state memory = num_entries x M checkpoints")
    parser.add_argument("--max-prefix-chars", type=int, default=2_000, help="cut shared prefixes (0: keep whole)")
    parser.add_argument("--max-len", type=int, default=None, help="context; longer prompts keep their first "
                        "max_len - 1 tokens (default: 4,096 on the CPU, 32,768 on the GPU)")  # fmt: skip
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--eviction", default="lru", choices=("lru", "flops"), help="the store's eviction")
    parser.add_argument("--num-layers", type=int, default=0, help="GPU: fewer layers of the 9B shape (0: all)")
    parser.add_argument("--prefill-len", type=int, default=None, help="tokens per prompt of the side by side "
                        "(default: 4096 on the GPU, 256 on the CPU, whose context is 4,096)")  # fmt: skip
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--side-by-side", action="store_true", help="CPU: smoke-test the GPU part on the small shape")
    parser.add_argument("--skip-savings", action="store_true", help="only the side by side part")
    parser.add_argument("--profile", action="store_true", help="side by side: also the top kernels of one prefill")
    parser.add_argument("--rerender", type=Path, help="only write the report again from a result .json")
    parser.add_argument(
        "--streams",
        type=Path,
        help="request streams as token ids: read if present, else written "
        "(the GPU machine has no texts: build with --build-streams-only here, carry bench/data)",
    )
    parser.add_argument("--stream-names", nargs="+", help="only these streams (default: all)")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--prior", default=DEFAULT_CHECKPOINT_PRIOR, help="what dp plans with before any traffic")
    parser.add_argument("--no-turns", action="store_true", help="dp's prior ignores the streams' chat turns")
    parser.add_argument("--build-streams-only", action="store_true", help="write --streams and stop")
    args = parser.parse_args()
    if args.rerender:
        payload = json.loads(args.rerender.read_text())
        args.budgets, args.device = json.loads(payload["args"]["budgets"]), payload["args"]["device"]
        args.eviction = payload["args"].get("eviction", "lru")
        present = {r["policy"] for r in payload["rows"]}  # NOTE: a run may have measured only some policies
        args.policies = [p for p in POLICIES if p in present]
        sha = args.rerender.stem.split("-")[1]
        text = report([Row(**r) for r in payload["rows"]], args, sha, payload["gpu"])
        args.rerender.with_suffix(".md").write_text(text)
        print(text)
        return
    args.device = "cuda" if args.gpu else "cpu"
    args.vocab_size = SMOLLM2_VOCAB
    args.max_len = args.max_len or (32_768 if args.gpu else 4_096)
    args.num_blocks = args.max_len // 4  # NOTE: KV blocks of 16 tokens for 4 prompts of max_len (1,024 / 8,192)
    args.max_num_batched_tokens = 8_192 if args.gpu else 2_048
    args.prefill_len = args.prefill_len or (4_096 if args.gpu else 256)
    if args.gpu:
        args.max_prefix_chars = 0
    args.num_requests = args.num_requests or (100 if args.gpu else 24)

    stream_requests = {}
    if not args.skip_savings or args.build_streams_only:
        stream_requests = request_streams(args)
        if args.build_streams_only:
            return
        wanted = args.stream_names or list(stream_requests)
        stream_requests = {k: [r[: args.max_len - 1] for r in stream_requests[k]][: args.num_requests] for k in wanted}
    with tempfile.TemporaryDirectory() as tmp:
        shape = GPU_SHAPE if args.gpu else CPU_SHAPE
        model_dir = write_config(Path(tmp), shape, args.vocab_size, args.max_len, args.num_layers)
        args.checkpoint_bytes = checkpoint_bytes(model_dir, args)
        rows = [] if args.skip_savings else savings_rows(model_dir, stream_requests, args)
    extra = side_by_side(args) if args.gpu or args.side_by_side else {}
    sha = git_sha()
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.eviction == "lru" else f"-{args.eviction}"
    stem = args.out / f"hybrid_checkpoints-{sha}-{'h200' if args.gpu else 'cpu'}{suffix}"
    text = report(rows, args, sha, extra)
    stem.with_suffix(".md").write_text(text)
    payload = {"rows": [asdict(r) for r in rows], "gpu": extra, "args": {k: str(v) for k, v in vars(args).items()}}
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    print(text)
    print(f"wrote {stem}.md/.json")


if __name__ == "__main__":
    main()
