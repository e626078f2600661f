"""EntryHistory's known prefix at its edges: a request that leaves exactly there, a known prefix that is exactly a
branch point, and entries remembered for more than one window."""

import numpy as np

from minipic_lite.checkpoints import EntryHistory


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
