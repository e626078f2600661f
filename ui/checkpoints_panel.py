"""The Checkpoints panel as data: learn an overlap histogram from a request stream, then place each policy's
checkpoints on it and price them (minipic_lite/checkpoints: cost model, policies, the DP).

    requests --simulate--> DepthHistogram (the planner's estimator) --weights(N)--> plan(policy, M) --> E[r]

The stream is either the app's own prompts or a benchmark stream (checkpoints/streams.py). An entry of N
tokens (the stream's latest request) is planned for; E[r] is the expected number of shared tokens a request
recomputes when it resumes from the deepest checkpoint at or before its overlap depth.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from minipic_lite.checkpoints import DEFAULT_BIN_SIZE, DepthHistogram, Planner, expected_cost, plan, simulate
from minipic_lite.checkpoints.policies import bin_weights

SHOWN_POLICIES = ("block", "balanced", "logarithmic", "sqrt", "dp")
NUM_CACHE_ENTRIES = 16
MAX_BUDGET = 32


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


def plans_frame(rows: list[dict]) -> pd.DataFrame:
    """The table: policy, number of checkpoints, positions, E[tokens recomputed], saved vs no checkpoints."""
    return pd.DataFrame(
        {
            "policy": r["policy"],
            "checkpoints": len(r["positions"]),
            "positions": ", ".join(map(str, r["positions"])),
            "E[recompute] (tokens)": round(r["expected_recompute"], 1),
            "saved": f"{1 - r['expected_recompute'] / r['no_checkpoints']:.0%}" if r["no_checkpoints"] else "-",
        }
        for r in rows
    )


def positions_frame(rows: list[dict]) -> pd.DataFrame:
    """One row per (policy, checkpoint position): a scatter of where each policy places."""
    return pd.DataFrame(
        [{"policy": r["policy"], "position": p} for r in rows for p in r["positions"]], columns=["policy", "position"]
    )


def histogram_frame(weights: np.ndarray, bin_size: int = DEFAULT_BIN_SIZE) -> pd.DataFrame:
    """Mass per bin of overlap depth (normalized): bin k holds depths [k*bin_size, (k+1)*bin_size)."""
    mass = bin_weights(np.asarray(weights, dtype=float), bin_size)
    mass = mass / mass.sum() if mass.sum() > 0 else mass
    return pd.DataFrame({"depth": np.arange(mass.size) * bin_size, "mass": mass})
