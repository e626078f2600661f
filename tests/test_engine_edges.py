"""Edges of the engine (engine.py) that the main tests leave open, on a tiny random Llama (no tokenizer): the first
and last ids of the vocabulary and a prompt one token short of the context are taken, the cache statistics of a
known run are exact (bursts, span prefills and hybrid checkpoints included), and an abort counts once, frees the id
and is a no-op the second time."""

import time

import numpy as np
import pytest
import torch

import minipic_lite as mp
from minipic_lite.hashing import as_token_ids, pack_token_ids, token_bytes
from minipic_lite.prompts import Prompt
from tests.conftest import save_tiny_llama
from tests.hybrid_models import make_hybrid

GREEDY4 = mp.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False)
PROMPT = list(range(5, 45))  # 40 tokens: blocks of 16 -> 2 full blocks and 8 tokens


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


def tiny_llm(tiny_dir) -> mp.LLM:
    return mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=16)


def test_the_ends_of_the_vocabulary_and_a_prompt_one_short_of_the_context_are_taken(tiny_dir):
    """Ids 0 and vocab - 1 and a prompt of max_model_len - 1 tokens pass; an id just past either end, after both
    ends, is the one the error names; params that are no SamplingParams are a TypeError naming their type."""
    llm = tiny_llm(tiny_dir)
    vocab, max_len = llm.config.model.vocab_size, llm.config.scheduler.max_model_len
    assert (vocab, max_len) == (32000, 128)
    llm.engine.validate([0, vocab - 1], GREEDY4)
    llm.engine.validate([1] * (max_len - 1), GREEDY4)
    # the error names the id outside, not an id at an end of the vocabulary beside it
    for bad in (vocab, -1):
        with pytest.raises(ValueError, match=rf"^token id {bad} is outside the vocabulary \[0, {vocab}\)$"):
            llm.engine.validate([0, vocab - 1, bad], GREEDY4)
    with pytest.raises(TypeError, match="sampling params must be a SamplingParams, got dict"):
        llm.engine.validate([1, 2], {"max_tokens": 4})
    llm.close()


def test_a_stop_token_id_past_the_vocabulary_is_refused_before_its_batch_is_queued(tiny_dir):
    """A stop id the model can never generate is a mistake (another tokenizer's id): the request that names it is
    refused with the id (a batch naming it, before any prompt is queued), the last id of the vocabulary is taken."""
    llm = tiny_llm(tiny_dir)
    vocab = llm.config.model.vocab_size
    llm.engine.validate([1, 2], mp.SamplingParams(max_tokens=2, stop_token_ids=[0, vocab - 1]))
    bad = mp.SamplingParams(max_tokens=2, stop_token_ids=[5, vocab + 7, vocab])
    with pytest.raises(ValueError, match=rf"^stop token id {vocab + 7} is outside the vocabulary \[0, {vocab}\): "):
        llm.engine.validate([1, 2], bad)
    with pytest.raises(ValueError, match=rf"^stop token id {vocab} is outside"):  # the first id past the end
        llm.engine.validate([1, 2], mp.SamplingParams(max_tokens=2, stop_token_ids=[vocab - 1, vocab]))
    with pytest.raises(ValueError, match=rf"^prompt 1: stop token id {vocab + 7} "):  # before anything is queued
        llm.generate([[1, 2], [3, 4]], [GREEDY4, bad], use_tqdm=False)
    assert len(llm.generate([[1, 2]], GREEDY4, use_tqdm=False)[0].token_ids) == 4
    llm.close()


