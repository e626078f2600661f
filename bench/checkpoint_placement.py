"""Sparse checkpoint placement on replayed real-text streams: tokens saved per policy and budget.

For each stream (essay_questions: QuALITY-like; system_prompts: System-Prompts-like) and budget M, every
policy replays the same requests against the same bounded LRU cache (see minipic_lite/checkpoints/simulator.py)
and we report the token-savings factor (tokens a no-cache run computes / tokens recomputed) and the
checkpoints saved per request. The DP policies learn their overlap distribution online from the stream:

    dp | global   one depth histogram for all entries (the plain DP)
    dp | length   conditioned on the entry's length (distance-from-the-end histogram)
    dp | entry    conditioned on the entry itself (history of common prefixes + its own request): "dp"

Also timed: the O(NM) DP for N = 2,048 bins x M = 64. Results go to bench/results/ as
checkpoint_placement-<git sha>.{md,json,png}.

    python bench/checkpoint_placement.py [--num-requests 400] [--num-entries 32] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from provenance import git_sha  # bench/provenance.py, beside this file

from minipic_lite.checkpoints import (
    DEFAULT_BIN_SIZE,
    DepthHistogram,
    EntryHistory,
    Planner,
    SuffixHistogram,
    dp_fast,
    dp_hull,
    dp_reference,
    simulate,
)
from minipic_lite.checkpoints.streams import STREAMS, StreamSpec, load_tokenizer, tokenize

BUDGETS = (1, 2, 4, 8, 16, 32)
BASELINES = ("none", "kv_only", "block", "balanced", "logarithmic", "sqrt")
DP_VARIANTS = {"dp | global": DepthHistogram, "dp | length": SuffixHistogram, "dp | entry": EntryHistory}
CEILING = "every bin"  # a checkpoint at every aligned position: the most any placement can save
TIMING_BINS, TIMING_BUDGET = 2_048, 64
RESULTS_DIR = Path(__file__).parent / "results"


@dataclass
class Row:
    stream: str
    policy: str
    budget: int
    factor: float  # all requests
    steady_factor: float  # requests after the warm-up
    checkpoints_per_request: float
    seconds: float


def make_planner(policy: str, budget: int, bin_size: int) -> Planner:
    if policy == CEILING:
        return Planner("balanced", 1 << 30, bin_size=bin_size)
    if policy in DP_VARIANTS:
        return Planner("dp", budget, DP_VARIANTS[policy](), bin_size=bin_size)
    return Planner(policy, budget, bin_size=bin_size)


def run_stream(name, requests, args) -> list[Row]:
    lengths = np.array([len(r) for r in requests])
    warmup = int(len(requests) * args.warmup_fraction)
    rows = []
    for policy in (*BASELINES, *DP_VARIANTS, CEILING):
        for budget in args.budgets if policy != CEILING else args.budgets[:1]:
            start = time.perf_counter()
            result = simulate(requests, make_planner(policy, budget, args.bin_size), num_entries=args.num_entries)
            steady = steady_factor(lengths, result.recomputed_per_request, warmup)
            rows.append(
                Row(
                    name,
                    policy,
                    budget,
                    result.savings_factor,
                    float(steady),
                    result.checkpoints_per_request,
                    time.perf_counter() - start,
                )
            )
        print(f"  {name:16s} {policy:12s} " + " ".join(f"{r.factor:6.3f}" for r in rows if r.policy == policy))
    return rows


def steady_factor(lengths, recomputed, warmup: int) -> float:
    """The token-savings factor of the requests after the first `warmup`: their tokens over those recomputed."""
    return np.asarray(lengths)[warmup:].sum() / np.asarray(recomputed)[warmup:].sum()


def time_dp(repeats: int = 20) -> dict:
    """DP wall and CPU time (medians) at N = 2,048 bins x M = 64 on three masses; the reference on a small one.

    CPU time is reported beside wall time because the bench machine may be shared (see the load average).
    """
    rng = np.random.default_rng(0)
    depth = np.arange(TIMING_BINS + 1)
    masses = {
        "random": rng.random(TIMING_BINS + 1),
        "spiky": np.where(rng.random(TIMING_BINS + 1) < 0.05, rng.random(TIMING_BINS + 1), 0.0),
        "deep-skewed": 0.995 ** (TIMING_BINS - depth),
    }
    timings = {"load_average_1min": os.getloadavg()[0], "cpu_count": os.cpu_count()}
    for label, weights in masses.items():
        wall, cpu = [], []
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            dp_fast(weights, TIMING_BUDGET)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        start = time.perf_counter()
        dp_hull(weights, TIMING_BUDGET)
        timings[label] = {
            "fast_wall_ms": 1e3 * float(np.median(wall)),
            "fast_cpu_ms": 1e3 * float(np.median(cpu)),
            "hull_wall_ms": 1e3 * (time.perf_counter() - start),
        }
    start = time.perf_counter()
    dp_reference(masses["random"][:257], 8)
    timings["reference_wall_ms_256x8"] = 1e3 * (time.perf_counter() - start)
    return timings


def policies_of(rows):
    return [p for p in dict.fromkeys(r.policy for r in rows) if p != CEILING]


def ceiling_of(rows, stream) -> Row:
    return next(r for r in rows if r.stream == stream and r.policy == CEILING)


def table(rows, stream, budgets, field) -> list[str]:
    lines = ["| policy | " + " | ".join(f"M={m}" for m in budgets) + " |", "|---" * (len(budgets) + 1) + "|"]
    cells = {(r.policy, r.budget): r for r in rows if r.stream == stream}
    for policy in policies_of(rows):
        values = [cells[policy, m] for m in budgets]
        text = [f"{getattr(v, field):.3f} ({v.checkpoints_per_request:.1f})" for v in values]
        lines.append(f"| {policy} | " + " | ".join(text) + " |")
    ceiling = ceiling_of(rows, stream)
    lines += [
        "",
        f"Upper bound, a checkpoint at every aligned position ({ceiling.checkpoints_per_request:.0f} per "
        f"request): {getattr(ceiling, field):.3f}",
    ]
    return lines


def margins(rows, stream, budgets, field) -> list[float]:
    """dp | entry minus the best baseline, per budget."""
    cells = {(r.policy, r.budget): getattr(r, field) for r in rows if r.stream == stream}
    return [cells["dp | entry", m] - max(cells[b, m] for b in BASELINES) for m in budgets]


def report(rows, timings, args, sha, stream_stats) -> str:
    lines = [
        f"# Sparse checkpoint placement (git {sha}, {platform.processor() or platform.machine()}, CPU)",
        "",
        f"{args.num_requests} requests per stream (seed {args.seed}), LRU cache of {args.num_entries} entries, "
        f"checkpoints aligned to {args.bin_size} tokens. Cell: token-savings factor (checkpoints per request).",
        f"Steady state: requests after the first {args.warmup_fraction:.0%} (the estimators still learn from "
        "the first request on; only the counting starts later, for every policy alike).",
        "",
    ]
    for stream, stats in stream_stats.items():
        lines += [f"## {stream}: {stats}", ""]
        for field, title in (("factor", "all requests"), ("steady_factor", "steady state")):
            lines += [f"### {title}", "", *table(rows, stream, args.budgets, field), ""]
            diff = ", ".join(
                f"M={m}: {d:+.3f}"
                for m, d in zip(args.budgets, margins(rows, stream, args.budgets, field), strict=True)
            )
            lines += [f"dp | entry minus the best baseline ({title}): {diff}", ""]
    lines += [
        f"## DP run time, N = {TIMING_BINS} bins x M = {TIMING_BUDGET}",
        "",
        f"Load average {timings['load_average_1min']:.1f} on {timings['cpu_count']} cores while timing.",
        "",
        "| mass | dp_fast wall (median) | dp_fast CPU (median) | dp_hull wall (pure Python) |",
        "|---|---|---|---|",
    ]
    for label, value in timings.items():
        if isinstance(value, dict):
            lines.append(
                f"| {label} | {value['fast_wall_ms']:.1f} ms | {value['fast_cpu_ms']:.1f} ms | "
                f"{value['hull_wall_ms']:.0f} ms |"
            )
    lines += ["", f"dp_reference (O(N²M)) at N = 256 x M = 8: {timings['reference_wall_ms_256x8']:.0f} ms"]
    return "\n".join(lines) + "\n"


def plot(rows, path: Path, budgets) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = list(dict.fromkeys(r.stream for r in rows))
    fig, axes = plt.subplots(2, len(streams), figsize=(6 * len(streams), 9), squeeze=False)
    for col, stream in enumerate(streams):
        for row_index, (field, title) in enumerate((("factor", "all requests"), ("steady_factor", "steady state"))):
            ax = axes[row_index][col]
            for policy in policies_of(rows):
                points = sorted(
                    (r.checkpoints_per_request, getattr(r, field))
                    for r in rows
                    if r.stream == stream and r.policy == policy and r.budget in budgets
                )
                style = "-o" if policy.startswith("dp") else "--."
                ax.plot([p[0] for p in points], [p[1] for p in points], style, label=policy, linewidth=1.5)
            ax.axhline(getattr(ceiling_of(rows, stream), field), color="gray", linestyle=":", label=CEILING)
            ax.set_xscale("symlog", linthresh=1.0)
            ax.set_xlabel("recurrent checkpoints saved per request")
            ax.set_ylabel("token-savings factor (higher is better)")
            ax.set_title(f"{stream}: {title}")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=400)
    parser.add_argument("--num-prefixes", type=int, default=16)
    parser.add_argument("--num-entries", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bin-size", type=int, default=DEFAULT_BIN_SIZE)
    parser.add_argument("--warmup-fraction", type=float, default=0.1)
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()

    tokenizer = load_tokenizer()
    spec = StreamSpec(num_requests=args.num_requests, num_prefixes=args.num_prefixes, seed=args.seed)
    rows, stream_stats = [], {}
    for name, make in STREAMS.items():
        requests = tokenize(make(spec), tokenizer)
        lengths = [len(r) for r in requests]
        stream_stats[name] = (
            f"{len(requests)} requests, {sum(lengths):,} tokens, length {min(lengths)}..{max(lengths)} "
            f"(median {int(np.median(lengths))})"
        )
        print(f"{name}: {stream_stats[name]}")
        rows += run_stream(name, requests, args)
    timings = time_dp()

    sha = git_sha()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"checkpoint_placement-{sha}"
    text = report(rows, timings, args, sha, stream_stats)
    stem.with_suffix(".md").write_text(text)
    stem.with_suffix(".json").write_text(
        json.dumps(
            {
                "rows": [r.__dict__ for r in rows],
                "timings": timings,
                "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            },
            indent=1,
        )
    )
    plot(rows, stem.with_suffix(".png"), args.budgets)
    print(text)
    print(f"wrote {stem}.md/.json/.png")


if __name__ == "__main__":
    main()
