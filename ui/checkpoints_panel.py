"""The Checkpoints panel as data: learn an overlap histogram from a request stream, then place each policy's
checkpoints on it and price them (minipic_lite/checkpoints: cost model, policies, the DP).

    requests --simulate--> DepthHistogram (the planner's estimator) --weights(N)--> plan(policy, M) --> E[r]

The stream is either the app's own prompts or a benchmark stream (checkpoints/streams.py). An entry of N
tokens (the stream's latest request) is planned for; E[r] is the expected number of shared tokens a request
recomputes when it resumes from the deepest checkpoint at or before its overlap depth.

A hybrid model served by the app: each request's prompt on its token axis, from `RequestOutput.state_report`,

    0            resume                          N      [0, resume): state loaded from a checkpoint (resumed)
    |▓▓▓▓▓▓▓▓▓▓▓▓▓|░░░░░░░░░|░░░░░░░░░░░░░░░░░░░|      [resume, N): computed (recomputed)
        planned ◇     saved ◆    saved ◆             ▲ the resume point

and the engine's checkpoint store (`LLM.stats()`: state memory used / budget, checkpoints saved / moved / evicted).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
import pandas as pd

from minipic_lite.checkpoints import DEFAULT_BIN_SIZE, DepthHistogram, Planner, expected_cost, plan, simulate
from minipic_lite.checkpoints.policies import bin_weights

SHOWN_POLICIES = ("block", "balanced", "logarithmic", "sqrt", "dp")
NUM_CACHE_ENTRIES = 16
MAX_BUDGET = 32
AXIS_MARKS = ("planned", "saved", "resume")  # a planned position this request did not save; one it saved; ▲


def learn_overlaps(requests: list[list[int]], budget: int, bin_size: int = DEFAULT_BIN_SIZE) -> DepthHistogram:
    """Replay `requests` through the simulator with a DP planner; its estimator has learned their overlap depths."""
    estimator = DepthHistogram()
    simulate(requests, Planner("dp", budget, estimator, bin_size=bin_size), num_entries=NUM_CACHE_ENTRIES)
    return estimator


def policy_plans(weights: np.ndarray, budget: int, bin_size: int = DEFAULT_BIN_SIZE) -> list[dict]:
    """Per policy: its checkpoint positions on the N = len(weights) - 1 tokens and the expected recompute."""
    no_cache = expected_cost(weights, [])
    rows = []
    for policy in SHOWN_POLICIES:
        positions = plan(policy, weights, budget, bin_size=bin_size)
        cost = expected_cost(weights, positions)
        rows.append({"policy": policy, "positions": positions, "expected_recompute": cost, "no_checkpoints": no_cache})
    return rows


PLAN_COLUMNS = ("policy", "checkpoints", "positions", "E[recompute] (tokens)", "saved")


def plans_frame(rows: list[dict]) -> pd.DataFrame:
    """The table: policy, number of checkpoints, positions, E[tokens recomputed], saved vs no checkpoints (no rows:
    the columns only, for the table before the first plan)."""
    return pd.DataFrame(
        [
            {
                "policy": r["policy"],
                "checkpoints": len(r["positions"]),
                "positions": ", ".join(map(str, r["positions"])),
                "E[recompute] (tokens)": round(r["expected_recompute"], 1),
                "saved": f"{1 - r['expected_recompute'] / r['no_checkpoints']:.0%}" if r["no_checkpoints"] else "-",
            }
            for r in rows
        ],
        columns=list(PLAN_COLUMNS),
    )


def positions_frame(rows: list[dict]) -> pd.DataFrame:
    """One row per (policy, checkpoint position): a scatter of where each policy places."""
    return pd.DataFrame(
        [{"policy": r["policy"], "position": p} for r in rows for p in r["positions"]], columns=["policy", "position"]
    ).astype({"policy": str, "position": "int64"})  # NOTE: typed when empty too, as timeline_frame


def histogram_frame(weights: np.ndarray, bin_size: int = DEFAULT_BIN_SIZE) -> pd.DataFrame:
    """Mass per bin of overlap depth (normalized): bin k holds depths [k*bin_size, (k+1)*bin_size)."""
    mass = bin_weights(np.asarray(weights, dtype=float), bin_size)
    mass = mass / mass.sum() if mass.sum() > 0 else mass
    return pd.DataFrame({"depth": np.arange(mass.size) * bin_size, "mass": mass})


def no_plan() -> tuple[None, None, pd.DataFrame]:
    """(histogram, positions, table) of no plan, as before the first one: the plots empty, the table's columns.
    NOTE: None, not an empty frame: gradio redraws a plot's data only, so an empty frame keeps the old legend."""
    return None, None, plans_frame([])


# -- a hybrid's requests on their token axis ------------------------------------------------------------------


@dataclass(frozen=True)
class TokenAxis:
    """One request's prompt of N tokens: [0, resume) loaded from a saved state, [resume, N) computed."""

    num_prompt_tokens: int
    resume_position: int
    planned: tuple[int, ...]  # the planner's positions for this prompt
    saved: tuple[int, ...]  # those it saved: none at or below its resume point, none its prefill has not reached

    @property
    def segments(self) -> list[tuple[int, int, str]]:
        """Half-open (start, end, "resumed" | "recomputed"), the empty ones left out."""
        parts = [(0, self.resume_position, "resumed"), (self.resume_position, self.num_prompt_tokens, "recomputed")]
        return [(start, end, kind) for start, end, kind in parts if end > start]

    @property
    def marks(self) -> list[tuple[int, str]]:
        """(position, mark) sorted by position: every planned position as "saved" or "planned", then the resume."""
        saved = set(self.saved)
        marks = [(p, "saved" if p in saved else "planned") for p in sorted(set(self.planned) | saved)]
        return marks + [(self.resume_position, "resume")] * (self.resume_position > 0)