def test_cache_stats_of_one_prompt_run_twice(tiny_dir):
    """The second run hits the two full blocks (the last token's block is computed); 4 steps a run; with no host tier
    nothing moves to or from the host. The step time summed is the time the steps took: more than nothing and no more
    than the wall time around the two runs."""
    llm = tiny_llm(tiny_dir)
    start = time.perf_counter()
    for _ in range(2):
        llm.generate([PROMPT], GREEDY4, use_tqdm=False)
    elapsed = time.perf_counter() - start
    stats, s = llm.stats(), llm.engine.stats
    expected = {
        "num_blocks": 16, "num_free_blocks": 16, "num_used_blocks": 0, "num_cached_blocks": 2,
        "block_hit_rate": 2 / 4,  # two lookups a run: the full blocks
        "prompt_token_hit_rate": 32 / 80, "num_running": 0, "num_waiting": 0, "num_preemptions": 0, "num_aborted": 0,
        "num_hit_blocks": 2, "num_computed_blocks": 3 + 1, "prompt_block_hit_rate": 2 / 6,
        "num_computed_tokens": (40 + 3) + (8 + 3),
        "num_host_blocks": 0, "num_host_hit_blocks": 0, "host_bytes_moved": 0,  # no host tier
    }  # fmt: skip
    assert {k: stats[k] for k in expected} == expected
    assert s.num_steps == 8 and stats["mean_step_ms"] == 1e3 * s.total_step_time / 8 > 0
    assert 0 < s.total_step_time <= elapsed
    llm.close()


def test_a_one_token_request_counts_the_prompt_tokens_it_found_cached(tiny_dir):
    """max_tokens=1: a request that finishes at its first token still counts its cached prompt tokens, in its output
    and in the prompt token hit rate (the second run finds 32 of its 40 tokens cached)."""
    llm = tiny_llm(tiny_dir)
    params = mp.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = [llm.generate([PROMPT], params, use_tqdm=False)[0] for _ in range(2)]
    assert [o.num_cached_tokens for o in outs] == [0, 32]
    assert llm.stats()["prompt_token_hit_rate"] == 32 / 80
    llm.close()


def test_running_and_waiting_counts_and_an_abort_that_counts_once(tiny_dir):
    """Two requests wait, then run (a step gives no output for a request not streamed and not finished); an abort
    gives a final output once, counts once and frees the id; an id in use is refused; a step of the idle engine
    gives no output and counts no step."""
    llm = tiny_llm(tiny_dir)
    engine = llm.engine  # NOTE: driven directly: nothing is in flight on the loop
    ids = [engine.add_request(PROMPT, GREEDY4, request_id=i) for i in ("a", "b")]
    assert ids == ["a", "b"]
    assert (llm.stats()["num_waiting"], llm.stats()["num_running"]) == (2, 0)
    assert engine.step() == []  # a request is not streamed unless asked: no output until it finishes
    assert (llm.stats()["num_waiting"], llm.stats()["num_running"]) == (0, 2)
    final = engine.abort("a")
    assert (final.finished, final.finish_reason, len(final.token_ids)) == (True, "abort", 1)
    assert engine.abort("a") is None and llm.stats()["num_aborted"] == 1
    assert engine.add_request(PROMPT, GREEDY4, request_id="a") == "a"  # the id is free again
    with pytest.raises(ValueError, match="request id 'b' is already in use"):
        engine.add_request(PROMPT, GREEDY4, request_id="b")
    while engine.has_unfinished():
        engine.step()
    assert not engine.requests and llm.stats()["num_used_blocks"] == 0
    num_steps = engine.stats.num_steps
    assert engine.step() == [] and engine.stats.num_steps == num_steps  # an idle engine's step runs nothing
    llm.close()


def test_a_finished_or_aborted_seeded_request_leaves_no_generator_and_its_id_replays_its_seed(tiny_dir):
    """A seeded request's generator lives while it runs: once it finishes or is aborted the sampler drops it, so a
    later request under the same caller-chosen id and seed samples the same tokens (not the old stream's next ones)
    and a long run of seeded requests holds no generator per request."""
    llm = tiny_llm(tiny_dir)
    engine, generators = llm.engine, llm.engine.runner.sampler.generators  # NOTE: driven directly, as above
    seeded = mp.SamplingParams(max_tokens=4, temperature=1.0, seed=7, ignore_eos=True, detokenize=False)
    runs = []
    for _ in range(2):
        engine.add_request(PROMPT, seeded, request_id="r")
        outputs = []
        while engine.has_unfinished():
            outputs += engine.step()
        runs.append(outputs[-1].token_ids)
        assert generators == {}
    assert runs[0] == runs[1]
    engine.add_request(PROMPT, seeded, request_id="r")
    engine.step()
    assert list(generators) == ["r"]
    engine.abort("r")
    assert generators == {}
    llm.close()


