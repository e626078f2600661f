"""Async scheduling: the next decode burst queued before the last one's tokens are read gives the outputs of steps
run one after another, drops what it computed past a stop, survives aborts and arrivals, and keeps the pool whole.

On the CPU a step runs as it is queued, so nothing overlaps here; the logic is the same as on CUDA (test_gpu.py
runs it there against the eager tokens).
"""

import pytest
import torch

import minipic_lite as mp
from tests.waits import run_with_timeout

BURST = 4
MAX_STEPS = 100  # a test driving the engine by hand fails after this many steps instead of spinning forever


@pytest.fixture(scope="module")
def async_llm(model_dir):
    return run_with_timeout(
        mp.LLM, str(model_dir), device="cpu", dtype="float32", max_model_len=512, num_scheduler_steps=BURST,
        async_scheduling=True,
    )  # fmt: skip


def greedy(max_tokens: int, **kwargs) -> mp.SamplingParams:
    return mp.SamplingParams(max_tokens=max_tokens, temperature=0.0, **kwargs)


def assert_idle(engine) -> None:
    """Nothing queued on the device, every block free, the pool's books whole."""
    assert engine.in_flight is None
    engine.pool.check_integrity()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_async_bursts_give_the_outputs_of_single_steps(llm, async_llm):
    prompts = ["1, 2, 3, 4, 5, 6,", "The capital of France is", "def fibonacci(n):", "Once upon a time"]
    base = run_with_timeout(llm.generate, prompts[0], greedy(12), use_tqdm=False)[0]
    params = [
        greedy(13, stop=[base.text.split(",")[2]]),  # a stop string mid-burst
        greedy(7),  # ends on a max_tokens that is no multiple of the burst
        greedy(21, stop_token_ids=[base.token_ids[5]]),
        mp.SamplingParams(max_tokens=18, temperature=0.9, top_p=0.9, seed=5),  # per-request generator
    ]
    expected = run_with_timeout(llm.generate, prompts, params, use_tqdm=False)
    engine = async_llm.engine
    stats_before = (engine.stats.num_continuations, engine.stats.num_generated_tokens)
    outs = run_with_timeout(async_llm.generate, prompts, params, use_tqdm=False)
    assert engine.stats.num_continuations > stats_before[0]  # bursts were queued ahead
    for out, exp in zip(outs, expected, strict=True):
        assert (out.token_ids, out.text, out.finish_reason, out.stop_reason) == (
            exp.token_ids, exp.text, exp.finish_reason, exp.stop_reason,
        )  # fmt: skip
    assert engine.stats.num_generated_tokens - stats_before[1] == sum(len(o.token_ids) for o in outs)
    assert_idle(engine)


def test_a_stop_inside_a_burst_drops_the_continuation_queued_behind_it(llm, async_llm):
    prompt = "The capital of France is"
    full = run_with_timeout(llm.generate, prompt, greedy(12, ignore_eos=True), use_tqdm=False)[0].token_ids
    # token 1 from the prefill; the burst of tokens 2-5 is queued with its continuation (6-9) behind it
    stop = full[2]
    assert stop not in full[:2]
    engine = async_llm.engine
    num_continuations = engine.stats.num_continuations
    params = greedy(12, ignore_eos=True, stop_token_ids=[stop])
    out = run_with_timeout(async_llm.generate, prompt, params, use_tqdm=False)[0]
    assert out.token_ids == full[:3] and (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert engine.stats.num_continuations == num_continuations + 1
    assert_idle(engine)


def test_an_abort_and_an_arrival_while_a_burst_is_queued(llm, async_llm):
    texts = ["Once upon a time", "def fibonacci(n):", "The capital of France is"]
    ids = [llm.encode(text)[0] for text in texts]
    params = greedy(14, ignore_eos=True)
    expected = [run_with_timeout(llm.generate, [p], params, use_tqdm=False)[0].token_ids for p in ids]
    engine = async_llm.engine
    a, b = (engine.add_request(p, params) for p in ids[:2])
    outputs = {}
    for _ in range(MAX_STEPS):
        outputs |= {o.request_id: o for o in engine.step()}
        engine.pool.check_integrity()
        if engine.in_flight is not None:
            break
    assert engine.in_flight is not None, "no burst was queued ahead"
    aborted = engine.abort(b)  # its blocks freed while the queued burst still writes them
    assert aborted.finish_reason == "abort" and aborted.token_ids == expected[1][: len(aborted.token_ids)]
    c = engine.add_request(ids[2], params)  # arrives while a burst is queued: admitted once it is read
    for _ in range(MAX_STEPS):
        outputs |= {o.request_id: o for o in engine.step()}
        engine.pool.check_integrity()
        if not engine.has_unfinished():
            break
    assert outputs[a].token_ids == expected[0] and outputs[c].token_ids == expected[2]
    assert b not in outputs and outputs[a].finished and outputs[c].finished
    assert_idle(engine)


def test_blocks_evicted_to_the_host_by_a_queued_burst_come_back_whole(tmp_path):
    """A burst queued ahead takes fresh blocks and may evict cached ones to the host tier: those copies must run
    before the burst writes the blocks, or later host hits load another request's keys."""
    from tests.conftest import save_tiny_llama

    tiny = save_tiny_llama(tmp_path, vocab_size=48, max_position_embeddings=128)
    B, steps = 4, 2
    kwargs = dict(device="cpu", dtype="float32", block_size=B, max_model_len=64, max_num_seqs=2)
    roomy = run_with_timeout(mp.LLM, str(tiny), num_blocks=256, **kwargs)
    block_bytes = roomy.engine.runner.block_bytes
    small = run_with_timeout(mp.LLM, str(tiny), num_blocks=16, host_cache_gib=64 * block_bytes / 2**30,
                             async_scheduling=True, num_scheduler_steps=steps, **kwargs)  # fmt: skip
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(6, 48, (34,), generator=gen).tolist() for _ in range(5)]  # 9 blocks each
    prompts += prompts[::-1]  # the second round hits the first's blocks, most of them on the host
    params = greedy(16, ignore_eos=True)  # 4 more blocks, taken a burst at a time
    expected = [o.token_ids for o in run_with_timeout(roomy.generate, prompts, params, use_tqdm=False)]
    got = [o.token_ids for p in prompts for o in run_with_timeout(small.generate, [p], params, use_tqdm=False)]
    stats = run_with_timeout(small.stats)
    assert stats["num_host_hit_blocks"] > 0 and small.engine.stats.num_continuations > 0
    assert got == expected
    small.engine.kv.check_integrity()


def test_aborting_the_only_request_of_a_queued_burst_forgets_the_burst(llm, async_llm):
    """Nothing of the burst queued ahead would be kept: the abort drops it, and the next step has no work."""
    engine = async_llm.engine
    req_id = engine.add_request(llm.encode("Once upon a time")[0], greedy(14, ignore_eos=True))
    for _ in range(MAX_STEPS):
        engine.step()
        if engine.in_flight is not None:
            break
    assert engine.in_flight is not None, "no burst was queued ahead"
    assert engine.abort(req_id).finish_reason == "abort"
    assert engine.in_flight is None and not engine.has_unfinished()
    num_steps = engine.stats.num_steps
    assert engine.step() == [] and engine.stats.num_steps == num_steps
    assert_idle(engine)
