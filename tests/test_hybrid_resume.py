"""Resuming a hybrid from saved recurrent states, through the real engine on a tiny random Qwen3.5:
bit-identical logits when chunk boundaries agree, greedy outputs equal to an uninterrupted run at several
resume depths, the planner's positions, the store's budget, and integrity under a randomized mix with
preemption."""

import random

import numpy as np
import pytest
import torch

import minipic_lite as mp
from minipic_lite.checkpoints import EntryHistory, plan
from minipic_lite.checkpoints.estimators import common_prefix_len
from tests.hybrid_models import make_hybrid

B = 16
GREEDY = mp.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("hybrid")
    make_hybrid(path, seed=1)
    return path


def _llm(path, **options):
    defaults = dict(device="cpu", dtype="float32", num_blocks=96, max_model_len=512, max_num_batched_tokens=64)
    return mp.LLM(str(path), **{**defaults, **options})


def _tokens(n, seed):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(engine, token_ids, positions=None, params=GREEDY):
    """One request to completion; `positions` overrides the planner's checkpoints for it."""
    req = engine.make_request(token_ids, params)
    req.checkpoint_positions = positions
    engine.add(req)
    while True:
        for out in engine.step():
            if out.request_id == req.request_id and out.finished:
                return out


def _step_to_logits(engine, token_ids, positions):
    """Prefill `token_ids` chunk by chunk; the logits of the last chunk (the request is then aborted)."""
    req = engine.make_request(token_ids, mp.SamplingParams(max_tokens=1))
    req.checkpoint_positions = positions
    engine.add(req)
    while True:
        out = engine.scheduler.schedule()
        (scheduled,) = out.scheduled
        if scheduled.do_sample:
            logits = engine.runner.prompt_logits(out)
            engine.abort(req.request_id)
            return scheduled.query_ranges, req.num_resumed_tokens, logits
        engine.runner.execute(out)
        engine.scheduler.postprocess(out, [[]], lambda r: False)


@pytest.mark.parametrize("resume", [48, 64, 96])
def test_resume_is_bit_identical_to_the_full_prefill_with_the_same_chunks(model_path, resume):
    engine = _llm(model_path, checkpoint_policy="none").engine
    prompt = _tokens(100, seed=5)
    ranges, resumed, full = _step_to_logits(engine, prompt, [resume])  # chunks [0, resume), [resume, 100)
    assert ranges == [(resume, 100)] and resumed == 0
    ranges, resumed, again = _step_to_logits(engine, prompt, [resume])  # loads the state saved at `resume`
    assert ranges == [(resume, 100)] and resumed == resume
    assert torch.equal(again, full)


@pytest.mark.parametrize(
    ("checkpoint", "shared", "tail", "resume"),
    [
        (None, 100, 20, 0),  # no checkpoint: depth 0, KV hits unused
        (48, 53, 30, 48),  # shares an unaligned 53 tokens: resumes at the checkpoint below
        (96, 96, 20, 96),  # the whole first prompt, then more
        (32, 100, 1, 32),  # the same prompt plus one token
    ],
)
def test_greedy_continuation_after_a_resume_equals_the_uninterrupted_run(model_path, checkpoint, shared, tail, resume):
    engine = _llm(model_path, checkpoint_policy="none").engine
    reference = _llm(model_path, enable_prefix_caching=False).engine
    first = _tokens(shared if shared == 96 else 100, seed=6)
    second = first[:shared] + _tokens(tail, seed=7)
    out_first = _run(engine, first, [checkpoint] if checkpoint else [])
    out_second = _run(engine, second, [])
    assert out_second.state_report.resume_position == resume
    assert out_second.state_report.num_recomputed_tokens == len(second) - resume
    assert out_first.token_ids == _run(reference, first).token_ids
    assert out_second.token_ids == _run(reference, second).token_ids


def test_engine_checkpoints_are_the_plan_of_the_estimators_histogram(model_path):
    """Positions equal plan('dp', EntryHistory.weights_for(prompt), M) replayed on the same requests (the prior
    `balanced` while the estimate has no evidence); saved ⊆ planned; every repeat of a document resumes past 0."""
    budget = 2
    llm = _llm(model_path, checkpoint_policy="dp", checkpoints_per_entry=budget)
    docs = [_tokens(n, seed=20 + i) for i, n in enumerate((90, 130))]
    rng = random.Random(0)
    prompts = [docs[rng.randrange(2)] + _tokens(rng.randint(5, 40), seed=100 + i) for i in range(8)]
    estimator, seen = EntryHistory(uniform_until_observed=True), []
    for i, prompt in enumerate(prompts):
        out = _run(llm.engine, prompt)
        ids = np.asarray(prompt)
        if estimator.suffix.num_observations == 0 and not estimator.history_weights(ids)[1:].any():
            expected = plan("balanced", np.zeros(len(prompt) + 1), budget, bin_size=B)  # no evidence yet
        else:
            expected = plan("dp", estimator.weights_for(ids), budget, bin_size=B)
        depths = [common_prefix_len(ids[:-1], entry) for entry in seen]
        best = int(np.argmax(depths)) if depths and max(depths) > 0 else None
        depth, entry = (depths[best], seen[best]) if best is not None else (0, None)
        estimator.observe_request(ids, depth, entry)
        seen.append(ids)
        report = out.state_report
        assert list(report.planned_checkpoints) == expected
        assert set(report.saved_checkpoints) <= set(expected)
        if any(prompt[:90] == p[:90] for p in prompts[:i]):
            assert report.resume_position > 0