def test_host_tier_stats_of_a_prompt_read_back_from_the_host(tiny_dir):
    """8 device blocks (one request's worth) and a host tier of 8 blocks of 4 KiB: three other prompts of 40 tokens
    evict the first one's two full blocks to the host; run again it evicts two more and reads its own two back."""
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=8, host_cache_gib=8 * 4096 / 2**30)
    assert (llm.engine.runner.block_bytes, llm.stats()["num_host_blocks"]) == (4096, 8)
    prompts = [PROMPT, *(list(range(start, start + 40)) for start in (100, 200, 300)), PROMPT]
    outs = [llm.generate([prompt], GREEDY4, use_tqdm=False)[0] for prompt in prompts]
    assert [o.num_cached_tokens for o in outs] == [0, 0, 0, 0, 32]
    stats = llm.stats()
    assert (stats["num_host_hit_blocks"], stats["host_bytes_moved"]) == (2, (4 + 2) * 4096)  # 4 stored, 2 loaded
    llm.close()


def test_a_hybrid_resumed_from_a_checkpoint_gets_its_cache_report_and_counts_its_resumed_tokens(tmp_path):
    """A tiny random hybrid, one prompt of 70 tokens run twice with a checkpoint planned at 48: the second run resumes
    there, its report (built at its first chunk, which starts at 48) shows the 3 blocks it hit, and the statistics
    count 48 tokens resumed and 70 + 22 recomputed."""
    make_hybrid(tmp_path, seed=1)
    engine = mp.LLM(str(tmp_path), device="cpu", dtype="float32", num_blocks=96, max_model_len=512,
                    max_num_batched_tokens=64).engine  # fmt: skip
    prompt = list(range(100, 170))

    def run():
        req = engine.make_request(prompt, GREEDY4)
        req.checkpoint_positions = [48]
        engine.add(req)
        while True:
            for out in engine.step():
                if out.finished:
                    return out

    first, second = run(), run()
    assert (first.state_report.resume_position, first.state_report.num_recomputed_tokens) == (0, 70)
    assert (second.state_report.resume_position, second.state_report.num_recomputed_tokens) == (48, 22)
    assert (len(second.cache_report), second.cache_report.num_hit_blocks) == (5, 3)
    stats = engine.cache_stats()
    assert {k: stats[k] for k in ("num_resumed_tokens", "num_recomputed_prompt_tokens", "num_hit_blocks")} == {
        "num_resumed_tokens": 48, "num_recomputed_prompt_tokens": 70 + 22, "num_hit_blocks": 3
    }  # fmt: skip
    checkpoints = ("num_checkpoints", "num_checkpoints_saved", "num_checkpoints_evicted", "num_resumed")
    assert {k: stats[k] for k in checkpoints} == dict.fromkeys(checkpoints, 1) | {"num_checkpoints_evicted": 0}
    assert stats["state_memory_bytes"] == engine.runner.state_tensors.checkpoint_bytes  # the one checkpoint held
    engine.kv.states.stats.num_declined_saves, engine.kv.states.stats.num_moved = 2, 3  # each read from its own
    assert (engine.cache_stats()["num_checkpoints_declined"], engine.cache_stats()["num_checkpoints_moved"]) == (2, 3)


