"""Overlap-depth estimators: the distribution the DP plans for, learned online from the depths requests reach.

An observation is a served request: its token ids, and its overlap `depth` with the cached entry it shared
most with (of `entry_len` tokens; None when nothing was cached). Observation i weighs γ^age, age = number
of observations after it (γ = 1: empirical; γ < 1: exponentially weighted, for drifting traffic). Every
estimator answers `weights_for(entry_token_ids)`: the estimated mass of depths 0..N that future requests
will reach on a new entry of N tokens. Three ways to condition that estimate:

- `DepthHistogram`: one histogram of depths for all entries (the plain estimate; depths past N are dropped,
  nothing can share an entry deeper than its length). It conditions on nothing.
- `SuffixHistogram`: conditions on the entry's length. It keys each observation by how far before the end
  of its entry the request left, d = entry_len − depth, and maps d onto the new entry as t = N − d.
- `EntryHistory`: conditions on the entry's tokens. The depths the last `window` requests would have reached
  on this very entry (their common prefix with it) are an empirical sample of its future; the entry's own
  request adds one observation where later requests like it leave it, placed by a `SuffixHistogram` (t = N − d,
  from the start of the turn the deepest history depth a lies in: a is no floor, see `_own_request`), and
  hedged towards earlier depths past a (`hedge_earlier`: a checkpoint placed too deep is worth nothing).

Each histogram also carries `prior_weight` observations of a scale-free prior over the distance from the end,
p(d) ∝ 1/(d + 1): with no data, the DP then spaces checkpoints geometrically towards the end of the entry.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

from minipic_lite.checkpoints.turns import branch_points

# NOTE: the decayed masses are kept scaled by γ^(−n) and rescaled once the scale passes this bound.
MAX_SCALE = 1e150
DEFAULT_PRIOR_WEIGHT = 1.0  # observations' worth of the scale-free prior
DEFAULT_WINDOW = 512  # past requests an EntryHistory compares a new entry with
BRANCH_PRIOR_SHARE = 0.5  # EntryHistory with chat turns: the prior's share that sits on the entry's branch points
SUFFIX_HEDGE = 0.1  # EntryHistory: a learned distance d from the end also stands for those up to d·(1 + this)


class OverlapEstimator(Protocol):
    """What a `Planner` needs from an estimator."""

    def observe_request(self, token_ids: np.ndarray, depth: int, entry_token_ids: np.ndarray | None) -> None:
        """A served request, its depth on the entry it shared most with (None: nothing was cached)."""

    def weights_for(self, entry_token_ids: np.ndarray) -> np.ndarray:
        """[N + 1] estimated mass of the depths future requests reach on this new entry of N tokens."""

    def plan_key(self, entry_token_ids: np.ndarray):
        """Entries with equal keys share a plan until the planner re-plans; None: plan each entry alone."""


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    mismatch = np.flatnonzero(a[:n] != b[:n])
    return int(mismatch[0]) if mismatch.size else n


def scale_free_prior(num_tokens: int) -> np.ndarray:
    """[N + 1] mass ∝ 1/(N − t + 1) on depths t = 1..N (none at 0), summing to 1."""
    prior = np.zeros(num_tokens + 1)
    prior[1:] = 1.0 / np.arange(num_tokens, 0, -1)
    return prior / prior.sum()


def uniform_prior(num_tokens: int) -> np.ndarray:
    """[N + 1] mass 1/N on depths t = 1..N (none at 0): what `balanced` is optimal for."""
    prior = np.full(num_tokens + 1, 1.0 / num_tokens)
    prior[0] = 0.0
    return prior


def hedge_earlier(weights: np.ndarray, hedge: float, floor: int) -> np.ndarray:
    """[N + 1] the mass at each depth t spread evenly over max(t − ⌈hedge·(N − t)⌉, min(t, floor))..t.

    Where a new entry's requests leave it, t = N − d, comes from distances d learned on other entries; a
    request whose suffix is a little longer (a question 10% longer) leaves a little earlier. A checkpoint
    past where a request leaves is of no use to it (it resumes from the one before), one before costs it only
    the gap: so each t is hedged one-sided, towards earlier depths, by a share of its distance from the end.
    Never below `floor` (the entry's known prefix a, whose depths the history samples exactly), unless t lies
    there already."""
    num_tokens = weights.size - 1
    hedged = np.zeros_like(weights)
    for t in np.flatnonzero(weights):
        start = max(t - int(np.ceil(hedge * (num_tokens - t))), min(t, floor))
        hedged[start : t + 1] += weights[t] / (t + 1 - start)
    return hedged


def _check_gamma(gamma: float) -> None:
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must lie in (0, 1], got {gamma}")


class DepthHistogram:
    """Mass of each depth key, observation weights γ^age, plus `prior_weight` of the scale-free prior."""

    def __init__(self, gamma: float = 1.0, prior_weight: float = DEFAULT_PRIOR_WEIGHT):
        _check_gamma(gamma)
        if not prior_weight >= 0:
            raise ValueError(f"prior_weight must be >= 0, got {prior_weight}")
        self.gamma = gamma
        self.prior_weight = prior_weight
        self.num_observations = 0
        self._mass = np.zeros(0)  # [max_key + 1], scaled by self._scale
        self._scale = 1.0

    def observe(self, depth: int, entry_len: int) -> None:
        if depth < 0 or depth > entry_len:
            raise ValueError(f"overlap depth must lie in 0..entry_len = {entry_len}, got {depth}")
        key = self._key(depth, entry_len)
        if key >= self._mass.size:
            self._mass = np.concatenate([self._mass, np.zeros(max(key + 1 - self._mass.size, self._mass.size))])
        self._scale /= self.gamma  # NOTE: older mass shrinks by γ relative to the newest (weight 1).
        if self._scale > MAX_SCALE:
            self._mass /= self._scale
            self._scale = 1.0
        self._mass[key] += self._scale
        self.num_observations += 1

    def _key(self, depth: int, entry_len: int) -> int:
        return depth

    def key_mass(self) -> np.ndarray:
        """[max_key + 1] observed mass per key, the newest observation weighing 1."""
        return self._mass / self._scale

    def observed_weights(self, num_tokens: int) -> np.ndarray:
        """[num_tokens + 1] observed mass of depths 0..num_tokens (no prior)."""
        mass = self.key_mass()[: num_tokens + 1]
        return np.pad(mass, (0, num_tokens + 1 - mass.size))

    def weights(self, num_tokens: int) -> np.ndarray:
        """[num_tokens + 1] estimated mass of depths 0..num_tokens: observed + prior."""
        if num_tokens < 1:
            raise ValueError(f"an entry needs N >= 1 tokens, got {num_tokens}")
        return self.observed_weights(num_tokens) + self.prior_weight * scale_free_prior(num_tokens)

    # -- the planner's interface --
    def observe_request(self, token_ids: np.ndarray, depth: int, entry_token_ids: np.ndarray | None) -> None:
        if entry_token_ids is not None:
            self.observe(depth, len(entry_token_ids))

    def weights_for(self, entry_token_ids: np.ndarray) -> np.ndarray:
        return self.weights(len(entry_token_ids))

    def plan_key(self, entry_token_ids: np.ndarray):
        return len(entry_token_ids)


class SuffixHistogram(DepthHistogram):
    """Mass of each distance from the entry's end, d = entry_len − depth, mapped to depth t = N − d."""

    def _key(self, depth: int, entry_len: int) -> int:
        return entry_len - depth

    def observed_weights(self, num_tokens: int) -> np.ndarray:
        mass = self.key_mass()[: num_tokens + 1][::-1]  # NOTE: index N − d; distances d > N fall off.
        return np.pad(mass, (num_tokens + 1 - mass.size, 0))


class EntryHistory:
    """Per-entry estimate: the depths recent requests would reach on this entry, plus its own request."""

    def __init__(
        self,
        gamma: float = 1.0,
        window: int = DEFAULT_WINDOW,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
        uniform_until_observed: bool = False,
        turn_start_id: int | None = None,
        suffix_hedge: float = SUFFIX_HEDGE,
    ):
        _check_gamma(gamma)
        if window < 1:
            raise ValueError(f"window must be >= 1 request, got {window}")
        self.gamma = gamma
        self.history: deque[np.ndarray] = deque(maxlen=window)  # NOTE: newest last
        self.suffix = SuffixHistogram(gamma, prior_weight)
        self.prior_weight = prior_weight
        if not suffix_hedge >= 0:
            raise ValueError(f"suffix_hedge must be >= 0, got {suffix_hedge}")
        self.suffix_hedge = suffix_hedge  # NOTE: the own request's t = N − d, spread over earlier depths
        # NOTE: True: while no request has left an entry past its known prefix, the entry's own request is
        # spread uniformly over (a, N] (what `balanced` assumes), not by the suffix histogram's prior.
        self.uniform_until_observed = uniform_until_observed
        self.turn_start_id = turn_start_id  # NOTE: set: part of the prior sits where the entry's turns start
        self._known_prefix: dict[int, int] = {}  # entry key -> the deepest depth history had reached on it
        self.num_observations = 0

    def observe_request(self, token_ids: np.ndarray, depth: int, entry_token_ids: np.ndarray | None) -> None:
        self.history.append(np.asarray(token_ids))
        if entry_token_ids is not None:
            known = self._known_prefix.get(_entry_key(entry_token_ids), 0)
            if depth > known:  # NOTE: only requests that left the entry past its known prefix teach d.
                self.suffix.observe(depth, len(entry_token_ids))
        self.num_observations += 1

    def history_weights(self, entry_token_ids: np.ndarray) -> np.ndarray:
        """[N + 1] Σ_i γ^age_i · [LCP(request_i without its last token, entry) = t]."""
        entry = np.asarray(entry_token_ids)
        weights = np.zeros(entry.size + 1)
        for age, request in enumerate(reversed(self.history)):
            weights[common_prefix_len(request[:-1], entry)] += self.gamma**age
        return weights

    def weights_for(self, entry_token_ids: np.ndarray) -> np.ndarray:
        weights = self.history_weights(entry_token_ids)
        known = int(np.flatnonzero(weights)[-1]) if weights.any() else 0  # a: the deepest depth seen
        self._remember(entry_token_ids, known)
        uniform = self.uniform_until_observed and self.suffix.num_observations == 0
        own = self._own_request(entry_token_ids, known, uniform)
        if own.sum() > 0:
            weights += own / own.sum()  # NOTE: the entry's own request, one observation's worth.
        prior = uniform_prior(weights.size - 1) if uniform else scale_free_prior(weights.size - 1)
        return weights + self.prior_weight * self._with_branches(prior, entry_token_ids)

    def _own_request(self, entry_token_ids: np.ndarray, known: int, uniform: bool) -> np.ndarray:
        """[N + 1] where later requests of the entry's own group leave it (unnormalized).

        Past the known prefix a while no distance is learned (uniform: a short shared header says nothing).
        Else by the suffix model, t = N − d hedged towards earlier depths down to a (`hedge_earlier`), from the
        start of the turn that a lies in (0 without chat turns): the request that reached a may have shared a
        few tokens of the entry's own tail (two questions that begin alike reach 1,834 of a document the others
        leave at 1,823), so a is no floor for where the entry's group leaves; the turns before that one it
        shared whole (chat turns: a system prompt), and a distance learned on other prompts' user turns is no
        reason to move the group inside them."""
        num_tokens = len(entry_token_ids)
        if uniform:
            own = np.ones(num_tokens + 1)
            own[: known + 1] = 0.0
            return own
        observed = hedge_earlier(self.suffix.observed_weights(num_tokens), self.suffix_hedge, known)
        own = observed + self.suffix.prior_weight * scale_free_prior(num_tokens)
        points = branch_points(entry_token_ids, self.turn_start_id) if self.turn_start_id is not None else []
        own[: max([p for p in points if p <= known], default=0) + 1] = 0.0
        return own

    def _with_branches(self, prior: np.ndarray, entry_token_ids: np.ndarray) -> np.ndarray:
        """`prior` with BRANCH_PRIOR_SHARE of it moved evenly onto the entry's branch points (turns.py), if any."""
        points = branch_points(entry_token_ids, self.turn_start_id) if self.turn_start_id is not None else []
        if not points:
            return prior
        on_points = np.zeros(prior.size)
        on_points[points] = 1.0 / len(points)
        return (1 - BRANCH_PRIOR_SHARE) * prior + BRANCH_PRIOR_SHARE * on_points

    def plan_key(self, entry_token_ids: np.ndarray):
        return None  # every entry is planned for itself

    def _remember(self, entry_token_ids: np.ndarray, known: int) -> None:
        if len(self._known_prefix) >= 4 * self.history.maxlen:
            del self._known_prefix[next(iter(self._known_prefix))]  # NOTE: dicts keep insertion order.
        self._known_prefix[_entry_key(entry_token_ids)] = known


def _entry_key(token_ids: np.ndarray) -> int:
    return hash(np.asarray(token_ids, dtype=np.int64).tobytes())


ESTIMATORS = {"depth": DepthHistogram, "suffix": SuffixHistogram, "entry": EntryHistory}


def make_estimator(kind: str, **options):
    if kind not in ESTIMATORS:
        raise ValueError(f"unknown estimator {kind!r}; choose from {sorted(ESTIMATORS)}")
    return ESTIMATORS[kind](**options)
