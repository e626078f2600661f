"""Placement policies: where the M checkpoints of a prefix of N tokens go.

Every policy has one signature, `policy(weights, budget, **options) -> list[int]`, over `weights[t]` = mass
of overlap depth t (t = 0..N), and returns sorted positions in 1..N, at most `budget` of them. Only `dp`
reads the masses; the baselines read only N. `plan` is the entry point: it validates, dispatches and aligns.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minipic_lite.checkpoints.cost import validate_budget, validate_weights
from minipic_lite.checkpoints.dp import dp_fast, dp_hull, dp_reference

DEFAULT_BLOCK_SIZE = 512  # tokens between `block` checkpoints
DEFAULT_BIN_SIZE = 64  # alignment the simulator and bench use (a KV block / chunked-scan multiple)


def no_checkpoints(weights: np.ndarray, budget: int) -> list[int]:
    """`none` (no cache at all) and `kv_only` (dense attention KV, no recurrent states): nothing to resume."""
    return []


def block(weights: np.ndarray, budget: int, *, block_size: int = DEFAULT_BLOCK_SIZE) -> list[int]:
    """A checkpoint every `block_size` tokens, the first `budget` of them (in the order a prefill saves them)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1 token, got {block_size}")
    num_tokens = len(weights) - 1
    return list(range(block_size, num_tokens + 1, block_size))[:budget]


def last(weights: np.ndarray, budget: int) -> list[int]:
    """`last` (vLLM-like): one state at the end of the prefill (rounded down to the grid by `plan`)."""
    return [len(weights) - 1] if budget else []


def balanced(weights: np.ndarray, budget: int) -> list[int]:
    """Even spacing c_i = ⌊i(N+1)/(M+1)⌋: optimal for uniform depths and in the worst case."""
    num_tokens = len(weights) - 1
    positions = {i * (num_tokens + 1) // (budget + 1) for i in range(1, budget + 1)}
    return sorted(positions - {0})


def logarithmic(weights: np.ndarray, budget: int) -> list[int]:
    """Gaps that halve towards the end of the prefix: N/2, 3N/4, 7N/8, … (N − ⌊N/2^i⌋, i = 1..M)."""
    num_tokens = len(weights) - 1
    return sorted({num_tokens - (num_tokens >> i) for i in range(1, budget + 1)} - {0})


def sqrt_spacing(weights: np.ndarray, budget: int) -> list[int]:
    """A checkpoint every ⌈√N⌉ tokens, the deepest `budget` of them."""
    num_tokens = len(weights) - 1
    gap = math.isqrt(num_tokens - 1) + 1  # ⌈√N⌉
    grid = list(range(gap, num_tokens + 1, gap))
    return grid[max(len(grid) - budget, 0) :]


def balanced_tail(weights: np.ndarray, budget: int) -> list[int]:
    """`balanced` for one checkpoint; from two on, `balanced` with M − 1 positions plus `sqrt`'s deepest (at most
    ⌈√N⌉ before the end), where requests that share the whole prefix but for a short tail resume. A prior (no
    traffic): the others cover partial overlaps evenly, one waits near the end."""
    if budget < 2:
        return balanced(weights, budget)
    return sorted(set(balanced(weights, budget - 1)) | set(sqrt_spacing(weights, 1)))


def optimal(weights: np.ndarray, budget: int, *, method: str = "fast") -> list[int]:
    """`dp`: the exact minimum of E[r(T;C)] over |C| ≤ M (see dp.py); `method` picks fast, hull or reference."""
    solvers = {"fast": dp_fast, "hull": dp_hull, "reference": dp_reference}
    if method not in solvers:
        raise ValueError(f"unknown dp method {method!r}; choose from {sorted(solvers)}")
    return solvers[method](weights, budget)


POLICIES: dict[str, Callable[..., list[int]]] = {
    "none": no_checkpoints,
    "kv_only": no_checkpoints,
    "block": block,
    "last": last,
    "balanced": balanced,
    "balanced_tail": balanced_tail,
    "logarithmic": logarithmic,
    "sqrt": sqrt_spacing,
    "dp": optimal,
}
WEIGHT_AWARE = frozenset({"dp"})


def bin_weights(weights: np.ndarray, bin_size: int) -> np.ndarray:
    """Mass per bin k = depths k·bin_size..(k+1)·bin_size − 1 (the last bin may be partial)."""
    num_bins = (weights.size - 1) // bin_size + 1
    padded = np.zeros(num_bins * bin_size)
    padded[: weights.size] = weights
    return padded.reshape(num_bins, bin_size).sum(axis=1)


def plan(policy: str, weights, budget: int, *, bin_size: int = 1, **options) -> list[int]:
    """Checkpoint positions for a prefix of N = len(weights) − 1 tokens: sorted, in 1..N, at most `budget`.

    weights: [N + 1] non-negative mass of each overlap depth t = 0..N (unnormalized).
    bin_size: positions are multiples of it (64 suits KV blocks and chunked scans); 1 = any token.
      With bins, a depth t = k·bin_size + u resumes at most at k·bin_size, so r(t) = u + bin_size·r_bins(k):
      `dp` runs on the binned masses and stays the exact optimum among aligned plans; the baselines place
      on tokens and are rounded down to the grid.
    options: the policy's own keywords (block: block_size; dp: method).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}; choose from {sorted(POLICIES)}")
    w = validate_weights(weights)
    budget = min(validate_budget(budget), w.size - 1)  # NOTE: no plan has more than N positions.
    if isinstance(bin_size, bool) or not isinstance(bin_size, (int, np.integer)) or bin_size < 1:
        raise ValueError(f"bin_size must be an integer >= 1, got {bin_size!r}")
    if policy in WEIGHT_AWARE and bin_size > 1:
        if w.size - 1 < bin_size:
            return []  # NOTE: no multiple of bin_size fits in 1..N.
        return [bin_size * k for k in _call(policy, bin_weights(w, bin_size), budget, options)]
    positions = _call(policy, w, budget, options)
    return sorted({bin_size * (c // bin_size) for c in positions} - {0})


def _call(policy: str, w: np.ndarray, budget: int, options: dict) -> list[int]:
    try:
        return POLICIES[policy](w, budget, **options)
    except TypeError as err:
        raise ValueError(f"policy {policy!r} does not take options {sorted(options)}: {err}") from err
