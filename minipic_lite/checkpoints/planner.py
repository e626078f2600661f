"""A placement policy fed by an online estimator, re-planned every k observations."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minipic_lite.checkpoints.estimators import DepthHistogram
from minipic_lite.checkpoints.policies import WEIGHT_AWARE, plan


@dataclass
class Planner:
    """Plans for new cache entries by length; plans are reused until `replan_every` new observations.

    `estimator` is required by weight-aware policies (dp) and ignored by the baselines.
    """

    policy: str
    budget: int
    estimator: DepthHistogram | None = None
    replan_every: int = 1
    bin_size: int = 1
    options: dict = field(default_factory=dict)
    _plans: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False)
    _num_fresh: int = field(default=0, init=False, repr=False)

    def __post_init__(self):
        if self.replan_every < 1:
            raise ValueError(f"replan_every must be >= 1 observation, got {self.replan_every}")
        if self.policy in WEIGHT_AWARE and self.estimator is None:
            raise ValueError(f"policy {self.policy!r} plans from an overlap estimate: pass an estimator")

    @property
    def is_weight_aware(self) -> bool:
        return self.policy in WEIGHT_AWARE

    def observe(self, depth: int, entry_len: int) -> None:
        if self.estimator is None:
            return
        self.estimator.observe(depth, entry_len)
        self._num_fresh += 1
        if self._num_fresh >= self.replan_every:
            self._plans.clear()
            self._num_fresh = 0

    def plan(self, num_tokens: int) -> list[int]:
        """Checkpoint positions (in 1..num_tokens) for a new entry of num_tokens tokens."""
        if num_tokens not in self._plans:
            weights = self.estimator.weights(num_tokens) if self.is_weight_aware else np.zeros(num_tokens + 1)
            self._plans[num_tokens] = plan(
                self.policy, weights, self.budget, bin_size=self.bin_size, **self.options
            )
        return self._plans[num_tokens]
