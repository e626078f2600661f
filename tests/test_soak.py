"""A randomized soak of the engine core: >= 10,000 steps of random mixes on a tiny random Llama.

Plain prompts, span prompts sharing documents in different orders, greedy and seeded sampling, aborts, and a
cache small enough to force preemption; `check_integrity()` after every step, no block leaked at the end, and
every greedy output equal to its solo run on a roomy engine.
"""

import random

import pytest

import minipic_lite as mp
from tests.conftest import save_tiny_llama

NUM_STEPS = 10_000
S, P, PAD = 3, 4, 5  # control tokens of the tiny vocabulary
CONTROL = mp.ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD)
B = 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), vocab_size=48, max_position_embeddings=96)


def random_prompt(rng: random.Random, docs: list[list[int]]) -> list[int]:
    if rng.random() < 0.5:
        return [rng.randrange(6, 48) for _ in range(rng.randrange(1, 30))]
    tokens = [rng.randrange(6, 48) for _ in range(rng.randrange(0, 2 * B))]
    for doc in rng.sample(docs, rng.randrange(1, 3)):
        tokens += [PAD] * (-len(tokens) % B) + [S] + doc
    tokens += [PAD] * (-len(tokens) % B) + [P] + [rng.randrange(6, 48) for _ in range(rng.randrange(1, 5))]
    return tokens


def random_params(rng: random.Random) -> mp.SamplingParams:
    max_tokens = rng.randrange(1, 24)
    if rng.random() < 0.7:
        return mp.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=rng.random() < 0.5)
    return mp.SamplingParams(max_tokens=max_tokens, temperature=0.9, top_p=0.9, seed=rng.randrange(100))


ENGINE_KWARGS = dict(device="cpu", dtype="float32", control_tokens=CONTROL, block_size=B, max_model_len=96)


def test_soak(tiny_dir):
    soak(tiny_dir, NUM_STEPS, seed=1234)


@pytest.mark.parametrize("span_policy", ["isps", "barrier"])
def test_soak_span_policies_with_a_small_host_tier(tiny_dir, span_policy):
    """The other span policies, and a host tier of 12 blocks under a device cache of 40 (it fills and evicts)."""
    llm = soak(tiny_dir, 2_000, seed=99, span_policy=span_policy, host_cache_gib=12 * 1024 / 2**30)
    stats = llm.stats()
    assert stats["num_host_blocks"] == 12 and stats["num_host_hit_blocks"] > 0 and stats["host_bytes_moved"] > 0
    assert llm.engine.kv.host.num_stored > 12  # the host tier was full and evicted (LRU)


def soak(tiny_dir, num_steps_wanted: int, seed: int, **options):
    rng = random.Random(seed)
    llm = mp.LLM(str(tiny_dir), num_blocks=40, max_num_seqs=6, max_num_batched_tokens=24, **ENGINE_KWARGS, **options)
    engine = llm.engine
    docs = [[rng.randrange(6, 48) for _ in range(rng.randrange(3, 11))] for _ in range(5)]
    submitted, finished = {}, {}
    num_steps = 0
    while num_steps < num_steps_wanted:
        if len(engine.requests) < 8 and rng.random() < 0.3:
            tokens, params = random_prompt(rng, docs), random_params(rng)
            submitted[engine.add_request(tokens, params)] = (tokens, params)
        if engine.requests and rng.random() < 0.01:
            output = engine.abort(rng.choice(list(engine.requests)))
            finished[output.request_id] = output
        for output in engine.step():
            assert output.finished
            finished[output.request_id] = output
        engine.kv.check_integrity()
        num_steps += 1
    while engine.has_unfinished():
        for output in engine.step():
            finished[output.request_id] = output
        engine.kv.check_integrity()
        num_steps += 1
    print(f"soak: {num_steps} engine steps, {len(submitted)} requests, {engine.stats.num_preemptions} preemptions")
    assert set(finished) == set(submitted), "a request was lost"
    assert engine.pool.num_free_blocks == engine.pool.num_blocks and not engine.requests  # nothing leaked
    assert engine.stats.num_preemptions > 0 and engine.stats.num_aborted > 0 and engine.stats.num_hit_blocks > 0

    solo = mp.LLM(str(tiny_dir), num_blocks=64, enable_prefix_caching=False, **ENGINE_KWARGS)
    num_checked = 0
    for request_id, (tokens, params) in submitted.items():
        out = finished[request_id]
        if out.finish_reason == "abort" or not params.is_greedy:
            continue
        (alone,) = solo.generate([tokens], params, use_tqdm=False)
        assert out.token_ids == alone.token_ids, request_id
        num_checked += 1
    print(f"soak: {num_checked} greedy outputs equal their solo runs")
    assert num_checked > 100 * num_steps_wanted // NUM_STEPS
    return llm
