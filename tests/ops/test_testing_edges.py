"""The op tests' own yardstick, `ops.testing.assert_close`, held to what its docstring says: every op test and the GPU
validation cases pass through it, so a yardstick that let everything through would leave them all unable to fail.
Elementwise `|a - e| <= atol + rtol * |e|` at its edge and just past it, each element against its own magnitude (not
the tensor's largest), and non-finite outputs refused even where the reference holds the same value. Beside it, the
Triton op's refusal of a config whose split count it cannot launch (sweeps pass configs by hand)."""

import pytest
import torch

from ops import triton_kernel as tk
from ops.testing import SeqSpec, assert_close, make_problem, max_errors

EXPECTED = torch.tensor([1000.0, 1.0, -2.0, 0.0])


def test_an_error_at_the_tolerance_passes_and_just_past_it_fails():
    atol, rtol = 0.5, 0.25  # exact in binary: the edge is not blurred by rounding
    edge = EXPECTED + (atol + rtol * EXPECTED.abs())  # every element exactly at its own bound
    assert_close(edge, EXPECTED, atol, rtol)
    past = edge.clone()
    past[2] += 0.25  # one element past its bound
    with pytest.raises(AssertionError, match="1 elements off"):
        assert_close(past, EXPECTED, atol, rtol, "past")


def test_each_element_is_held_to_its_own_magnitude_not_the_largest():
    """An error of 10 is within rtol 0.02 of 1000 but not of 1: the small element fails on its own."""
    assert_close(EXPECTED + torch.tensor([10.0, 0, 0, 0]), EXPECTED, 0.0, 0.02)
    with pytest.raises(AssertionError, match="1 elements off"):
        assert_close(EXPECTED + torch.tensor([0, 10.0, 0, 0]), EXPECTED, 0.0, 0.02)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_output_fails_even_where_the_reference_holds_it(bad):
    actual, expected = EXPECTED.clone(), EXPECTED.clone()
    actual[3] = expected[3] = bad
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(actual, expected, 1.0, 1.0, "nan")


def test_max_errors_reports_the_largest_error_and_its_ratio_to_the_largest_reference():
    abs_err, rel_err = max_errors(EXPECTED + torch.tensor([0, 0, 4.0, 0]), EXPECTED)
    assert (abs_err, rel_err) == (4.0, 4.0 / 1000.0)


@pytest.mark.parametrize("num_splits", [0, tk.MAX_CONFIG_SPLITS + 1])
def test_a_config_asking_for_splits_out_of_range_is_refused_before_any_launch(num_splits):
    problem = make_problem([SeqSpec.decode(40)])
    with pytest.raises(ValueError, match=rf"NUM_SPLITS must lie in \[1, {tk.MAX_CONFIG_SPLITS}\], got {num_splits}"):
        tk.rope_paged_attention_triton(*problem.args(), config={"NUM_SPLITS": num_splits})
