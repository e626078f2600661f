"""SamplingParams validation at its edges, `stop` given as one string, switches that are no bool, and its docstring."""

import pytest

from minipic_lite.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"top_k": -2}, ValueError),  # 0 (or vLLM's -1) disables it; below that is nonsense
        ({"max_tokens": 2.5}, TypeError),
        ({"max_tokens": 4.0}, TypeError),  # a float, even a whole one, is no token count
    ],
)
def test_nonsense_at_the_edges_is_rejected(kwargs, error):
    with pytest.raises(error, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


def test_vllms_minus_one_for_top_k_means_no_cut_as_0_does():
    """vLLM code passes top_k=-1 for "consider every token" (vLLM refused 0 until it took both): it is taken as 0."""
    assert SamplingParams(top_k=-1).top_k == 0 == SamplingParams(top_k=0).top_k


def test_one_stop_string_is_one_stop_not_its_characters():
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")


def test_temperatures_below_vllms_eps_are_greedy():
    """vLLM samples greedily below 1e-5 (`_SAMPLING_EPS`); from it on a row samples."""
    assert SamplingParams(temperature=0.0).is_greedy and SamplingParams(temperature=1e-6).is_greedy
    assert not SamplingParams(temperature=1e-5).is_greedy


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": float("inf")}, r"temperature must be a finite number >= 0, got inf"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"stop": ["a", 5]}, r"stop must be non-empty strings, got \('a', 5\)"),
        ({"stop_token_ids": [True]}, r"stop_token_ids must be non-negative ints, got \(True,\)"),
        ({"stop_token_ids": [2.5]}, r"stop_token_ids must be non-negative ints, got \(2.5,\)"),
    ],
)
def test_values_outside_a_params_range_name_the_range_and_the_value(kwargs, message):
    """An infinite temperature, a top-p past 1, a stop that is no string, a bool or a float for a stop token: each is a
    ValueError that says what the parameter takes and what it got."""
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_token_id_zero_is_a_stop_token_and_any_iterable_gives_the_stops():
    """Token id 0 is a real token (SmolLM2's <|endoftext|>); stops may come from any iterable, a generator included."""
    assert SamplingParams(stop_token_ids=[0, 2]).stop_token_ids == (0, 2)
    assert SamplingParams(stop_token_ids=(t for t in (5, 7))).stop_token_ids == (5, 7)
    assert SamplingParams(stop=(s for s in ("x", "yz"))).stop == ("x", "yz")


def test_the_defaults_are_64_tokens_at_temperature_1_with_no_cut_no_seed_and_no_stop():
    """SamplingParams() (README): 64 tokens at temperature 1.0 over the whole vocabulary (no top-k, top-p 1, min-p 0),
    no penalty, unseeded, stopping at EOS only, its text detokenized without special tokens."""
    params = SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_k, params.top_p, params.seed) == (64, 1.0, 0, 1.0, None)
    assert (params.stop, params.stop_token_ids, params.ignore_eos) == ((), (), False)
    assert (params.skip_special_tokens, params.detokenize, params.is_greedy) == (True, True, False)
    penalties = (params.min_p, params.repetition_penalty, params.presence_penalty, params.frequency_penalty)
    assert penalties == (0.0, 1.0, 0.0, 0.0) and not params.has_penalties


def test_none_for_stop_or_stop_token_ids_means_none_and_a_non_sequence_is_named():
    """vLLM takes stop=None and stop_token_ids=None: no stops. Something that is not a sequence is a TypeError that
    names the parameter, not Python's 'object is not iterable'."""
    params = SamplingParams(stop=None, stop_token_ids=None)
    assert (params.stop, params.stop_token_ids) == ((), ())
    with pytest.raises(TypeError, match="stop_token_ids must be a sequence \\(or None\\), got int"):
        SamplingParams(stop_token_ids=7)
    with pytest.raises(TypeError, match="stop must be a sequence \\(or None\\), got int"):
        SamplingParams(stop=7)


@pytest.mark.parametrize(
    ("kwargs", "kind"),
    [({"stop": {"END": 1}}, "dict"), ({"stop_token_ids": {2: "eos"}}, "dict"), ({"stop_token_ids": "ab"}, "str"),
     ({"stop_token_ids": b"ab"}, "bytes")],
)  # fmt: skip
def test_a_mapping_or_text_is_no_sequence_of_stops(kwargs, kind):
    """A dict's keys or a string's characters would pass for stops (a dict of stops is taken as its keys silently)."""
    (name,) = kwargs
    with pytest.raises(TypeError, match=f"{name} must be a sequence \\(or None\\), got {kind}"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("name", ["ignore_eos", "skip_special_tokens", "detokenize"])
@pytest.mark.parametrize("value", ["no", None, 0], ids=["str", "None", "int"])
def test_a_switch_takes_a_bool_only(name, value):
    """`ignore_eos="false"` is truthy: taken as given, it ignored EOS. A switch that is no bool is a TypeError naming
    it."""
    with pytest.raises(TypeError, match=f"{name} must be a bool, got {type(value).__name__}"):
        SamplingParams(**{name: value})


def test_help_names_every_field_and_its_default():
    """`help(SamplingParams)` was the dataclass's bare signature: the class says what each field does."""
    from dataclasses import fields

    doc = SamplingParams.__doc__
    assert not doc.startswith("SamplingParams(")  # the dataclass's generated one is the signature alone
    assert all(f"{f.name}:" in doc for f in fields(SamplingParams))


def test_a_numpy_bool_is_a_bool_to_a_switch():
    import numpy as np

    assert SamplingParams(ignore_eos=np.bool_(True)).ignore_eos is True
