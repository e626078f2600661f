"""EntryHistory's known prefix at its edges: a request that leaves exactly there, a known prefix that is exactly a
branch point, entries remembered for more than one window and, past four windows of them, forgotten oldest first;
and make_estimator's names. Also: hedge_earlier by hand, a one-token entry, the observation count,
the branch prior over several points, the own request kept out of shared turns and off depth 0, a negative depth,
and the known prefix of an entry never planned."""

import numpy as np
import pytest

from minipic_lite.checkpoints import DepthHistogram, EntryHistory, SuffixHistogram, make_estimator
from minipic_lite.checkpoints.estimators import hedge_earlier


def test_a_request_that_leaves_exactly_at_the_known_prefix_teaches_no_distance():
    estimator = EntryHistory(prior_weight=0.0)
    estimator.observe_request(np.array([1, 2, 3, 4, 5, 6]), 0, None)
    entry = np.array([1, 2, 3, 7, 7, 7, 7])
    estimator.weights_for(entry)  # its known prefix is 3
    estimator.observe_request(np.array([1, 2, 3, 8]), 3, entry)  # leaves at 3: what history already knew
    assert estimator.suffix.num_observations == 0 and estimator.suffix.key_mass().sum() == 0.0


def test_a_known_prefix_that_is_a_branch_point_keeps_the_own_request_out_of_the_turns_before_it():
    # chat turns (turn start 1): a system prompt [0, 6), then a user turn from 6: branch point 6
    system = [1, 5, 6, 7, 8, 9]
    first = np.array(system + [4, 4, 4, 4, 4])  # 11 tokens: it shares the system prompt only, a = 6
    estimator = EntryHistory(prior_weight=0.0, turn_start_id=1)
    estimator.observe_request(first, 0, None)
    estimator.observe_request(np.array([1, 5, 9, 9]), 2, first)  # left `first` at 2: d = 9
    entry = np.array(system + [1, 20, 60, 61, 1, 30])  # N = 12; the own request would leave at N − d = 3
    expected = [0.0] * 13
    expected[2] = expected[6] = 1.0  # history only: 3 lies in the system prompt, shared whole up to a = 6
    assert estimator.weights_for(entry).tolist() == expected


def test_known_prefixes_are_remembered_for_more_entries_than_the_window_holds():
    estimator = EntryHistory(prior_weight=0.0, window=1)
    estimator.observe_request(np.array([1, 2, 3, 4, 5, 6]), 0, None)
    entry = np.array([1, 2, 3, 7, 7, 7, 7])
    estimator.weights_for(entry)  # known prefix 3
    estimator.weights_for(np.array([9, 9, 9]))  # another entry planned since
    estimator.observe_request(np.array([1, 2, 5]), 2, entry)  # within entry's known prefix: teaches nothing
    assert estimator.suffix.num_observations == 0


def test_known_prefixes_are_kept_for_four_windows_of_entries_and_the_oldest_is_forgotten_first():
    """window=1 keeps 4 entries' known prefixes (memory stays bounded however many entries are planned). Once a fifth
    is planned, the first's is forgotten: a request that left it inside its old known prefix (depth 2 <= 3) now
    teaches the suffix model, as for an entry never seen; the second's is still known and teaches nothing."""
    estimator = EntryHistory(prior_weight=0.0, window=1)
    estimator.observe_request(np.array([1, 2, 3, 4, 5, 6]), 0, None)
    entries = [np.array([1, 2, 3, 7, 7, 7, 7]), np.array([1, 2, 3, 8, 8, 8, 8])] + [np.array([9, k, 9]) for k in (1, 2)]
    for entry in entries:
        estimator.weights_for(entry)
    estimator.observe_request(np.array([1, 2, 5]), 2, entries[0])
    assert estimator.suffix.num_observations == 0  # four entries: the first is still known
    estimator.weights_for(np.array([9, 3, 9]))  # the fifth
    assert len(estimator._known_prefix) == 4
    estimator.observe_request(np.array([1, 2, 5]), 2, entries[1])
    assert estimator.suffix.num_observations == 0
    estimator.observe_request(np.array([1, 2, 5]), 2, entries[0])
    assert estimator.suffix.num_observations == 1


def test_make_estimator_builds_the_named_kind_with_the_options_given():
    entry = make_estimator("entry", window=3, gamma=0.5)
    assert type(entry) is EntryHistory and (entry.history.maxlen, entry.gamma) == (3, 0.5)
    assert type(make_estimator("depth")) is DepthHistogram and type(make_estimator("suffix")) is SuffixHistogram