def token_axis(report, num_prompt_tokens: int) -> TokenAxis:
    """The axis of a `StateReport` (`RequestOutput.state_report`) of a prompt of `num_prompt_tokens`."""
    return TokenAxis(num_prompt_tokens, report.resume_position, report.planned_checkpoints, report.saved_checkpoints)


def axis_frame(axis: TokenAxis) -> pd.DataFrame:
    """The marks as rows (position, mark): a scatter over the token axis."""
    return pd.DataFrame(axis.marks, columns=["position", "mark"])


def axis_caption(axis: TokenAxis) -> str:
    saved = ", ".join(map(str, axis.saved)) or "none"
    start = f"resumed at {axis.resume_position:,}" if axis.resume_position else "computed from the start"
    return (
        f"{axis.num_prompt_tokens:,} prompt tokens: {start}, {axis.num_prompt_tokens - axis.resume_position:,} "
        f"recomputed; checkpoints saved at {saved}"
    )


AXIS_STYLE = """<style>
.mp-axis{font-family:ui-monospace,monospace;font-size:11px;margin:4px 0 12px 0}
.mp-axis-bar{position:relative;height:18px;max-width:720px;background:#eee;border-radius:3px;margin:10px 0 2px 0}
.mp-axis-seg{position:absolute;top:0;height:18px}
.mp-axis-seg.resumed{background:#7ddc8b}.mp-axis-seg.recomputed{background:#f3c97a}
.mp-axis-mark{position:absolute;top:-8px;width:0;height:34px;border-left:2px solid #1f5fbf}
.mp-axis-mark.planned{border-left:2px dashed #1f5fbf}
.mp-axis-mark.resume{border-left:3px solid #c0392b}
.mp-axis-ends{display:flex;justify-content:space-between;max-width:720px;color:#555}
.mp-axis-legend{font-family:ui-monospace,monospace;font-size:11px;color:#333;max-width:720px}
</style>"""
AXIS_LEGEND = (
    "<div class='mp-axis-legend'>green: resumed from a checkpoint · amber: computed · solid blue: checkpoint saved "
    "by this request · dashed: planned, not saved by it (at or below where it resumed, or not "
    "reached yet) · red: where it resumed</div>"
)


def axis_html(entries: list[tuple[str, TokenAxis]], empty: str = "No request yet.") -> str:
    """One bar per (title, axis): segments and marks placed at their share of the prompt."""
    if not entries:
        return AXIS_STYLE + f"<div class='mp-empty'>{html.escape(empty)}</div>"
    return AXIS_STYLE + AXIS_LEGEND + "".join(_axis_row(title, axis) for title, axis in entries)


def _axis_row(title: str, axis: TokenAxis) -> str:
    n = max(axis.num_prompt_tokens, 1)
    segments = "".join(
        f"<div class='mp-axis-seg {kind}' data-start='{start}' data-end='{end}' "
        f"style='left:{100 * start / n:.2f}%;width:{100 * (end - start) / n:.2f}%' title='{kind} [{start}, {end})'>"
        "</div>"
        for start, end, kind in axis.segments
    )
    marks = "".join(
        f"<div class='mp-axis-mark {mark}' data-position='{p}' style='left:{100 * p / n:.2f}%' "
        f"title='{mark} at token {p}'></div>"
        for p, mark in axis.marks
    )
    return (
        f"<div class='mp-axis' data-request='{html.escape(title, quote=True)}'><div class='mp-seg-label'>"
        f"{html.escape(title)}: {html.escape(axis_caption(axis))}</div>"
        f"<div class='mp-axis-bar'>{segments}{marks}</div>"
        f"<div class='mp-axis-ends'><span>0</span><span>{axis.num_prompt_tokens:,}</span></div></div>"
    )


def state_markdown(stats: dict) -> str:
    """The checkpoint store, from `LLM.stats()`; "" for a model without recurrent state."""
    if "state_budget_bytes" not in stats:
        return ""
    used, budget = stats["state_memory_bytes"], stats["state_budget_bytes"]
    rows = [
        ("state memory used / budget", f"{format_bytes(used)} / {format_bytes(budget)}" + _share(used, budget)),
        ("checkpoints held", stats["num_checkpoints"]),
        (  # NOTE: held = saved - moved - evicted; a save that took a stale checkpoint's place moved it
            "checkpoints saved / moved / evicted",
            f"{stats['num_checkpoints_saved']} / {stats['num_checkpoints_moved']} / {stats['num_checkpoints_evicted']}",
        ),
        ("requests resumed from a checkpoint", stats["num_resumed"]),
        (
            "prompt tokens resumed / recomputed",
            f"{stats['num_resumed_tokens']:,} / {stats['num_recomputed_prompt_tokens']:,}",
        ),
    ]
    return "| recurrent state | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def _share(used: int, budget: int) -> str:
    return f" ({used / budget:.2%})" if budget else " (no checkpoints: state_cache_gib=0)"


def format_bytes(num_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:,.1f} {unit}"
    return f"{num_bytes} B"
