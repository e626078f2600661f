"""The CPU decode mirror against the op's paged path: the same tokens and logits, slots that come and go."""

import pytest
import torch

import minipic_lite as mp
from minipic_lite.config import ModelConfig, SchedulerConfig
from minipic_lite.decode_mirror import DecodeMirror
from minipic_lite.hashing import root_hash
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.scheduler import Scheduler
from tests.conftest import max_abs_err

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a dragon who loved to read books about",
    "The mitochondria is the powerhouse of the cell. " * 6 + "In summary,",
    "1, 1, 2, 3, 5, 8, 13,",
]


def without_mirror(llm):
    """The same engine with the mirror switched off (the op reads the paged cache every decode step)."""
    llm.engine.runner.decode_mirror = None
    return llm


@pytest.fixture(scope="module")
def paged_llm(model_dir):
    return without_mirror(mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=512))


def test_the_default_cpu_engine_decodes_through_the_mirror(llm, monkeypatch):
    mirror = llm.engine.runner.decode_mirror
    assert mirror is not None
    steps = []
    prepare = mirror.prepare
    monkeypatch.setattr(mirror, "prepare", lambda *args: steps.append(prepare(*args)) or steps[-1])
    llm.generate(PROMPTS[:2], mp.SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
    assert len(steps) == 3 and all(step is not None for step in steps)  # every decode step, none declined


def test_mirror_gives_the_same_tokens_as_the_paged_op(llm, paged_llm):
    params = mp.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    ours = llm.generate(PROMPTS, params, use_tqdm=False)
    paged = paged_llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.token_ids for o in ours] == [o.token_ids for o in paged]


def span_prompts(llm) -> list:
    """A block-attention prompt, and its documents alone: decode tokens after an SSEP span see only the span."""
    docs = ["Paris is the capital of France. " * 3, "Berlin is the capital of Germany. " * 3]
    full = llm.composer.block_attention("Answer from the documents.", docs, "Which capitals are named?")
    return [full, *llm.composer.span_prompts("block_attention", docs)]


@pytest.mark.parametrize("case", ["spans", "preemption", "rotated_keys"])
def test_mirror_matches_the_paged_op_with(case, model_dir, paged_llm):
    params = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts, kwargs = PROMPTS, dict(max_model_len=512)
    if case == "spans":
        prompts = span_prompts(paged_llm)
    elif case == "preemption":
        kwargs = dict(num_blocks=12, max_model_len=128)
    else:
        kwargs["position_free"] = False
    expected = paged_llm.generate(prompts, params, use_tqdm=False)
    llm = mp.LLM(str(model_dir), device="cpu", **kwargs)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    llm.engine.pool.check_integrity()
    if case == "preemption":
        assert llm.stats()["num_preemptions"] > 0


@pytest.mark.parametrize("position_free", [True, False], ids=["position_free", "rotated_keys"])
def test_mirror_steps_write_the_cache_the_op_path_writes(position_free, model_dir):
    """The paged cache stays the truth: what decode steps served by the mirror write there (keys rotated in the
    vanilla mode) is what the op path's steps write, so that a later prefill, a hit or the op reads it right."""
    params = mp.SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    caches = []
    for mirrored in (True, False):
        llm = mp.LLM(str(model_dir), device="cpu", position_free=position_free, max_model_len=512, num_blocks=64)
        if not mirrored:
            without_mirror(llm)
        llm.generate(PROMPTS[:2], params, use_tqdm=False)
        caches.append(llm.engine.runner.kv_cache.clone())
    assert max_abs_err(caches[0], caches[1]) < 1e-4  # NOTE: fp32 sums of the two attentions differ in the last bits


def decode_logits(llm, prompts, num_steps):
    """Logits of `num_steps` greedy decode steps of a batch, step by step through the runner's test hook."""
    engine = llm.engine
    params = SamplingParams(max_tokens=num_steps + 1, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(llm.encode(p)[0], params) for p in prompts]
    while any(s.num_output_tokens == 0 for s in [*engine.scheduler.running, *engine.scheduler.waiting]):
        engine.step()
    logits = []
    for _ in range(num_steps):
        out = engine.scheduler.schedule()
        step_logits = engine.runner.prompt_logits(out)
        logits.append(step_logits)
        engine.scheduler.postprocess(out, [[int(t)] for t in step_logits.argmax(-1)], lambda seq: False)
    for i in ids:
        engine.abort(i)
    return torch.stack(logits)


def test_mirror_decode_logits_equal_the_paged_op(llm, paged_llm):
    ours = decode_logits(llm, PROMPTS[:3], 6)
    paged = decode_logits(paged_llm, PROMPTS[:3], 6)
    # NOTE: fp32 summation order differs (other padding); the engine's own fp32 error vs fp64 is ~5e-5
    assert max_abs_err(ours, paged) <= 1e-4


def tiny_config() -> ModelConfig:
    return ModelConfig("llama", 64, 32, 64, 2, 4, 2, 8, 1e-6, 10000.0, 256, False)


