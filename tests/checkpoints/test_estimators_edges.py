"""EntryHistory's known prefix at its edges: a request that leaves exactly there, a known prefix that is exactly a
branch point, entries remembered for more than one window and, past four windows of them, forgotten oldest first;
and make_estimator's names."""

import numpy as np

from minipic_lite.checkpoints import DepthHistogram, EntryHistory, SuffixHistogram, make_estimator


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
