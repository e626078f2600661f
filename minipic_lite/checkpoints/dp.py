"""The exact optimal placement of at most M checkpoints for an overlap-depth distribution.

With prefix sums P[j] = Σ_{t≤j} p_t and Q[j] = Σ_{t≤j} t·p_t, serving depths s..j from a checkpoint at s costs

    w(s, j) = Σ_{t=s..j} p_t (t − s) = (Q[j] − Q[s−1]) − s (P[j] − P[s−1]),

and dp[m, j], the least cost of depths 0..j with at most m checkpoints, is

    dp[0, j] = Q[j],    dp[m, j] = min(dp[m−1, j],  min_{1≤s≤j} dp[m−1, s−1] + w(s, j)).

Expanding w, candidate s is the line  y = b_s − s·x  evaluated at x = P[j] (plus Q[j]), with intercept
b_s = dp[m−1, s−1] − Q[s−1] + s·P[s−1]: slopes fall as s grows and queries P[j] never decrease, so the
monotone convex-hull trick answers a whole layer in O(N), O(NM) in all. Three versions, same contract:

- `dp_reference`: the plain O(N²M) recurrence (the reference).
- `dp_hull`: the textbook monotone deque, one line added and one query per step (pure Python, O(NM)).
- `dp_fast`: the same envelope built per layer with NumPy (the one `plan` uses).

A checkpoint is added only when it lowers the cost, so the plan has the fewest checkpoints among optima.
"""

from __future__ import annotations

import numpy as np

from minipic_lite.checkpoints.cost import validate_budget, validate_weights

# NOTE: a checkpoint must lower the cost by more than this share of the no-checkpoint cost Q[N], so that
# float noise in the prefix sums never buys a useless checkpoint.
IMPROVEMENT_RTOL = 1e-12
MAX_HULL_PASSES = 32  # vectorized pruning passes before lower_hull falls back to the monotone chain


def _prepare(weights, budget) -> tuple[np.ndarray, np.ndarray, int, float]:
    w = validate_weights(weights)
    num_tokens = w.size - 1
    budget = min(validate_budget(budget), num_tokens)
    prefix_mass = np.cumsum(w)  # P[j]
    prefix_depth = np.cumsum(w * np.arange(w.size))  # Q[j]
    return prefix_mass, prefix_depth, budget, IMPROVEMENT_RTOL * max(prefix_depth[-1], 1e-300)


def _backtrack(choices: list[np.ndarray], num_tokens: int) -> list[int]:
    """choices[m-1][j] = s if layer m placed its checkpoint at s for depths 0..j, else 0."""
    positions, j = [], num_tokens
    for choice in reversed(choices):
        s = int(choice[j])
        if s:
            positions.append(s)
            j = s - 1
    return sorted(positions)


def dp_reference(weights, budget: int) -> list[int]:
    """Optimal positions by the plain O(N²M) recurrence; the reference for the fast versions."""
    P, Q, budget, tol = _prepare(weights, budget)
    num_tokens = P.size - 1
    prev, choices = Q.copy(), []
    for _ in range(budget):
        cur, choice = prev.copy(), np.zeros(num_tokens + 1, dtype=np.int64)
        for j in range(1, num_tokens + 1):
            for s in range(1, j + 1):
                value = prev[s - 1] + (Q[j] - Q[s - 1]) - s * (P[j] - P[s - 1])
                if value < cur[j] - tol:
                    cur[j], choice[j] = value, s
        prev = cur
        choices.append(choice)
    return _backtrack(choices, num_tokens)


def _is_redundant(s1, b1, s2, b2, s3, b3) -> bool:
    """Line 2 never beats lines 1 and 3 (slopes −s1 > −s2 > −s3) when 1 and 3 cross before 1 and 2."""
    return (b3 - b1) * (s2 - s1) <= (b2 - b1) * (s3 - s1)


def dp_hull(weights, budget: int) -> list[int]:
    """Optimal positions by the monotone convex-hull trick with a deque, O(NM) (pure Python)."""
    P, Q, budget, tol = _prepare(weights, budget)
    num_tokens = P.size - 1
    P, Q = P.tolist(), Q.tolist()
    prev, choices = list(Q), []
    for _ in range(budget):
        cur, choice = list(prev), np.zeros(num_tokens + 1, dtype=np.int64)
        slopes, intercepts, head = [], [], 0  # the hull: lines y = b − s·x, s increasing
        for j in range(1, num_tokens + 1):
            # -- add line s = j (it serves depths from j on) --
            s, b = j, prev[j - 1] - Q[j - 1] + j * P[j - 1]
            while len(slopes) - head >= 2 and _is_redundant(
                slopes[-2], intercepts[-2], slopes[-1], intercepts[-1], s, b
            ):
                slopes.pop(), intercepts.pop()
            slopes.append(s), intercepts.append(b)
            # -- query x = P[j]: x never decreases, so lines left behind are done for this layer --
            x = P[j]
            while len(slopes) - head >= 2 and (
                intercepts[head + 1] - slopes[head + 1] * x <= intercepts[head] - slopes[head] * x
            ):
                head += 1
            value = intercepts[head] - slopes[head] * x + Q[j]
            if value < cur[j] - tol:
                cur[j], choice[j] = value, slopes[head]
        prev = cur
        choices.append(choice)
    return _backtrack(choices, num_tokens)