def test_a_hybrids_checkpoint_plan_moves_up_to_the_turn_start_it_is_given(tmp_path):
    """`checkpoint_turn_start_id` reaches the engine's checkpoint planner: one checkpoint for a 97-token prompt whose
    turns start at 0, 72 and 90 is planned at its one branch point (72, the start of a turn but the last) rounded
    down to the block grid, 64, where the prior alone places it lower."""
    make_hybrid(tmp_path, seed=1)
    T = 7
    prompt = [T, *range(100, 171), T, *range(100, 117), T, *[50] * 6]
    assert (len(prompt), [i for i, t in enumerate(prompt) if t == T]) == (97, [0, 72, 90])
    plans = {}
    for turn_start in (None, T):
        llm = mp.LLM(str(tmp_path), device="cpu", dtype="float32", num_blocks=96, max_model_len=512, block_size=16,
                     checkpoint_policy="dp", checkpoint_prior="balanced", checkpoints_per_entry=1,
                     checkpoint_turn_start_id=turn_start)  # fmt: skip
        (out,) = llm.generate([prompt], mp.SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
        plans[turn_start] = out.state_report.planned_checkpoints
        llm.close()
    assert plans[T] == (64,) and len(plans[None]) == 1 and plans[None][0] < 64


def test_a_hybrid_asked_for_async_scheduling_runs_its_steps_one_after_another(tmp_path):
    """A hybrid's state slots are planned per step: no burst is queued ahead of the host, whatever the config says."""
    make_hybrid(tmp_path, seed=1)
    llm = mp.LLM(str(tmp_path), device="cpu", dtype="float32", num_blocks=96, max_model_len=512,
                 async_scheduling=True, num_scheduler_steps=4)  # fmt: skip
    params = mp.SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True, detokenize=False)
    (out,) = llm.generate([list(range(100, 170))], params, use_tqdm=False)
    assert (len(out.token_ids), out.finish_reason) == (9, "length")
    assert (llm.engine.is_async, llm.engine.stats.num_continuations) == (False, 0)
    llm.close()


def test_a_hybrid_without_prefix_caching_plans_and_saves_no_checkpoint(tmp_path):
    """No prefix caching: no block is ever a hit, so no request could resume from a recurrent-state checkpoint and
    none is planned or saved (the policy is "none"); with it, the same prompt gets its plan and its saves."""
    make_hybrid(tmp_path, seed=1)
    params = mp.SamplingParams(max_tokens=1, detokenize=False)
    saved = {}
    for caching in (True, False):
        llm = mp.LLM(str(tmp_path), device="cpu", dtype="float32", num_blocks=96, max_model_len=512,
                     enable_prefix_caching=caching)  # fmt: skip
        (out,) = llm.generate([list(range(100, 170))], params, use_tqdm=False)
        report = out.state_report
        saved[caching] = (report.planned_checkpoints, report.saved_checkpoints, llm.stats()["num_checkpoints_saved"])
        llm.close()
    assert saved[True][0] and saved[True][2] > 0
    assert saved[False] == ((), (), 0)


def test_a_preempted_request_reports_its_preemption_and_the_tokens_of_a_roomy_cache(tiny_dir):
    """Six blocks of 16 hold two 40-token prompts (3 blocks each) and nothing more: the first decode that crosses
    into a fourth block preempts the newer request, which is recomputed later. Its output says so in its metrics
    (`num_preemptions` 1, the other 0), the step log counts its recompute, and its tokens are those of a cache with
    room for both."""
    params = mp.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, detokenize=False)
    prompts = [PROMPT, [t + 100 for t in PROMPT]]  # NOTE: no block shared, so each needs its own three
    tight = mp.LLM(str(tiny_dir), device="cpu", max_model_len=96, num_blocks=6)
    outs = tight.generate(prompts, params, use_tqdm=False)
    assert [o.metrics.num_preemptions for o in outs] == [0, 1] and tight.stats()["num_preemptions"] == 1
    # NOTE: vLLM's num_cached_tokens: the prompt tokens found cached when it first ran, not what its re-admission
    # found of its own prompt and generated tokens
    assert [o.num_cached_tokens for o in outs] == [0, 0] and tight.stats()["prompt_token_hit_rate"] == 0
    # the step log: when it returns, the newer request finds its first two blocks still cached and computes its
    # prompt's last 8 tokens, the 8 answer tokens it had computed before (recompute), and the one it sampled last
    # (decode); one decode for every token sampled after each request's first, and every token computed counted once
    records = tight.engine.step_log.records()
    kinds = [[getattr(r, f"num_{k}_tokens") for k in ("final_prefill", "decode", "recompute")] for r in records]
    assert [k for k in kinds if k[2]] == [[8, 1, 8]] and sum(k[1] for k in kinds) == 2 * (12 - 1)
    assert sum(map(sum, kinds)) == tight.stats()["num_computed_tokens"] and records[0].index == 0
    tight.close()
    roomy = tiny_llm(tiny_dir)
    assert [o.token_ids for o in outs] == [o.token_ids for o in roomy.generate(prompts, params, use_tqdm=False)]
    roomy.close()


