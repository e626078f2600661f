"""A placement policy fed by an online overlap estimator, re-planned every k observations."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
    estimator: object | None = None
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
        num_tokens = len(entry_token_ids)
        if not self.is_weight_aware:
            key = num_tokens
        else:
            key = self.estimator.plan_key(entry_token_ids)
        if key is None or key not in self._plans:
            if self.is_weight_aware:
                weights = self.estimator.weights_for(np.asarray(entry_token_ids))
            else:
                weights = np.zeros(num_tokens + 1)
            positions = plan(self.policy, weights, self.budget, bin_size=self.bin_size, **self.options)
            if key is None:
                return positions
            self._plans[key] = positions
        return self._plans[key]