def test_slots_are_reused_and_dropped_requests_give_theirs_back():
    B = 4
    mirror = DecodeMirror(tiny_config(), position_free=True, max_bytes=1 << 20)
    sched = Scheduler(SchedulerConfig(8, 64, 256), KVCacheManager(32))
    kv_cache = torch.randn(2, 2, 33, B, 2, 8)
    cos_sin = torch.randn(256, 8)
    seqs = [Request(i, list(range(5 + i)), SamplingParams(max_tokens=8), B, root_hash("t")) for i in range(3)]
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule()  # prefill of all three
    sched.postprocess(out, [[1] for _ in out.scheduled], lambda seq: False)
    out = sched.schedule()  # decode
    step = mirror.prepare(out, kv_cache, cos_sin, torch.zeros(3, dtype=torch.int32))
    assert step.slots.tolist() == [0, 1, 2] and step.length == 8 and mirror.k.shape[1:4] == (4, 2, 64)  # 1 -> 4 slots
    assert [mirror.entries[s.request_id].num_mirrored for s in seqs] == [6, 7, 8]
    # the keys copied from the paged cache are the cache's keys, rotated at their positions
    seq = seqs[1]
    expected = kv_cache[0, 1].view(-1, 2, 8)[[seq.block_table[p // B] * B + p % B for p in range(6)]]
    from ops.rope import rotate_with_rows

    expected = rotate_with_rows(expected, cos_sin[:6])
    assert torch.equal(mirror.k[1, 1, :, :6], expected.transpose(0, 1))
    sched.postprocess(out, [[1] for _ in out.scheduled], lambda seq: False)
    sched.finish(seqs[0], "stop")
    out = sched.schedule()
    step = mirror.prepare(out, kv_cache, cos_sin, torch.zeros(2, dtype=torch.int32))
    assert step.slots.tolist() == [1, 2] and 0 not in {e.slot for e in mirror.entries.values()}
    assert step.mask.shape == (3, 1, 1, 9) and step.mask[0, 0, 0].tolist() == [True] + [False] * 8
    assert mirror._free_slot() == 0  # the next request takes the slot the finished one gave back


def test_mirror_declines_past_its_budget():
    mirror = DecodeMirror(tiny_config(), position_free=True, max_bytes=1000)
    assert not mirror._reserve(1, 10) and mirror.k.shape[1] == 0
    mirror.max_bytes = 10**6
    assert mirror._reserve(9, 65) and mirror.k.shape[1] == 16 and mirror.k.shape[3] == 128


def test_runner_prepare_works_outside_inference_mode(llm):
    """Benchmarks call `runner.prepare` directly: the mirror (inference tensors) must still take new keys."""
    engine, params = llm.engine, SamplingParams(max_tokens=8)
    ids = [engine.add_request(llm.encode("The capital of France is")[0], params)]
    engine.step()
    engine.step()  # a decode step through the mirror: its tensors are made under inference mode
    ids.append(engine.add_request(llm.encode("def fibonacci(n):")[0], params))
    engine.step()  # the new request's prefill (a mixed step: no mirror)
    out = engine.scheduler.schedule()  # both decode: the mirror copies the new request's prompt keys
    assert engine.runner.prepare(out).meta.decode_mirror is not None
    engine.scheduler.postprocess(out, engine.runner.execute(out), engine._stops)
    for seq_id in ids:
        engine.abort(seq_id)
    engine.pool.check_integrity()


def test_past_its_budget_the_op_serves_and_the_mirror_catches_up_after(llm, paged_llm, monkeypatch):
    """A mirror that holds 2 requests of 64 keys, two requests in one batch: while the longer one holds more than
    64 keys the op serves every decode step (prepare declines), and once it has finished the mirror serves the other
    again, first copying the keys the op's steps wrote; the tokens are the paged op's throughout."""
    runner = llm.engine.runner
    mirror = DecodeMirror(llm.config.model, position_free=True, max_bytes=0)
    mirror.max_bytes = 2 * 64 * mirror.token_bytes  # two slots of MIN_CAPACITY keys: no growth past them
    monkeypatch.setattr(runner, "decode_mirror", mirror)
    plans, prepare = [], mirror.prepare
    monkeypatch.setattr(mirror, "prepare", lambda *args: plans.append(prepare(*args)) or plans[-1])
    prompts = [PROMPTS[2], PROMPTS[0]]  # 21 and 5 tokens: 21 + 50 keys pass 64, 5 + 56 never do
    params = [mp.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (50, 56)]
    ours = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in ours] == [o.token_ids for o in paged_llm.generate(prompts, params)]
    served = [plan is not None for plan in plans]
    first_declined = served.index(False)
    assert all(served[:first_declined]) and not any(served[first_declined:49]) and all(served[49:])
    assert plans[-1].num_slots == 2 and plans[-1].length == 5 + 55  # the slot kept, its keys caught up
    assert mirror.k.shape[1] == 2 and mirror.k.shape[3] == 64  # it never grew past its budget
