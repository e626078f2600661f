"""A placement policy fed by an online overlap estimator, re-planned every k observations; the engine's."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from minipic_lite.checkpoints.estimators import EntryHistory, OverlapEstimator, common_prefix_len
from minipic_lite.checkpoints.policies import WEIGHT_AWARE, plan
from minipic_lite.checkpoints.turns import branch_points, snap_to_turns

PLANNER_WINDOW = 512  # recent prompts the overlap estimate and the depth of a new prompt look at


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


class CheckpointPlanner:
    """`checkpoints.plan` positions for each new prompt; `dp` learns overlap depths from the engine's requests.

    While the estimator knows nothing about a new prompt (no recent request shares a token with it and no
    request has yet left a cached prompt at some depth), `dp` plans with `prior`, a policy that needs no
    traffic: the DP's own prior would put every checkpoint near the end, past where a second request with the
    same long prefix and its own long suffix leaves; with `balanced` that request already resumes at depth > 0.
    For the same reason the estimator spreads a prompt's own request uniformly (what `balanced` assumes) past
    the part recent prompts share with it until some request has left a prompt there
    (`EntryHistory(uniform_until_observed=True)`): a short shared header is evidence about the header only.

    With `turn_start_id` (the chat template's turn-start token) the prior's plan is moved up to the prompt's
    branch points (turns.py: the starts of its turns but the last), where a later request with the same system
    prompt or conversation leaves it; a prompt with no such turn keeps the prior's plan.
    """

    def __init__(self, policy: str, budget: int, bin_size: int, prior: str, window: int = PLANNER_WINDOW,
                 turn_start_id: int | None = None):  # fmt: skip
        estimator = (
            EntryHistory(window=window, uniform_until_observed=True, turn_start_id=turn_start_id)
            if policy == "dp"
            else None
        )
        self.planner = Planner(policy, budget, estimator, bin_size=bin_size)
        self.prior = Planner(prior, budget, None, bin_size=bin_size) if policy == "dp" else None
        self.turn_start_id = turn_start_id
        self.recent: deque[np.ndarray] = deque(maxlen=window)

    def has_evidence(self, token_ids: np.ndarray) -> bool:
        """The estimate for this prompt rests on traffic, not only on priors."""
        estimator = self.planner.estimator
        return estimator.suffix.num_observations > 0 or bool(estimator.history_weights(token_ids)[1:].any())

    def plan(self, token_ids) -> list[int]:
        ids = np.asarray(token_ids, dtype=np.int64)
        if self.prior is not None and not self.has_evidence(ids):
            return self.prior_plan(ids)
        return self.planner.plan(ids)

    def prior_plan(self, token_ids: np.ndarray) -> list[int]:
        """The prior's plan, moved up to the prompt's branch points when the chat turns are known."""
        positions = self.prior.plan(token_ids)
        if self.turn_start_id is None:
            return positions
        return snap_to_turns(positions, branch_points(token_ids, self.turn_start_id), self.prior.bin_size)

    def observe(self, token_ids) -> None:
        """A served prompt and its overlap depth with the recent prompt it shares most with (as simulator.py)."""
        ids = np.asarray(token_ids, dtype=np.int64)
        best, depth = None, 0
        for entry in self.recent:  # NOTE: oldest first: a tie goes to the most recent, as the simulator's LRU
            d = common_prefix_len(ids[:-1], entry)
            if d >= depth and d > 0:
                best, depth = entry, d
        self.planner.observe(ids, depth, best)
        self.recent.append(ids)