def test_a_burst_counts_each_of_its_decode_steps(tiny_dir):
    """Bursts of 4 decode steps: 9 tokens are a prefill step and two bursts, 9 steps in all, not 3."""
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=16, num_scheduler_steps=4)
    params = mp.SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True, detokenize=False)
    (out,) = llm.generate([PROMPT], params, use_tqdm=False)
    s = llm.engine.stats
    assert (len(out.token_ids), s.num_steps, s.num_generated_tokens) == (9, 9, 9)
    llm.close()


def test_require_spans_makes_markers_an_error_where_they_cannot_take_effect(tiny_dir):
    """With position_free off span markers are ordinary tokens, unless the caller asks for spans: a prompt of token
    ids holding them generates, and only `require_spans` (a composed prompt's) refuses them."""
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=16, position_free=False,
                 control_tokens=mp.ControlTokens(ssep_id=3, pdep_id=4, pad_id=5))  # fmt: skip
    ids = [3] + [7] * 15 + [9, 9]
    assert not llm.engine.validate(ids, GREEDY4).has_spans
    with pytest.raises(ValueError, match="span marker SSEP at index 0: span semantics need position_free=True"):
        llm.engine.validate(ids, GREEDY4, require_spans=True)
    (out,) = llm.generate([ids], GREEDY4, use_tqdm=False)  # token ids, not a composed prompt: no spans required
    assert (len(out.token_ids), out.finish_reason) == (4, "length")
    llm.close()


def test_the_rates_of_an_engine_that_has_run_nothing_are_zero(tiny_dir):
    llm = tiny_llm(tiny_dir)
    stats = llm.stats()
    rates = ("block_hit_rate", "prompt_token_hit_rate", "prompt_block_hit_rate", "mean_step_ms")
    assert {k: stats[k] for k in rates} == dict.fromkeys(rates, 0.0)
    llm.close()


def test_prefill_progress_counts_each_waiting_prompts_tokens_in_the_cache_step_by_step(tiny_dir):
    """A request with no token yet is "queued" with none in the cache, then "prefilling" with the tokens of its
    chunks so far (16 a step here), the blocks it found cached counted from its admission; with its first token it
    leaves the list. Running ones come first; `stats()` carries the same."""
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=16, max_num_seqs=1,
                 max_num_batched_tokens=16)  # fmt: skip
    engine = llm.engine
    later = [*PROMPT, *range(60, 100)]  # 80 tokens, PROMPT's 2 full blocks first
    engine.add_request(PROMPT, GREEDY4, request_id="a")
    engine.add_request(list(range(200, 240)), GREEDY4, request_id="b")
    seen = [list(engine.prefill_progress().items())]
    for _ in range(3):
        engine.step()
        seen.append(list(engine.prefill_progress().items()))
    assert seen == [
        [("a", ("queued", 0, 40)), ("b", ("queued", 0, 40))],
        [("a", ("prefilling", 16, 40)), ("b", ("queued", 0, 40))],
        [("a", ("prefilling", 32, 40)), ("b", ("queued", 0, 40))],
        [("b", ("queued", 0, 40))],  # a's last 8 tokens and its first token
    ]
    assert llm.stats()["prefill_progress"] == {"b": ("queued", 0, 40)}
    while engine.has_unfinished():
        engine.step()
    engine.add_request(later, GREEDY4, request_id="c")
    engine.step()
    assert engine.prefill_progress() == {"c": ("prefilling", 32 + 16, 80)}  # a's 2 blocks found, one chunk computed
    while engine.has_unfinished():
        engine.step()
    assert engine.prefill_progress() == {}
    llm.close()


