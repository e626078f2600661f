"""Edges of SamplingParams (sampling_params.py) that test_sampling_params leaves open: the first value each check
refuses and the last it takes (max_tokens, temperature, top_p, the 64-bit seed), a bool or text where a number goes,
a numpy integer where a switch goes, and params that stay as they were checked."""

import dataclasses

import numpy as np
import pytest

from minipic_lite.sampling_params import SamplingParams


def test_one_token_is_the_fewest_max_tokens():
    assert SamplingParams(max_tokens=1).max_tokens == 1
    with pytest.raises(ValueError, match=r"max_tokens must be an integer >= 1, got 0"):
        SamplingParams(max_tokens=0)


def test_a_negative_temperature_is_refused_however_small():
    """Temperature 0 is greedy; anything below it is nonsense, -0.5 as much as -2."""
    assert SamplingParams(temperature=0.0).is_greedy
    with pytest.raises(ValueError, match=r"temperature must be a finite number >= 0, got -0.5"):
        SamplingParams(temperature=-0.5)


def test_top_p_of_zero_is_refused_and_one_is_taken():
    """top_p lies in (0, 1]: 0 would keep no token (the top one survives only a positive top_p)."""
    assert SamplingParams(top_p=1.0).top_p == 1.0
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 0.0"):
        SamplingParams(top_p=0.0)


@pytest.mark.parametrize(("name", "value", "kind"), [("temperature", True, "bool"), ("top_p", "0.9", "str")])
def test_a_bool_or_text_for_a_number_is_a_type_error_naming_it(name, value, kind):
    """True would pass for temperature 1 and "0.9" fail later with a message naming nothing: both are refused here."""
    with pytest.raises(TypeError, match=f"{name} must be a number, got {kind}"):
        SamplingParams(**{name: value})


def test_the_seed_takes_every_64_bit_value_torch_takes_and_nothing_past_them():
    """torch.Generator.manual_seed takes [-2**63, 2**64 - 1]; a seed past either end would fail inside the engine's
    step, so it is refused when the params are made."""
    for seed in (-(2**63), 2**64 - 1):
        assert SamplingParams(seed=seed).seed == seed
    for seed in (-(2**63) - 1, 2**64):
        with pytest.raises(ValueError, match=r"seed must lie in \[-2\*\*63, 2\*\*64 - 1\]"):
            SamplingParams(seed=seed)


def test_a_numpy_integer_is_no_switch():
    """A numpy bool is a bool to a switch (test_sampling_params), a numpy integer is not: 1 is no bool."""
    with pytest.raises(TypeError, match="ignore_eos must be a bool, got int64"):
        SamplingParams(ignore_eos=np.int64(1))


def test_params_are_frozen_once_checked():
    """One SamplingParams serves many requests (generate(prompts, params)): a field set after the checks would
    bypass them, so none can be set."""
    params = SamplingParams(max_tokens=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.max_tokens = 0
    assert params.max_tokens == 8


def test_a_negative_stop_token_id_is_refused():
    """Token ids start at 0 (a real token): -1 is no token, though vLLM code passes -1 elsewhere for "none"."""
    with pytest.raises(ValueError, match=r"stop_token_ids must be non-negative ints, got \(-1,\)"):
        SamplingParams(stop_token_ids=[-1])
