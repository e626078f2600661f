import numpy as np
import pytest

from minipic_lite.checkpoints import DepthHistogram, EntryHistory, Planner, SuffixHistogram, make_estimator
from minipic_lite.checkpoints.estimators import scale_free_prior, uniform_prior


def test_weights_follow_gamma_to_the_age():
    histogram = DepthHistogram(gamma=0.5, prior_weight=0.0)
    for depth in (3, 1, 3, 2):  # ages 3, 2, 1, 0
        histogram.observe(depth, entry_len=10)
    assert histogram.weights(5).tolist() == [0.0, 0.25, 1.0, 0.5 + 0.125, 0.0, 0.0]
    assert histogram.num_observations == 4


def test_decay_survives_rescaling_over_long_streams():
    histogram = DepthHistogram(gamma=0.5, prior_weight=0.0)
    for age in range(600, -1, -1):  # 2^600 passes the rescale bound
        histogram.observe(age % 7, entry_len=10)
    weights = histogram.weights(10)
    expected = np.zeros(11)
    for age in range(600, -1, -1):
        expected[age % 7] += 0.5**age
    np.testing.assert_allclose(weights, expected, rtol=1e-12)


def test_empirical_histogram_counts_and_drops_depths_past_the_entry():
    histogram = DepthHistogram(prior_weight=0.0)
    for depth in (2, 2, 4, 9):
        histogram.observe(depth, entry_len=9)
    assert histogram.weights(4).tolist() == [0.0, 0.0, 2.0, 0.0, 1.0]


def test_prior_is_scale_free_and_sums_to_one():
    prior = scale_free_prior(4)  # ∝ 1/4, 1/3, 1/2, 1/1 on t = 1..4
    total = 1 / 4 + 1 / 3 + 1 / 2 + 1
    np.testing.assert_allclose(prior, [0.0, 0.25 / total, (1 / 3) / total, 0.5 / total, 1 / total])
    histogram = DepthHistogram(prior_weight=2.0)
    histogram.observe(1, entry_len=4)
    np.testing.assert_allclose(histogram.weights(4), 2.0 * prior + [0, 1, 0, 0, 0])


def test_suffix_histogram_maps_distance_from_the_end():
    histogram = SuffixHistogram(prior_weight=0.0)
    histogram.observe(7, entry_len=10)  # left 3 tokens before the end
    histogram.observe(0, entry_len=2)  # left 2 before the end
    assert histogram.weights(20)[[17, 18]].tolist() == [1.0, 1.0]
    assert histogram.weights(20).sum() == 2.0
    assert histogram.weights(2).tolist() == [1.0, 0.0, 0.0]  # d = 3 > N falls off


def test_entry_history_weights_by_hand():
    estimator = EntryHistory(gamma=0.5, prior_weight=0.0)
    r1, r2 = np.array([1, 2, 3, 4, 5]), np.array([1, 2, 9, 9])
    estimator.observe_request(r1, 0, None)
    estimator.observe_request(r2, 2, r1)  # left r1 at depth 2: d = 5 − 2 = 3
    entry = np.array([1, 2, 3, 4, 5, 6, 7, 8])  # N = 8
    # history: LCP(r2[:-1], entry) = 2 (age 0, weight 1), LCP(r1[:-1], entry) = 4 (age 1, weight 0.5);
    # beyond the known prefix a = 4 the entry's own request leaves at N − d = 5 (one observation), hedged one
    # token earlier (⌈0.1·3⌉ = 1, down to a = 4 at most): half at 4, half at 5
    assert estimator.weights_for(entry).tolist() == [0, 0, 1.0, 0, 0.5 + 0.5, 0.5, 0, 0, 0]
    assert estimator.plan_key(entry) is None


