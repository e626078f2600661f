"""SamplingParams validation at its edges, and `stop` given as one string."""

import pytest

from minipic_lite.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"top_k": -1}, ValueError),  # 0 disables it; below that is nonsense
        ({"max_tokens": 2.5}, TypeError),
        ({"max_tokens": 4.0}, TypeError),  # a float, even a whole one, is no token count
    ],
)
def test_nonsense_at_the_edges_is_rejected(kwargs, error):
    with pytest.raises(error, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


def test_one_stop_string_is_one_stop_not_its_characters():
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")


def test_only_temperature_zero_is_greedy():
    assert SamplingParams(temperature=0.0).is_greedy
    assert not SamplingParams(temperature=1e-6).is_greedy
