"""A placement policy fed by an online overlap estimator, re-planned every k observations."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minipic_lite.checkpoints.estimators import OverlapEstimator
from minipic_lite.checkpoints.policies import WEIGHT_AWARE, plan


@dataclass
class Planner:
    """Places the checkpoints of each new cache entry; learns from every request it is shown.

    `estimator` (see estimators.py) is required by weight-aware policies (dp) and ignored by the baselines.
    A plan is reused for entries with the same `estimator.plan_key` (e.g. the same length) until
    `replan_every` new observations have arrived; baselines reuse plans per length for good.
    """

    policy: str
    budget: int
    estimator: OverlapEstimator | None = None
    replan_every: int = 1
    bin_size: int = 1
    options: dict = field(default_factory=dict)
    _plans: dict = field(default_factory=dict, init=False, repr=False)
    _num_fresh: int = field(default=0, init=False, repr=False)

    def __post_init__(self):
        if self.replan_every < 1:
            raise ValueError(f"replan_every must be >= 1 observation, got {self.replan_every}")
        if self.is_weight_aware and self.estimator is None:
            raise ValueError(f"policy {self.policy!r} plans from an overlap estimate: pass an estimator")

    @property
    def is_weight_aware(self) -> bool:
        return self.policy in WEIGHT_AWARE

    def observe(self, token_ids: np.ndarray, depth: int, entry_token_ids: np.ndarray | None) -> None:
        """A served request and its overlap depth with its best entry (None: nothing was cached)."""
        if not self.is_weight_aware:
            return
        self.estimator.observe_request(token_ids, depth, entry_token_ids)
        self._num_fresh += 1
        if self._num_fresh >= self.replan_every:
            self._plans.clear()
            self._num_fresh = 0

    def plan(self, entry_token_ids) -> list[int]:
        """Checkpoint positions, in 1..N, for a new entry of N tokens."""
        entry = np.asarray(entry_token_ids)
        key = self.estimator.plan_key(entry) if self.is_weight_aware else entry.size
        if key is not None and key in self._plans:
            return self._plans[key]
        weights = self.estimator.weights_for(entry) if self.is_weight_aware else np.zeros(entry.size + 1)
        positions = plan(self.policy, weights, self.budget, bin_size=self.bin_size, **self.options)
        if key is not None:
            self._plans[key] = positions
        return positions