def test_entry_history_is_uniform_past_the_known_prefix_until_a_request_leaves_an_entry_there():
    estimator = EntryHistory(prior_weight=2.0, uniform_until_observed=True)
    estimator.observe_request(np.array([1, 2, 9, 9]), 0, None)
    entry = np.array([1, 2, 3, 4, 5])  # N = 5, known prefix a = 2 (LCP of [1, 2, 9] with it)
    # history 1 at depth 2; the entry's own request spread evenly over (2, 5]; the prior: 2 × 1/5 on 1..5
    np.testing.assert_allclose(estimator.weights_for(entry), [0, 0.4, 1.4, 1 / 3 + 0.4, 1 / 3 + 0.4, 1 / 3 + 0.4])
    assert uniform_prior(4).tolist() == [0.0, 0.25, 0.25, 0.25, 0.25]
    estimator.observe_request(np.array([1, 2, 3, 4, 8]), 4, entry)  # left it past a = 2: d = 1 is learned
    # now as without the option: history at 2 and 4 (a = 4), the own request by the suffix model (d = 1: t = 4,
    # plus its scale-free prior of weight 2), the scale-free prior
    own = np.array([0, 0, 0, 0, 1, 0]) + 2.0 * scale_free_prior(5)
    expected = np.array([0, 0, 1, 0, 1, 0]) + own / own.sum() + 2.0 * scale_free_prior(5)
    np.testing.assert_allclose(estimator.weights_for(entry), expected)


def test_entry_history_puts_the_own_request_where_its_group_leaves_even_below_the_known_prefix():
    # a document of 7 tokens, then each request's own question; two questions begin alike ([30, 31, ...])
    document = list(range(1, 8))
    first, second = np.array(document + [20, 21, 22, 23]), np.array(document + [30, 31, 32, 33])
    estimator = EntryHistory(prior_weight=0.0)
    estimator.observe_request(first, 0, None)
    estimator.observe_request(second, 7, first)  # left `first` where the document ends: d = 11 − 7 = 4
    entry = np.array(document + [30, 31, 40, 41])  # N = 11; `second` shares 2 tokens of its question: a = 9
    # history at 7 (first) and 9 (second); the entry's own request: its group leaves at N − d = 7, below a
    # (spread past a only, as before, it had no mass at all: [.., 1, 0, 1, 0, 0])
    assert estimator.weights_for(entry).tolist() == [0, 0, 0, 0, 0, 0, 0, 2.0, 0, 1.0, 0, 0]


def test_entry_history_hedges_a_learned_distance_towards_earlier_depths():
    # the first document's questions are 10 tokens; a new document's are 11 (10% longer)
    first_doc, new_doc = list(range(1, 21)), list(range(101, 121))
    first = np.array(first_doc + list(range(30, 40)))  # 30 tokens
    entry = np.array(new_doc + list(range(50, 61)))  # N = 31: its group leaves at 20, d = 11

    def learned(**options) -> EntryHistory:
        estimator = EntryHistory(prior_weight=0.0, **options)
        estimator.observe_request(first, 0, None)
        estimator.observe_request(np.array(first_doc + list(range(40, 50))), 20, first)  # d = 30 − 20 = 10
        return estimator

    # history: two requests at depth 0; the own request at N − d = 21, hedged over 21 − ⌈0.1·10⌉ = 20..21
    assert learned().weights_for(entry)[[0, 20, 21]].tolist() == [2.0, 0.5, 0.5]
    assert learned(suffix_hedge=0.0).weights_for(entry)[[0, 20, 21]].tolist() == [2.0, 0.0, 1.0]
    # one checkpoint: hedged at 20, where the new document's requests leave; unhedged at 21, past them, of no use
    assert Planner("dp", 1, learned()).plan(entry) == [20]
    assert Planner("dp", 1, learned(suffix_hedge=0.0)).plan(entry) == [21]


def test_entry_history_learns_distances_only_past_the_known_prefix():
    estimator = EntryHistory(prior_weight=0.0)
    first = np.array([1, 2, 3, 4, 5, 6])
    estimator.observe_request(first, 0, None)
    entry = np.array([1, 2, 3, 7, 7, 7, 7])
    estimator.weights_for(entry)  # planned: its known prefix is 3
    estimator.observe_request(np.array([1, 2, 3, 7, 8]), 4, entry)  # past 3: teaches d = 7 − 4 = 3
    estimator.observe_request(np.array([1, 2, 5]), 2, entry)  # within the known prefix: history only
    assert estimator.suffix.key_mass().tolist() == [0.0, 0.0, 0.0, 1.0]
    assert len(estimator.history) == 3


