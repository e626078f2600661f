"""`SamplingParams.truncate_prompt_tokens` (vLLM's left truncation): a prompt keeps its last k tokens and runs as
those tokens given alone would (SmolLM2, fp32, CPU); -1 keeps as many as leave one token to generate; span prompts
and bad values are refused with messages naming the field."""

import numpy as np
import pytest

import minipic_lite as mp

TEXT = "The quick brown fox jumps over the lazy dog. " * 12 + "The fox is"


def greedy(**extra) -> mp.SamplingParams:
    return mp.SamplingParams(max_tokens=4, temperature=0.0, **extra)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "8"])
def test_a_bad_truncate_prompt_tokens_is_an_error_naming_it(bad):
    with pytest.raises((ValueError, TypeError), match="truncate_prompt_tokens"):
        mp.SamplingParams(truncate_prompt_tokens=bad)


def test_a_numpy_truncate_prompt_tokens_is_kept_as_a_python_int():
    """A numpy integer is the Python int it holds, as every integer field is."""
    keep = mp.SamplingParams(truncate_prompt_tokens=np.int64(20)).truncate_prompt_tokens
    assert keep == 20 and type(keep) is int


def test_a_truncated_prompt_is_its_last_k_tokens_given_alone(llm):
    ids, _ = llm.encode(TEXT)
    truncated, alone = llm.generate([TEXT, ids[-20:]], [greedy(truncate_prompt_tokens=20), greedy()], use_tqdm=False)
    assert truncated.prompt_token_ids == ids[-20:] and truncated.prompt == TEXT
    assert truncated.token_ids == alone.token_ids
    (whole,) = llm.generate(TEXT, greedy(truncate_prompt_tokens=len(ids) + 5), use_tqdm=False)
    assert whole.prompt_token_ids == ids, "a prompt shorter than k is kept whole"


def test_minus_one_keeps_what_leaves_one_token_to_generate(model_dir):
    small = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=64)
    try:
        ids, _ = small.encode(TEXT)
        assert len(ids) > 64
        with pytest.raises(ValueError, match="the model's context is 64"):
            small.generate(TEXT, greedy(), use_tqdm=False)
        (out,) = small.generate(TEXT, greedy(truncate_prompt_tokens=-1), use_tqdm=False)
        assert out.prompt_token_ids == ids[-63:]
        assert len(out.token_ids) == 1 and out.finish_reason == "length", "the context holds one new token"
    finally:
        small.close()


def test_a_prompt_with_span_markers_is_refused_a_cut_and_runs_where_it_fits(llm):
    """Composed, or as plain ids whose markers take effect: a cut would misalign its spans (the error says so, not
    the layout's advice on padding); a k it fits in changes nothing."""
    prompt = llm.composer.block_attention("You answer briefly.", ["Paris is in France."], "Where is Paris?")
    for given in (prompt, list(prompt.token_ids)):
        with pytest.raises(ValueError, match="truncate_prompt_tokens=8 would cut a prompt with span markers"):
            llm.generate(given, greedy(truncate_prompt_tokens=8), use_tqdm=False)
    whole, fits = llm.generate([prompt, prompt], [greedy(), greedy(truncate_prompt_tokens=-1)], use_tqdm=False)
    assert fits.prompt_token_ids == whole.prompt_token_ids and fits.token_ids == whole.token_ids


def test_a_span_prompt_exactly_k_tokens_long_is_not_cut(llm):
    """k equal to the prompt's length keeps it whole: no cut, so no refusal of a prompt with span markers."""
    prompt = llm.composer.block_attention("You answer briefly.", ["Paris is in France."], "Where is Paris?")
    keep = len(prompt.token_ids)
    whole, exact = llm.generate([prompt, prompt], [greedy(), greedy(truncate_prompt_tokens=keep)], use_tqdm=False)
    assert exact.prompt_token_ids == whole.prompt_token_ids and exact.token_ids == whole.token_ids


def test_token_ids_with_a_prompt_depend_marker_alone_are_refused_a_cut(llm):
    """A PDEP marker is a span marker too: plain ids holding one (and no SSEP) are refused a cut, as SSEP's are."""
    ids, _ = llm.encode(TEXT)
    block, pdep = llm.config.cache.block_size, llm.config.control.pdep_id
    given = [*ids[:block], pdep, *ids[-block:]]
    with pytest.raises(ValueError, match=f"truncate_prompt_tokens={len(given) - 1} would cut a prompt with span"):
        llm.generate(given, greedy(truncate_prompt_tokens=len(given) - 1), use_tqdm=False)
