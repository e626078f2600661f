"""The op on a short prefill over a long cached context (the step of a RAG prompt whose documents hit), on the GPU.

Llama-3-8B heads (32 query, 8 kv, d128), bf16, position-free with the bf16 cos/sin table as the engine passes it,
keys on shuffled paged blocks. For each (sequences x new tokens, context): the op with pick_config's choice, the
choice before short prefills had their own rule (SHORT_PREFILL_ROWS = 16: the dense, gathered path on Hopper),
and a sweep of short-prefill configs (at 8k and 32k); each checked against the torch path, timed as CUDA-graph replays
(bench/gpu_ops.py's Clock). The floor: K and V read once at the copy bandwidth measured in the same run.

    python bench/gpu_short_prefill.py [--smoke]      # results: bench/results/gpu_short_prefill_<sha>_<gpu>.json
    python bench/gpu_short_prefill.py --splits       # only the split-count sweep, 16k and 32k (..._splits.json)
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_ops import Clock  # noqa: E402
from provenance import git_sha  # noqa: E402

from ops import triton_kernel  # noqa: E402
from ops.testing import SeqSpec, make_problem  # noqa: E402
from ops.torch_impl import rope_paged_attention_torch  # noqa: E402

HEADS = dict(num_heads=32, num_kv_heads=8, head_dim=128)
CASES = [(1, 17), (1, 32), (1, 64), (2, 32), (8, 16)]  # (sequences, new tokens each)
CONTEXTS = [2048, 8192, 16384, 32768]
SWEEP_CONTEXTS = (8192, 32768)  # the config sweep runs at these contexts only (each config compiles once per split)
SWEEP = [
    dict(BLOCK_M=m, TILE_N=n, num_warps=w, num_stages=st)
    for m, n, w, st in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3))
]
# split-KV programs per query tile, past pick_config's 32 (the cached 8 x 2048 TTFT's read: 17 tokens over 16.5k keys)
SPLIT_CASES, SPLIT_CONTEXTS = [(1, 17), (2, 32)], (16384, 32768)
SPLIT_SWEEP = [dict(NUM_SPLITS=sp, TILE_N=n, num_warps=w)
               for sp, n, w in itertools.product((16, 32, 64, 128), (32, 64), (4, 8))]  # fmt: skip


def problem(num_seqs: int, new_tokens: int, context: int, device, block_size: int = 16):
    specs = [SeqSpec(context, ((context - new_tokens, context),)) for _ in range(num_seqs)]
    p = make_problem(specs, HEADS["num_heads"], HEADS["num_kv_heads"], HEADS["head_dim"], block_size, torch.bfloat16,
                     device=device, seed=context + new_tokens)  # fmt: skip
    args = list(p.args())
    args[8] = args[8].to(torch.bfloat16)  # the engine's table dtype
    return args


def config_for(args, short_rows: int) -> dict:
    with mock.patch.object(triton_kernel, "SHORT_PREFILL_ROWS", short_rows):
        return triton_kernel.config_for_args(args[0], args[1], args[3], args[8])


def with_splits(config: dict, num_seqs: int, context: int, device) -> dict:
    """A sweep entry's PROGRAMS_PER_SM (not a kernel key) as NUM_SPLITS: pick_config's flash-decoding rule with
    that many programs per SM in place of its 4."""
    per_sm = config.pop("PROGRAMS_PER_SM", None)
    if per_sm is not None:
        num_programs = per_sm * triton_kernel._num_sms(device.index or 0)
        config["NUM_SPLITS"] = triton_kernel.splits_to_fill(num_programs, num_seqs * HEADS["num_kv_heads"], context)
    return config


def copy_bandwidth(clock: Clock, device) -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = clock(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3)  # bytes/s, read + write


def measure_case(num_seqs: int, new_tokens: int, context: int, clock, bandwidth: float, sweep, device) -> dict:
    args = problem(num_seqs, new_tokens, context, device)
    expected = rope_paged_attention_torch(*args).float()

    def run(config):
        return triton_kernel.rope_paged_attention_triton(*args, config=config)

    def timed(config) -> dict:
        err = (run(config).float() - expected).abs().max().item()
        return dict(ms=clock(lambda: run(config)), max_err=err)

    row = dict(num_seqs=num_seqs, new_tokens=new_tokens, context=context)
    kv_bytes = 2 * num_seqs * context * HEADS["num_kv_heads"] * HEADS["head_dim"] * 2
    row["floor_ms"] = kv_bytes / bandwidth * 1e3  # K and V read once at the copy's rate (read + write bytes)
    for name, short_rows in (("before", 16), ("default", triton_kernel.SHORT_PREFILL_ROWS)):
        config = config_for(args, short_rows)
        row[name] = dict(config=config, **timed(config))
    row["sweep"] = []
    for extra in sweep:
        try:
            config = with_splits({**row["default"]["config"], **extra}, num_seqs, context, device)
            row["sweep"].append(dict(config=extra, splits=config["NUM_SPLITS"], **timed(config)))
        except Exception as exc:  # noqa: BLE001 -- a config may not fit (shared memory, registers)
            row["sweep"].append(dict(config=extra, error=f"{type(exc).__name__}: {str(exc)[:200]}"))
    row["best"] = min((e for e in row["sweep"] if "ms" in e), key=lambda e: e["ms"], default=None)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="one small case, wall-clock timing")
    parser.add_argument("--splits", action="store_true", help="only the split-count sweep (SPLIT_SWEEP)")
    parser.add_argument("--regs", action="store_true", help="every case beside the 4-warp config without a register "
                        "cap (the short read's default before MAX_REGS) only (..._regs.json)")  # fmt: skip
    parser.add_argument("--sweep-json", help="a JSON list of config overrides timed beside the default at every case "
                        "(..._sweep.json)")  # fmt: skip
    parser.add_argument("--cases", help="SEQSxTOKENS,... in place of CASES, e.g. 1x16,1x17")
    parser.add_argument("--contexts", help="keys,... in place of CONTEXTS, e.g. 16384")
    parser.add_argument("--tag", default="", help="appended to the result file name")
    args_ = parser.parse_args()
    device = torch.device("cuda")
    clock = Clock(args_.smoke)
    bandwidth = copy_bandwidth(clock, device)
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    rows = []
    cases = [(1, 17)] if args_.smoke else SPLIT_CASES if args_.splits else CASES
    contexts = [2048] if args_.smoke else SPLIT_CONTEXTS if args_.splits else CONTEXTS
    if args_.cases:
        cases = [tuple(int(x) for x in case.split("x")) for case in args_.cases.split(",")]
    if args_.contexts:
        contexts = [int(x) for x in args_.contexts.split(",")]
    for (num_seqs, new_tokens), context in itertools.product(cases, contexts):
        sweep = SWEEP if context in SWEEP_CONTEXTS and not args_.smoke else []
        sweep = SPLIT_SWEEP if args_.splits else [dict(num_warps=4, MAX_REGS=None)] if args_.regs else sweep
        sweep = json.loads(args_.sweep_json) if args_.sweep_json else sweep
        row = measure_case(num_seqs, new_tokens, context, clock, bandwidth, sweep, device)
        rows.append(row)
        best = row["best"] or {"ms": float("nan"), "config": ""}
        print(
            f"{num_seqs} x {new_tokens:>3} over {context:>6}: before {row['before']['ms']:.4f} ms, default "
            f"{row['default']['ms']:.4f} ms (err {row['default']['max_err']:.2e}), best swept "
            f"{best['ms']:.4f} ms {best['config']}, floor {row['floor_ms']:.4f}",
            flush=True,
        )
    sha = git_sha()
    gpu = torch.cuda.get_device_name().split()[-1].lower()
    tag = "_splits" if args_.splits else "_regs" if args_.regs else "_sweep" if args_.sweep_json else ""
    out = Path(__file__).parent / "results" / f"gpu_short_prefill_{sha}_{gpu}{tag}{args_.tag}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(dict(git_sha=sha, device=torch.cuda.get_device_name(), copy_bandwidth=bandwidth,
                                   heads=HEADS, rows=rows), indent=2) + "\n")  # fmt: skip
    print(f"saved {out}")


if __name__ == "__main__":
    main()
