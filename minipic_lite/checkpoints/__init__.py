"""Sparse recurrent-state checkpoints: where to put M of them in a cached prefix, and what that saves.

Pure Python/NumPy planning (no model): the cost model (cost.py), the placement policies and `plan`
(policies.py), the exact O(NM) DP (dp.py), online overlap estimators (estimators.py), a planner that re-plans
as they learn (planner.py, with the engine's `CheckpointPlanner`), a trace simulator (simulator.py) with
real-text streams (streams.py), and the engine's checkpoint store (store.py: budget, eviction, admission).

    from minipic_lite.checkpoints import plan, expected_cost
    positions = plan("dp", weights, budget=4)        # weights[t] = mass of overlap depth t, t = 0..N
    expected_cost(weights, positions)                # E[t − ℓ(t)], tokens recomputed per request
"""

from minipic_lite.checkpoints.cost import (
    expected_cost,
    expected_depth,
    recompute_tokens,
    resume_depths,
    savings_fraction,
    token_savings_factor,
    worst_case_cost,
)
from minipic_lite.checkpoints.dp import dp_fast, dp_hull, dp_reference
from minipic_lite.checkpoints.estimators import (
    ESTIMATORS,
    DepthHistogram,
    EntryHistory,
    OverlapEstimator,
    SuffixHistogram,
    make_estimator,
)
from minipic_lite.checkpoints.planner import CheckpointPlanner, Planner
from minipic_lite.checkpoints.policies import DEFAULT_BIN_SIZE, POLICIES, bin_weights, plan
from minipic_lite.checkpoints.simulator import CheckpointCache, SimResult, simulate
from minipic_lite.checkpoints.store import CheckpointStore

__all__ = [
    "DEFAULT_BIN_SIZE",
    "ESTIMATORS",
    "POLICIES",
    "CheckpointCache",
    "CheckpointPlanner",
    "CheckpointStore",
    "DepthHistogram",
    "EntryHistory",
    "OverlapEstimator",
    "Planner",
    "SimResult",
    "SuffixHistogram",
    "bin_weights",
    "dp_fast",
    "dp_hull",
    "dp_reference",
    "expected_cost",
    "expected_depth",
    "make_estimator",
    "plan",
    "recompute_tokens",
    "resume_depths",
    "savings_fraction",
    "simulate",
    "token_savings_factor",
    "worst_case_cost",
]
