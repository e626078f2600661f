"""The cost model of sparse recurrent-state checkpoints: how many shared tokens a request recomputes.

A cached prefix of N tokens keeps recurrent states at positions C ⊂ {1..N}; position 0 (the empty prefix) is
always free. A request that shares the prefix to depth t resumes from the deepest checkpoint not past t,

    ℓ(t;C) = max({0} ∪ {c ∈ C : c ≤ t}),     r(t;C) = t − ℓ(t;C)   (tokens recomputed),

and `weights[t]` is the (unnormalized) mass of overlap depth t, t = 0..N.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def validate_weights(weights) -> np.ndarray:
    """`weights` as a float64 array over depths 0..N (N ≥ 1), or a ValueError naming the problem."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(f"weights must be 1-D (the mass of depths 0..N), got shape {w.shape}")
    if w.size < 2:
        raise ValueError(f"weights must cover depths 0..N with N >= 1, got N = {w.size - 1}")
    bad = np.flatnonzero(~np.isfinite(w))
    if bad.size:
        raise ValueError(f"weights must be finite: weights[{bad[0]}] = {w[bad[0]]}")
    bad = np.flatnonzero(w < 0)
    if bad.size:
        raise ValueError(f"weights must be non-negative: weights[{bad[0]}] = {w[bad[0]]}")
    return w


def validate_budget(budget) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise ValueError(f"budget must be an integer number of checkpoints, got {budget!r}")
    if budget < 0:
        raise ValueError(f"budget must be >= 0 checkpoints, got {budget}")
    return int(budget)


def validate_positions(positions: Iterable[int], num_tokens: int) -> np.ndarray:
    """Sorted unique checkpoint positions, each in 1..num_tokens."""
    c = np.unique(np.asarray(list(positions), dtype=np.int64))
    if c.size and (c[0] < 1 or c[-1] > num_tokens):
        raise ValueError(f"checkpoint positions must lie in 1..{num_tokens}, got {c.tolist()}")
    return c


def resume_depths(num_tokens: int, positions: Iterable[int]) -> np.ndarray:
    """ℓ(t;C) for t = 0..num_tokens."""
    c = validate_positions(positions, num_tokens)
    ell = np.zeros(num_tokens + 1, dtype=np.int64)
    ell[c] = c
    return np.maximum.accumulate(ell)


def recompute_tokens(num_tokens: int, positions: Iterable[int]) -> np.ndarray:
    """r(t;C) = t − ℓ(t;C) for t = 0..num_tokens."""
    return np.arange(num_tokens + 1) - resume_depths(num_tokens, positions)


def _total(w: np.ndarray) -> float:
    total = float(w.sum())
    if total <= 0:
        raise ValueError("weights sum to zero: no overlap depth has any mass")
    return total


def expected_cost(weights, positions: Iterable[int]) -> float:
    """E[r(T;C)] = Σ_t weights[t]·r(t;C) / Σ_t weights[t]."""
    w = validate_weights(weights)
    return float(w @ recompute_tokens(w.size - 1, positions)) / _total(w)


def worst_case_cost(weights, positions: Iterable[int]) -> int:
    """max r(t;C) over the depths t with weights[t] > 0 (pass uniform weights for all of 0..N)."""
    w = validate_weights(weights)
    _total(w)
    return int(recompute_tokens(w.size - 1, positions)[w > 0].max())


def expected_depth(weights) -> float:
    """E[T]: the recompute of a run without checkpoints."""
    w = validate_weights(weights)
    return float(w @ np.arange(w.size)) / _total(w)


def savings_fraction(weights, positions: Iterable[int]) -> float:
    """1 − E[r]/E[T]: the share of the shared tokens that need no recompute (0 when E[T] = 0)."""
    depth = expected_depth(weights)
    return 0.0 if depth == 0 else 1.0 - expected_cost(weights, positions) / depth


def token_savings_factor(weights, positions: Iterable[int], suffix_tokens: float = 0.0) -> float:
    """(E[T] + s) / (E[r] + s): how many times fewer tokens are computed than without checkpoints.

    `suffix_tokens` (s) adds the tokens every request computes anyway (its unshared suffix); with s = 0 the
    factor counts the shared prefix only and is inf when every depth lands exactly on a checkpoint.
    """
    if suffix_tokens < 0:
        raise ValueError(f"suffix_tokens must be >= 0, got {suffix_tokens}")
    work = expected_depth(weights) + suffix_tokens
    left = expected_cost(weights, positions) + suffix_tokens
    if work == 0:
        return 1.0
    return float("inf") if left == 0 else work / left
