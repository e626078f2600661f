"""Progress under a device cache barely larger than one request (issue 10's offload run, at test size).

A working set of documents many times the device cache, shared across prompts in shuffled orders: spans computed
ahead (isps, barrier) are evicted before their finals use them unless the scheduler guards against it. Every
policy, with and without a host tier, must finish every request with the greedy tokens of a roomy engine.
"""

import random

import pytest

import minipic_lite as mp
from tests.conftest import save_tiny_llama

S, P, PAD = 3, 4, 5  # control tokens of the tiny vocabulary
CONTROL = mp.ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD)
B, NEW_TOKENS = 4, 4
ENGINE_KWARGS = dict(
    device="cpu", dtype="float32", control_tokens=CONTROL, block_size=B, max_num_seqs=3, max_num_batched_tokens=16
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama_progress"), vocab_size=48, max_position_embeddings=128)


def rag_prompts(num_prompts: int = 12, num_docs: int = 4, seed: int = 0) -> list[list[int]]:
    """RAG-shaped prompts: [lead] [SSEP doc]... [PDEP question]; about half the documents seen in earlier prompts."""
    rng = random.Random(seed)
    docs = [[rng.randrange(6, 48) for _ in range(rng.randrange(5, 12))] for _ in range(30)]
    fresh, seen, prompts = iter(docs), [], []
    for _ in range(num_prompts):
        chosen = rng.sample(seen, min(len(seen), num_docs // 2)) if seen else []
        chosen += [next(fresh) for _ in range(num_docs - len(chosen))]
        seen += [d for d in chosen if d not in seen]
        rng.shuffle(chosen)
        tokens = [rng.randrange(6, 48) for _ in range(3)]
        for doc in chosen:
            tokens += [PAD] * (-len(tokens) % B) + [S] + doc
        prompts.append(tokens + [PAD] * (-len(tokens) % B) + [P] + [rng.randrange(6, 48) for _ in range(3)])
    return prompts


@pytest.fixture(scope="module")
def expected(tiny_dir):
    """The greedy tokens of a cache that holds the whole working set."""
    llm = mp.LLM(str(tiny_dir), num_blocks=512, max_model_len=128, **ENGINE_KWARGS)
    outs = llm.generate(rag_prompts(), PARAMS, use_tqdm=False)
    llm.close()
    return [o.token_ids for o in outs]


PARAMS = mp.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("host_blocks", [0, 64], ids=["recompute", "host_tier"])
@pytest.mark.parametrize("span_policy", ["inline", "isps", "barrier"])
def test_a_cache_a_few_blocks_larger_than_one_request_finishes_every_request(tiny_dir, expected, span_policy,
                                                                             host_blocks):  # fmt: skip
    prompts = rag_prompts()
    num_blocks = max(-(-(len(p) + NEW_TOKENS) // B) for p in prompts) + 3
    working_set = {tuple(p[i : i + B]) for p in prompts for i in range(0, len(p), B)}
    assert len(working_set) >= 4 * num_blocks  # the documents do not fit in the device cache
    host_cache_gib = host_blocks * 1024 / 2**30  # a tiny block: 2 layers x K,V x 2 heads x 8 dims x 4 tokens x 4 B
    llm = mp.LLM(str(tiny_dir), num_blocks=num_blocks, max_model_len=num_blocks * B, span_policy=span_policy,
                 host_cache_gib=host_cache_gib, **ENGINE_KWARGS)  # fmt: skip
    assert llm.stats()["num_host_blocks"] == host_blocks
    # NOTE: a stalled scheduler spins forever; generate() has no timeout, so each step is counted and capped
    engine, step = llm.engine, llm.engine.step
    max_steps, num_steps = 40 * len(prompts) * NEW_TOKENS, 0

    def counted_step():
        nonlocal num_steps
        num_steps += 1
        assert num_steps <= max_steps, f"no progress: {num_steps} steps, {len(engine.scheduler.waiting)} waiting"
        result = step()
        engine.kv.check_integrity()
        return result

    engine.step = counted_step
    outs = llm.generate(prompts, PARAMS, use_tqdm=False)
    assert [o.token_ids for o in outs] == expected
    assert engine.pool.num_free_blocks == num_blocks and not engine.kv.pending and not engine.kv.waiters
    if host_blocks:
        assert llm.stats()["num_host_hit_blocks"] > 0
    llm.close()


def test_copy_rerotate_under_a_cache_smaller_than_a_prompt_with_its_copy_sources_finishes(tiny_dir, expected):
    """Copy-rerotate holds each source block while it copies it, so a prompt of documents cached at other offsets
    can need more blocks than the cache has: it computes them again instead of waiting forever."""
    prompts = rag_prompts()
    num_blocks = max(-(-(len(p) + NEW_TOKENS) // B) for p in prompts) + 3
    llm = mp.LLM(str(tiny_dir), num_blocks=num_blocks, max_model_len=num_blocks * B, position_free=False,
                 rerotate_spans=True, **ENGINE_KWARGS)  # fmt: skip
    engine, step, num_steps = llm.engine, llm.engine.step, []

    def counted_step():
        num_steps.append(1)
        assert len(num_steps) <= 40 * len(prompts) * NEW_TOKENS, "no progress"
        return step()

    engine.step = counted_step
    outs = llm.generate(prompts, PARAMS, use_tqdm=False)
    assert [o.token_ids for o in outs] == expected
    assert llm.stats()["num_rerotated_blocks"] > 0
    engine.kv.check_integrity()
    assert engine.pool.num_free_blocks == num_blocks
    llm.close()