def test_prefill_progress_counts_a_document_cached_mid_prompt_from_its_admission(tiny_dir):
    """c's SSEP document (block 1) was cached by a: after c's first 16-token chunk (block 0) the document's block
    counts too (32 of 53), before any chunk reaches it; the next chunk skips it and computes block 2 (48)."""
    S, P, PAD = 3, 4, 5
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=16, max_num_batched_tokens=16,
                 control_tokens=mp.ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD))  # fmt: skip
    a = [*range(20, 35), PAD, S, *range(100, 115), P, 60, 61]  # leading block, the SSEP document's block, final
    c = [*range(40, 55), PAD, S, *range(100, 115), P, *range(60, 80)]  # 53 tokens: blocks 0 and 2 new, 1 cached
    llm.generate([a], GREEDY4, use_tqdm=False)
    engine = llm.engine
    engine.add_request(c, GREEDY4, request_id="c")
    seen = []
    for _ in range(2):
        engine.step()
        seen.append(engine.prefill_progress())
    assert seen == [{"c": ("prefilling", 32, 53)}, {"c": ("prefilling", 48, 53)}]
    finals = []
    while engine.has_unfinished():
        finals += engine.step()
    assert [block.status for block in finals[0].cache_report] == ["computed", "hit", "computed", "computed"]
    llm.close()


def test_a_span_computed_ahead_counts_once_as_the_final_prompts_hit(tiny_dir):
    """isps with one seat: b's SSEP span is computed ahead while a runs, by a span prefill that gets no cache report
    and counts no block of its own; b then hits it. Blocks: a 3 computed; b 1 hit and 2 computed."""
    S, P, PAD = 3, 4, 5
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=16, max_num_seqs=1, span_policy="isps",
                 control_tokens=mp.ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD))  # fmt: skip
    a = [*range(20, 35), PAD, S, *range(100, 115), P, 60, 61]  # 35 tokens: leading, SSEP span, final
    b = [*range(40, 55), PAD, S, *range(200, 215), P, 60, 62]
    outs = llm.generate([a, b], GREEDY4, use_tqdm=False)
    assert [[block.status for block in o.cache_report] for o in outs] == [
        ["computed"] * 3,
        ["computed", "hit", "computed"],
    ]
    assert [o.num_cached_tokens for o in outs] == [0, 16]
    stats = llm.stats()
    assert {k: stats[k] for k in ("num_hit_blocks", "num_computed_blocks", "num_computed_tokens")} == {
        "num_hit_blocks": 1, "num_computed_blocks": 5, "num_computed_tokens": (35 + 3) + 16 + (19 + 3)
    }  # fmt: skip
    llm.close()


def test_an_integer_like_id_that_is_no_integer_keeps_its_type_error():
    """A float tensor's items have `__index__` but refuse it: their own TypeError, not an empty prompt."""
    with pytest.raises(TypeError, match="only integer tensors of a single element can be converted to an index"):
        as_token_ids(torch.tensor([1.0, 2.0]))
    assert as_token_ids(torch.tensor([1, 2])) == [1, 2]


def test_a_request_aborted_while_waiting_reports_no_cached_tokens(tiny_dir):
    """A request aborted before its admission was never looked up in the cache: its output reports 0 cached tokens,
    even where its prompt's blocks are cached (by a first run of the same prompt)."""
    llm = tiny_llm(tiny_dir)
    llm.generate([PROMPT], GREEDY4, use_tqdm=False)
    engine = llm.engine
    engine.add_request(PROMPT, GREEDY4, request_id="w")
    final = engine.abort("w")
    assert (final.finish_reason, final.token_ids, final.num_cached_tokens) == ("abort", [], 0)
    assert llm.stats()["num_cached_blocks"] == 2
    llm.close()