def test_hedge_earlier_spreads_each_depth_evenly_over_a_share_of_its_distance_from_the_end():
    """N = 10, hedge 1.0: the mass at 6 spreads over 6 − ⌈1.0·4⌉ = 2..6 (a fifth each); at 10 it stays."""
    weights = np.zeros(11)
    weights[[6, 10]] = [1.0, 3.0]
    np.testing.assert_allclose(hedge_earlier(weights, 1.0, 0), [0, 0, 0.2, 0.2, 0.2, 0.2, 0.2, 0, 0, 0, 3.0])


def test_a_one_token_entry_has_all_of_the_prior_at_its_end():
    assert DepthHistogram().weights(1).tolist() == [0.0, 1.0]


def test_entry_history_counts_every_request_it_observes():
    """With or without a cached entry to leave, each observed request counts once."""
    estimator = EntryHistory()
    assert estimator.num_observations == 0
    estimator.observe_request(np.array([1, 2, 3]), 0, None)
    estimator.observe_request(np.array([1, 2, 4]), 2, np.array([1, 2, 3]))
    assert estimator.num_observations == 2


def test_entry_history_shares_the_branch_prior_evenly_among_several_branch_points():
    """N = 7, turns start at 0, 2, 4, 6: branch points 2 and 4. No traffic: the own request evenly over 1..7
    (1/7 each); of the prior (weight 2) half stays even (1/7 each), half (1.0) is split between the two points."""
    estimator = EntryHistory(prior_weight=2.0, uniform_until_observed=True, turn_start_id=1)
    weights = estimator.weights_for(np.array([1, 5, 1, 6, 1, 7, 1]))
    np.testing.assert_allclose(weights, [0] + [2 / 7, 2 / 7 + 0.5, 2 / 7, 2 / 7 + 0.5, 2 / 7, 2 / 7, 2 / 7])


def test_a_negative_depth_is_refused():
    with pytest.raises(ValueError, match="overlap depth must lie in 0..entry_len = 4, got -1"):
        DepthHistogram().observe(-1, entry_len=4)


def test_an_entry_never_planned_has_an_empty_known_prefix():
    """Any depth past 0 on it teaches a distance (here d = 4 − 1 = 3); leaving it at 0 teaches nothing."""
    estimator = EntryHistory(prior_weight=0.0)
    entry = np.array([1, 2, 3, 4])
    estimator.observe_request(np.array([9, 9]), 0, entry)
    assert estimator.suffix.num_observations == 0
    estimator.observe_request(np.array([1, 9]), 1, entry)
    assert estimator.suffix.key_mass().tolist() == [0.0, 0.0, 0.0, 1.0]


def test_the_own_request_stays_out_of_every_turn_before_the_deepest_branch_point_within_the_known_prefix():
    """Turns start at 0, 3, 6 and 10 (branch points 3 and 6); history reaches a = 7, so the turns before 6 are
    shared whole: the own request's learned t = N − d = 6 is dropped (as 4 or 5 would be), history alone remains."""
    estimator = EntryHistory(prior_weight=0.0, turn_start_id=1)
    first = np.array([1, 5, 6, 1, 7, 8, 1, 4, 4, 4, 4, 4])  # 12 tokens
    estimator.observe_request(first, 0, None)
    estimator.observe_request(np.array([1, 5, 6, 1, 7, 8, 9, 9]), 6, first)  # d = 12 − 6 = 6
    entry = np.array([1, 5, 6, 1, 7, 8, 1, 20, 21, 22, 1, 30])  # N = 12
    expected = [0.0] * 13
    expected[6] = expected[7] = 1.0  # the second request (LCP 6) and the first (LCP 7)
    assert estimator.weights_for(entry).tolist() == expected


def test_the_own_request_puts_no_mass_on_the_empty_prefix():
    """A learned distance equal to the entry's length maps to depth 0, which needs no checkpoint: dropped."""
    estimator = EntryHistory(prior_weight=0.0)
    first = np.arange(1, 11)  # 10 tokens
    estimator.observe_request(first, 0, None)
    estimator.observe_request(np.array([1, 2, 3, 9, 9]), 3, first)  # d = 10 − 3 = 7
    entry = np.arange(20, 27)  # N = 7, shares nothing: both requests at depth 0, the own request at 7 − 7 = 0
    assert estimator.weights_for(entry).tolist() == [2.0, 0, 0, 0, 0, 0, 0, 0]
