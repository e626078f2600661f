"""Overlap-depth estimators: what the DP plans for, learned online from the depths requests reach.

An observation is (depth, entry_len): a request shared `depth` tokens with a cached entry of `entry_len`
tokens. Each observation gets weight γ^age, age = number of observations after it (γ = 1: the empirical
histogram; γ < 1: exponentially weighted, for drifting traffic). `weights(num_tokens)` is the estimate of
the depth mass over 0..N for a new entry of N tokens:

- `DepthHistogram` keys observations by the depth itself, one histogram for all entries (the plain estimate;
  depths beyond N are dropped, the entry cannot be shared deeper than its length);
- `SuffixHistogram` keys them by how far before the entry's end the request left it, d = entry_len − depth,
  and maps d back onto the new entry as t = N − d: the depth distribution conditioned on the entry's length.
"""

from __future__ import annotations

import numpy as np

# NOTE: the decayed masses are kept scaled by γ^(−n) and rescaled once the scale passes this bound.
MAX_SCALE = 1e150


class DepthHistogram:
    """Mass of each depth key, with weight γ^age per observation."""

    def __init__(self, gamma: float = 1.0):
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must lie in (0, 1], got {gamma}")
        self.gamma = gamma
        self.num_observations = 0
        self._mass = np.zeros(0)  # [max_key + 1], scaled by self._scale
        self._scale = 1.0

    def observe(self, depth: int, entry_len: int | None = None) -> None:
        if depth < 0:
            raise ValueError(f"overlap depth must be >= 0, got {depth}")
        if entry_len is not None and depth > entry_len:
            raise ValueError(f"overlap depth {depth} exceeds the entry's length {entry_len}")
        self._add(self._key(depth, entry_len))

    def _key(self, depth: int, entry_len: int | None) -> int:
        return depth

    def _add(self, key: int) -> None:
        if key >= self._mass.size:
            self._mass = np.concatenate([self._mass, np.zeros(max(key + 1 - self._mass.size, self._mass.size))])
        self._scale /= self.gamma  # NOTE: older mass shrinks by γ relative to the newest (weight 1).
        if self._scale > MAX_SCALE:
            self._mass /= self._scale
            self._scale = 1.0
        self._mass[key] += self._scale
        self.num_observations += 1

    def key_mass(self) -> np.ndarray:
        """[max_key + 1] mass per key, the newest observation weighing 1."""
        return self._mass / self._scale

    def weights(self, num_tokens: int) -> np.ndarray:
        """[num_tokens + 1] estimated mass of depths 0..num_tokens."""
        mass = self.key_mass()[: num_tokens + 1]
        return np.pad(mass, (0, num_tokens + 1 - mass.size))


class SuffixHistogram(DepthHistogram):
    """Mass of each distance from the entry's end, d = entry_len − depth, mapped to t = N − d."""

    def _key(self, depth: int, entry_len: int | None) -> int:
        if entry_len is None:
            raise ValueError("SuffixHistogram needs the entry's length with every observation")
        return entry_len - depth

    def weights(self, num_tokens: int) -> np.ndarray:
        mass = self.key_mass()[: num_tokens + 1][::-1]  # index N − d
        return np.pad(mass, (num_tokens + 1 - mass.size, 0))


ESTIMATORS = {"depth": DepthHistogram, "suffix": SuffixHistogram}


def make_estimator(kind: str, gamma: float = 1.0) -> DepthHistogram:
    if kind not in ESTIMATORS:
        raise ValueError(f"unknown estimator {kind!r}; choose from {sorted(ESTIMATORS)}")
    return ESTIMATORS[kind](gamma)