def lower_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the vertices of the lower convex hull of points with strictly increasing x.

    Vectorized: every pass drops each point that lies on or above the chord of its current neighbours (such
    a point is no vertex); when a pass drops nothing the chain is convex, hence the hull. Typical inputs
    converge in a handful of passes; after MAX_HULL_PASSES the rest goes to Andrew's monotone chain, so
    adversarial inputs (one point dropped per pass) stay linear-time.
    """
    idx = np.arange(x.size)
    for _ in range(MAX_HULL_PASSES):
        if idx.size <= 2:
            return idx
        xs, ys = x[idx], y[idx]
        dx_left, dx_right = xs[1:-1] - xs[:-2], xs[2:] - xs[1:-1]
        above = (ys[1:-1] - ys[:-2]) * dx_right >= (ys[2:] - ys[1:-1]) * dx_left
        if not above.any():
            break
        keep = np.ones(idx.size, dtype=bool)
        keep[1:-1] = ~above
        idx = idx[keep]
    else:
        return _monotone_chain(x, y, idx)
    return idx


def _monotone_chain(x: np.ndarray, y: np.ndarray, idx: np.ndarray) -> np.ndarray:
    xs, ys, hull = x[idx].tolist(), y[idx].tolist(), []
    for k in range(len(xs)):
        while len(hull) >= 2:
            i, j = hull[-2], hull[-1]
            if (ys[j] - ys[i]) * (xs[k] - xs[j]) >= (ys[k] - ys[j]) * (xs[j] - xs[i]):
                hull.pop()
            else:
                break
        hull.append(k)
    return idx[hull]


def useful_lines(slopes: np.ndarray, intercepts: np.ndarray, x_lo: float, x_hi: float) -> np.ndarray:
    """Indices of the lines y = b − s·x (s increasing) that can be lowest somewhere in [x_lo, x_hi], x_lo < x_hi.

    A line that some shallower line undercuts at x_hi is undercut on all of (−∞, x_hi]; one that a deeper line
    undercuts at x_lo is undercut on all of [x_lo, ∞). Dropping both kinds keeps a minimizer for every query
    in range and, on skewed masses, the flat tails that slow the hull down.
    """
    at_hi = intercepts - slopes * x_hi
    keep = at_hi < np.minimum.accumulate(np.concatenate([[np.inf], at_hi[:-1]]))
    at_lo = intercepts - slopes * x_lo
    keep &= at_lo < np.minimum.accumulate(np.concatenate([at_lo[1:], [np.inf]])[::-1])[::-1]
    return np.flatnonzero(keep)


def dp_fast(weights, budget: int) -> list[int]:
    """Optimal positions by the convex-hull trick, one NumPy pass per layer.

    All lines of a layer are known before its queries, so the envelope is the lower hull of the points
    (s, b_s) and the best line for x = P[j] is found with one searchsorted on the hull's edge slopes. The
    constraint s ≤ j can be dropped: a line with s > j evaluates to dp[m−1, s−1] + Σ_{j<t<s} p_t (s − t)
    ≥ dp[m−1, j], never better than placing nothing, so such an answer is read as "no checkpoint".
    """
    P, Q, budget, tol = _prepare(weights, budget)
    num_tokens = P.size - 1
    if P[-1] <= P[0]:
        return []  # NOTE: all mass sits at depth 0 (or none at all): no checkpoint can help.
    s = np.arange(1, num_tokens + 1, dtype=np.float64)
    line_offset = s * P[:-1] - Q[:-1]  # b_s − dp[m−1, s−1], the same in every layer
    max_line = np.arange(num_tokens + 1) - 1  # NOTE: query j may use lines s ≤ j, i.e. index s − 1 < j
    prev, choices = Q.copy(), []
    for _ in range(budget):
        b = prev[:-1] + line_offset  # b[s-1] for s = 1..N
        lines = useful_lines(s, b, P[0], P[-1])
        hull = lines[lower_hull(s[lines], b[lines])]
        edge_slopes = np.diff(b[hull]) / np.diff(s[hull])
        best = hull[np.searchsorted(edge_slopes, P, side="left")]  # index s-1, per query j
        value = b[best] - (best + 1) * P + Q
        better = (best <= max_line) & (value < prev - tol)
        if not better.any():
            break  # NOTE: no layer after this one can improve either: the optimum uses < m checkpoints.
        choices.append(np.where(better, best + 1, 0))
        np.copyto(prev, value, where=better)
    return _backtrack(choices, num_tokens)