@pytest.mark.parametrize(
    "ids",
    [
        [5, 7, 9],
        (5, 7, 9),
        [5, np.int64(7), 9],
        list(torch.tensor([5, 7])),
        np.array([5, 7]),
        [5, 2**70],
        [np.int64(2**62), np.int64(2**62)],  # their sum overflows int64: no warning, and Python ints out
        [2**63 - 1, -(2**63)],
    ],
    ids=["list", "tuple", "numpy-item", "torch-items", "numpy-array", "past-int64", "numpy-overflow", "int64-edges"],
)
def test_packed_ids_are_as_token_ids_and_their_bytes(ids, recwarn):
    """`pack_token_ids` (a list or tuple of Python ints packed as it is and copied) gives `as_token_ids`' ids, as
    Python ints and in a new list, and `token_bytes` of them, or None for an id past int64."""
    packed, data = pack_token_ids(ids)
    reference = as_token_ids(ids)
    assert packed == reference and [type(t) for t in packed] == [int] * len(ids) and packed is not ids
    assert data == (None if max(reference) >= 2**63 else token_bytes(reference))
    assert not recwarn.list


@pytest.mark.parametrize("ids", [[5, 1.5], (5, "7"), [5, None]])
def test_packing_a_non_integer_id_is_as_token_ids_error(ids):
    with pytest.raises(ValueError) as packed:
        pack_token_ids(ids)
    with pytest.raises(ValueError) as reference:
        as_token_ids(ids)
    assert str(packed.value) == str(reference.value) and "is not an integer" in str(packed.value)


def test_of_several_non_integer_ids_the_error_names_the_first():
    """Where several ids are not integers, `as_token_ids` and `pack_token_ids` name the first of them, in the
    prompt's order."""
    for pack in (as_token_ids, pack_token_ids):
        with pytest.raises(ValueError, match=r"^token id 1\.5 is not an integer$"):
            pack([5, 1.5, "7", None])


def test_a_prompt_checks_and_packs_its_ids_once_and_the_engine_takes_them_as_they_are(tiny_dir):
    """A composed `Prompt` checks its ids as it is made (Python ints kept, numpy's turned into them, a float named)
    and packs them once; a request made of it equals one made of its ids as a list, and its list is the request's
    own (growing it leaves the prompt as it was)."""
    control = mp.ControlTokens(ssep_id=3, pdep_id=4, pad_id=5)
    ids = [7, 8] + [5, 5] + [3] + [9] * 3 + [4, 11]
    prompt = Prompt(tuple(np.array(ids)), 4, control, ("sys", "doc", "q"))
    assert prompt.token_ids == tuple(ids) and all(type(t) is int for t in prompt.token_ids)
    assert prompt.packed() == (ids, token_bytes(ids)) and prompt.packed()[0] is not prompt.packed()[0]
    assert prompt.has_markers and prompt.layout == Prompt(tuple(ids), 4, control).layout
    with pytest.raises(ValueError, match=r"token id 1\.5 is not an integer"):
        Prompt((7, 1.5), 4, control)
    assert Prompt((7, 2**70), 4, control).packed() == ([7, 2**70], None)  # refused by the engine, naming the id
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=40, block_size=4, control_tokens=control)
    engine = llm.engine
    with pytest.raises(ValueError, match=r"token id 1180591620717411303424 is outside the vocabulary"):
        engine.make_request(Prompt((7, 2**70), 4, control), GREEDY4)
    from_prompt = engine.make_request(prompt, GREEDY4, require_spans=True)
    from_list = engine.make_request(ids, GREEDY4, require_spans=True)
    assert from_prompt.token_ids == ids and from_prompt.block_hashes == from_list.block_hashes
    assert from_prompt.layout == from_list.layout and from_prompt.visible_start == from_list.visible_start
    from_prompt.append_token(12)
    assert prompt.token_ids == tuple(ids) and engine.validate(prompt, GREEDY4).has_spans
    (out,) = llm.generate(prompt, GREEDY4, use_tqdm=False)
    assert out.prompt_token_ids == ids and len(out.token_ids) == 4
    llm.close()


