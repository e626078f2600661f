"""The span policies, dedup and the host tier through the real engine on SmolLM2, against the HF explicit-mask
oracle (tests/span_oracle.py): every policy gives the oracle's greedy tokens for concurrent requests sharing
documents in different orders, each document is computed once (counted in tokens), and a device cache far
smaller than the working set with a host tier gives the tokens of a roomy cache."""

import contextlib
import dataclasses
import json

import pytest

import minipic_lite as mp
from minipic_lite.config import SPAN_POLICIES
from tests import span_oracle
from tests.test_recipes_hf import DOCS, GREEDY, NUM_NEW_TOKENS, QUESTION, essays, oracle, starts_of

SYSTEM = "You answer from the documents."


@contextlib.contextmanager
def scheduler_options(llm, **options):
    """Run `llm` with other scheduler options (a fresh prefix cache before and after)."""
    scheduler = llm.engine.scheduler
    saved = scheduler.config
    scheduler.config = dataclasses.replace(saved, **options)
    llm.engine.kv.reset_prefix_cache()
    try:
        yield llm
    finally:
        scheduler.config = saved
        llm.engine.kv.reset_prefix_cache()
        llm.engine.kv.check_integrity()


def composed(llm):
    c = llm.composer
    x, y, z = DOCS[:3]
    return [
        c.block_attention(SYSTEM, [x, y], QUESTION),
        c.block_attention("Be brief.", [y, z, x], QUESTION),  # the same documents, other order and prefix
        c.block_attention(SYSTEM, [z, z], QUESTION),  # one document twice in one prompt
    ]


def tokens_computed_once(llm, prompts) -> int:
    """Prompt tokens computed when no block is ever computed twice: a block whose context (the tokens it sees,
    by span_oracle) came before, in an earlier prompt or earlier in the same one, is not computed; the block
    holding a prompt's last token always is."""
    control, B = llm.config.control, llm.config.cache.block_size
    seen, total = set(), 0
    for prompt in prompts:
        ids = list(prompt.token_ids)
        contexts = span_oracle.block_contexts(ids, span_oracle.visible_starts(ids, control.ssep_id, control.pdep_id), B)
        last = (len(ids) - 1) // B
        for b in range(last + 1):
            if b < last and contexts[b] in seen:
                continue
            total += min(B, len(ids) - b * B)
            if b < len(contexts):
                seen.add(contexts[b])
    return total


@pytest.fixture(scope="module")
def expected(llm, hf_model64):
    return [oracle(hf_model64, p.token_ids, starts_of(llm, p.token_ids))[1] for p in composed(llm)]


@pytest.mark.parametrize("policy", SPAN_POLICIES)
def test_every_policy_gives_the_oracle_tokens_and_computes_each_document_once(llm, expected, policy):
    # one seat for two of the three requests and a small budget: spans are computed ahead beside decodes
    with scheduler_options(llm, span_policy=policy, max_num_seqs=2, max_num_batched_tokens=96):
        prompts = composed(llm)
        before = llm.stats()
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        after = llm.stats()
    assert [o.token_ids for o in outputs] == expected
    decode_tokens = len(prompts) * (NUM_NEW_TOKENS - 1)
    assert after["num_computed_tokens"] - before["num_computed_tokens"] - decode_tokens == tokens_computed_once(
        llm, prompts
    )
    # the prompts' blocks are counted once each, from the callers' cache reports (a span computed ahead has none)
    admitted = sum(after[k] - before[k] for k in ("num_hit_blocks", "num_computed_blocks"))
    assert admitted == sum(len(o.cache_report) for o in outputs)


@pytest.fixture(scope="module")
def small_llm(model_dir):
    """A device cache of 40 blocks (640 tokens) and a host tier of 48 blocks."""
    config = json.loads((model_dir / "config.json").read_text())
    block_bytes = 2 * config["num_hidden_layers"] * 16 * config["num_key_value_heads"] * 64 * 4
    llm = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=512, num_blocks=40,
                 host_cache_gib=48 * block_bytes / 2**30)  # fmt: skip
    step = llm.engine.step

    def checked_step():  # integrity of both tiers after every step
        outputs = step()
        llm.engine.kv.check_integrity()
        return outputs

    llm.engine.step = checked_step
    yield llm
    llm.close()


def test_a_working_set_four_times_the_device_cache_comes_back_from_the_host_tier(llm, small_llm):
    docs = essays(8, 560, skip=10)  # ~8 x 10 blocks: twice the device cache, more than the host tier
    c = small_llm.composer
    rounds = [[c.block_attention(SYSTEM, [docs[i], docs[(i + 1) % 8]], QUESTION) for i in range(8)] for _ in range(2)]
    rounds[1] = rounds[1][::-1]  # the second round asks for the oldest documents last
    assert c.block_size == llm.composer.block_size and c.control == llm.composer.control
    with scheduler_options(llm):
        roomy = [o.token_ids for o in llm.generate(rounds[0] + rounds[1], GREEDY, use_tqdm=False)]
    got = []
    for prompts in rounds:
        for prompt in prompts:  # one at a time: each evicts what the one before cached
            got.append(small_llm.generate(prompt, GREEDY, use_tqdm=False)[0].token_ids)
    assert got == roomy
    stats = small_llm.stats()
    print(f"host hits {stats['num_host_hit_blocks']}, stored {small_llm.engine.kv.host.num_stored}")
    assert stats["num_host_hit_blocks"] >= 20
    host = small_llm.engine.kv.host
    assert host.num_stored > host.num_slots  # the host tier filled up and evicted: nothing was lost
    assert stats["host_bytes_moved"] == (host.num_stored + host.num_loaded) * small_llm.engine.runner.block_bytes


@pytest.mark.parametrize(
    ("gib", "message"), [(-1.0, "host_cache_gib must be >= 0"), (1e6, "host_cache_gib=1000000.0 does not fit")]
)
def test_a_host_tier_that_cannot_exist_is_refused_at_start_up(tmp_path, gib, message):
    config = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 128}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        mp.LLM(str(tmp_path), device="cpu", load_format="dummy", host_cache_gib=gib)


def test_the_copy_rerotate_baseline_gives_the_oracle_tokens_with_rotated_copies(model_dir, expected):
    """Rotated keys with span semantics: a document hit at another offset is copied and its keys re-rotated."""
    llm = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=2048, position_free=False,
                 rerotate_spans=True)  # fmt: skip
    try:
        outputs = [llm.generate(p, GREEDY, use_tqdm=False)[0] for p in composed(llm)]  # one by one: hits
        assert [o.token_ids for o in outputs] == expected
        assert llm.stats()["num_rerotated_blocks"] > 0 and outputs[1].num_cached_tokens > 0
        llm.engine.kv.check_integrity()
    finally:
        llm.close()