def test_planner_replans_every_k_observations():
    planner = Planner("dp", 2, DepthHistogram(prior_weight=0.0), replan_every=2)
    entry, request = np.arange(10), np.arange(12)
    assert planner.plan(entry) == []  # nothing observed yet
    planner.observe(request, 5, entry)
    assert planner.plan(entry) == []  # one observation: the old plan stands
    planner.observe(request, 5, entry)
    assert planner.plan(entry) == [5]  # fewest checkpoints: a second one would save nothing
    planner.observe(request, 9, entry)
    assert planner.plan(entry) == [5]  # stale: a fresh plan would add 9
    planner.observe(request, 9, entry)
    assert planner.plan(entry) == [5, 9]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: DepthHistogram(gamma=0.0), r"gamma must lie in \(0, 1\]"),
        (lambda: EntryHistory(gamma=1.5), r"gamma must lie in \(0, 1\]"),
        (lambda: DepthHistogram(prior_weight=-1.0), "prior_weight must be >= 0"),
        (lambda: DepthHistogram().observe(5, entry_len=4), r"0..entry_len = 4, got 5"),
        (lambda: DepthHistogram().weights(0), "N >= 1"),
        (lambda: EntryHistory(window=0), "window must be >= 1"),
        (lambda: EntryHistory(suffix_hedge=-0.1), "suffix_hedge must be >= 0"),
        (lambda: make_estimator("oracle"), "unknown estimator 'oracle'"),
        (lambda: Planner("dp", 2), "pass an estimator"),
        (lambda: Planner("sqrt", 2, replan_every=0), "replan_every must be >= 1"),
    ],
    ids=["gamma=0", "gamma>1", "prior", "depth>len", "N=0", "window", "hedge", "kind", "no-estimator", "replan"],
)
def test_bad_input_raises_naming_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_entry_history_puts_half_its_prior_on_the_entrys_branch_points():
    start = 1  # the turn-start token
    estimator = EntryHistory(prior_weight=2.0, uniform_until_observed=True, turn_start_id=start)
    estimator.observe_request(np.array([start, 5, 9, 9]), 0, None)
    entry = np.array([start, 5, start, 6, start])  # N = 5; turns start at 0, 2, 4: the branch point is 2
    # history 1 at depth 2 (a = 2); the own request evenly over (2, 5]; the prior 2 × 1/5 on 1..5, half of it
    # moved onto the branch point: 0.2 on each depth and 1.0 more at 2
    np.testing.assert_allclose(estimator.weights_for(entry), [0, 0.2, 2.2, 1 / 3 + 0.2, 1 / 3 + 0.2, 1 / 3 + 0.2])
    no_turns = np.array([7, 5, 7, 6, 7])
    estimator.observe_request(np.array([7, 5, 9]), 0, None)
    # no turn starts in it: the whole prior stays spread evenly (history: depth 0 and depth 2, a = 2)
    np.testing.assert_allclose(estimator.weights_for(no_turns), [1, 0.4, 1.4, 1 / 3 + 0.4, 1 / 3 + 0.4, 1 / 3 + 0.4])


def test_entry_history_keeps_the_own_request_out_of_turns_shared_whole():
    # chat turns (turn start 1): a system prompt [0, 6), a user turn from 6, the assistant header
    system = [1, 5, 6, 7, 8, 9]
    first = np.array(system + [1, 20, 40, 41, 42, 43, 44, 45, 46, 1, 30])  # 17 tokens
    second = np.array(system + [1, 20, 50, 1, 30])
    entry = np.array(system + [1, 20, 60, 61, 1, 30])  # N = 12, branch point 6; both requests reach a = 8
    for turn_start_id, own_at in ((None, 3), (1, None)):
        estimator = EntryHistory(prior_weight=0.0, turn_start_id=turn_start_id)
        estimator.observe_request(first, 0, None)
        estimator.observe_request(second, 8, first)  # left `first` 9 tokens before its end: d = 9
        expected = [0.0] * 13
        expected[8] = 2.0
        if own_at is not None:  # no turns: the own request at N − d = 3; with turns, 3 lies in a turn shared whole
            expected[own_at] = 1.0
        assert estimator.weights_for(entry).tolist() == expected