def test_a_composed_prompt_without_markers_generates_where_markers_cannot_take_effect(tiny_dir):
    """A composed prompt always asks for span semantics; one without markers has none to refuse: with position_free
    off it generates, as the same ids do, while one with a marker is refused naming it."""
    control = mp.ControlTokens(ssep_id=3, pdep_id=4, pad_id=5)
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=40, block_size=4, position_free=False,
                 control_tokens=control)  # fmt: skip
    plain = [7] * 9
    (composed,) = llm.generate(Prompt(tuple(plain), 4, control), GREEDY4, use_tqdm=False)
    (listed,) = llm.generate([plain], GREEDY4, use_tqdm=False)
    assert composed.token_ids == listed.token_ids and len(composed.token_ids) == 4
    with pytest.raises(ValueError, match="prompt 0: span marker SSEP at index 4: span semantics need position_free"):
        llm.generate(Prompt((7, 8, 5, 5, 3, 9), 4, control), GREEDY4, use_tqdm=False)
    llm.close()


def test_span_markers_take_effect_in_the_rerotate_baseline(tiny_dir):
    """position_free=False with rerotate_spans (the copy-rerotate baseline): span markers mean what they mean in
    position-free mode, so a composed span prompt is taken, its segments read from its markers."""
    control = mp.ControlTokens(ssep_id=3, pdep_id=4, pad_id=5)
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=40, block_size=4, position_free=False,
                 rerotate_spans=True, control_tokens=control)  # fmt: skip
    layout = llm.engine.validate(Prompt((7, 8, 5, 5, 3, 9), 4, control), GREEDY4, require_spans=True)
    assert layout.has_spans and [(s.start, s.end) for s in layout.segments] == [(0, 4), (4, 6)]
    llm.close()


def prompt_copies_at_wait(engine) -> list[list]:
    """Record, each time the engine reads a step's tokens, each scheduled request's prompt copy (None: not made)."""
    seen, wait = [], engine.runner.wait

    def spy(flight):
        seen.append([s.seq._prompt_token_ids for s in flight.out.scheduled])
        return wait(flight)

    engine.runner.wait = spy
    return seen


def test_the_first_outputs_prompt_copy_is_made_while_the_device_computes_its_token(tiny_dir):
    """The prompt's copy that a request's first output carries is made after the step's launch and before its tokens
    are read (on CUDA, while the device computes), only for requests sampling their first token; it equals the
    prompt and is not the request's growing token list."""
    llm = tiny_llm(tiny_dir)
    engine, seen = llm.engine, prompt_copies_at_wait(llm.engine)
    ids = list(range(10, 30))
    req = engine.make_request(ids, GREEDY4, stream=True)
    engine.add(req)
    (out,) = engine.step()
    assert seen == [[ids]] and out.prompt_token_ids == ids and out.prompt_token_ids is not req.token_ids
    engine.step()
    assert seen[1] == [ids] and seen[1][0] is seen[0][0]  # made once
    llm.close()


def test_a_chunked_prompts_copy_is_made_at_the_chunk_that_samples_its_first_token(tiny_dir):
    """A prompt computed in two chunks samples nothing at its first: its prompt's copy is made in the step of its
    last chunk, the one that samples its first token, and not before."""
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=40, max_num_batched_tokens=64)
    engine, seen = llm.engine, prompt_copies_at_wait(llm.engine)
    ids = list(range(10, 110))  # 100 tokens: a chunk of 64, then one of 36
    engine.add(engine.make_request(ids, GREEDY4))
    engine.step()
    engine.step()
    assert seen == [[None], [ids]]
    llm.close()


def test_a_request_arrives_when_it_is_made_or_when_the_caller_says(tiny_dir):
    """`make_request`'s arrival_time is where the request's TTFT starts: the one given, else the time of the call."""
    llm = tiny_llm(tiny_dir)
    assert llm.engine.make_request([5, 6, 7], GREEDY4, arrival_time=1.5).arrival_time == 1.5
    before = time.perf_counter()
    arrival = llm.engine.make_request([5, 6, 7], GREEDY4).arrival_time
    assert before <= arrival <= time.perf_counter()
    llm.close()