def test_store_within_budget_and_integrity_under_a_randomized_mix_with_preemption(model_path):
    """Few KV blocks (preemption), a store of 10 checkpoints (evictions), prefixes shared at random depths:
    block pool and state books are checked after every step, and greedy outputs equal a run without caching."""
    engine = _llm(model_path, num_blocks=17, max_model_len=256, max_num_seqs=4, checkpoints_per_entry=3).engine
    checkpoint_bytes = engine.kv.states.checkpoint_bytes
    engine = _llm(model_path, num_blocks=17, max_model_len=256, max_num_seqs=4, checkpoints_per_entry=3,
                  state_cache_gib=10.5 * checkpoint_bytes / 2**30, state_eviction="flops").engine  # fmt: skip
    states = engine.kv.states
    assert states.num_checkpoints == 10
    rng = random.Random(3)
    docs = [_tokens(80, seed=40 + i) for i in range(3)]
    prompts, params = [], []
    for i in range(14):
        doc = docs[rng.randrange(3)]
        prompts.append(doc[: rng.randint(30, 80)] + _tokens(rng.randint(1, 60), seed=200 + i))
        params.append(mp.SamplingParams(max_tokens=rng.randint(1, 16), temperature=0.0, ignore_eos=True))
    outputs, pending = {}, list(zip(prompts, params, strict=True))
    while pending or engine.has_unfinished():
        for _ in range(rng.randint(0, 3)):
            if pending:
                prompt, p = pending.pop(0)
                engine.add(engine.make_request(prompt, p, request_id=str(len(prompts) - len(pending) - 1)))
        for out in engine.step():
            outputs[out.request_id] = out
        engine.kv.check_integrity()
        running = engine.scheduler.running
        assert all(r.state_slot is not None for r in running)
        states.check_integrity([r.state_slot for r in running])  # includes: store within its budget
    stats = engine.cache_stats()
    assert stats["num_preemptions"] > 0 and stats["num_checkpoints_evicted"] > 0 and stats["num_resumed"] > 0
    assert stats["state_memory_bytes"] <= stats["state_budget_bytes"]
    reference = _llm(model_path, enable_prefix_caching=False, max_model_len=256).engine
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        assert outputs[str(i)].token_ids == _run(reference, prompt, params=p).token_ids, i


def test_a_resume_reads_kv_blocks_back_from_the_host_tier(model_path):
    """Device KV evicted to the host tier (few device blocks): the next request with the prefix still resumes
    from its checkpoint, with the blocks below it loaded back from the host, and decodes as without caching."""
    engine = _llm(model_path, num_blocks=33, max_model_len=512, host_cache_gib=0.01, checkpoint_policy="none").engine
    reference = _llm(model_path, enable_prefix_caching=False).engine
    prefix = _tokens(96, seed=60)
    first = _run(engine, prefix + _tokens(20, seed=61), [96])
    for i in range(3):  # other prompts push the prefix's blocks out of the device cache
        _run(engine, _tokens(300, seed=70 + i), [])
    second_prompt = prefix + _tokens(30, seed=62)
    second = _run(engine, second_prompt, [])
    assert engine.kv.num_host_hits >= 6 and second.state_report.resume_position == 96
    assert first.token_ids == _run(reference, prefix + _tokens(20, seed=61)).token_ids
    assert second.token_ids == _run(reference, second_prompt).token_ids
    engine.kv.check_integrity()


def test_a_failing_step_forgets_checkpoints_and_host_blocks_and_the_engine_serves_on(model_path, monkeypatch):
    """A forward that raises with two requests in flight on a hybrid with a host tier: both callers get the error,
    the checkpoints, the host tier's blocks and the device hashes are forgotten (the failed step may have left any
    of them unwritten), every state slot and block comes back, and the same prompts then decode as without caching."""
    llm = _llm(model_path, num_blocks=33, max_model_len=512, host_cache_gib=0.01)
    engine = llm.engine
    prefix = _tokens(96, seed=80)
    prompts = [prefix + _tokens(20, seed=81), prefix + _tokens(30, seed=82)]
    llm.generate([prefix + _tokens(10, seed=83)], GREEDY, use_tqdm=False)
    for i in range(3):  # push the prefix's blocks out to the host tier
        llm.generate([_tokens(300, seed=84 + i)], GREEDY, use_tqdm=False)
    assert engine.kv.states.by_hash and engine.kv.host.slots
    launch = engine.runner.launch

    def launch_failing_once(out):
        monkeypatch.setattr(engine.runner, "launch", launch)
        raise RuntimeError("injected forward failure")

    monkeypatch.setattr(engine.runner, "launch", launch_failing_once)
    with pytest.raises(RuntimeError, match="injected forward failure"):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    states = engine.kv.states
    assert not engine.requests and not states.by_hash and not engine.kv.host.slots
    assert engine.pool.num_cached_blocks == 0 and engine.pool.num_free_blocks == engine.pool.num_blocks
    engine.kv.check_integrity()
    states.check_integrity([])
    reference = _llm(model_path, enable_prefix_caching=False).engine
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == [_run(reference, p).token_ids for p in prompts]
    llm.close()
