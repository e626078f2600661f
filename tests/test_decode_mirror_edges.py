"""Edges of the CPU decode mirror (decode_mirror.py) that test_decode_mirror leaves open: its budget counts exactly
the bytes it allocates, a growth that fits the budget to the byte is taken (and doubles only past what a step asks),
a request's keys are copied once, and again after a preemption, the copies are in the type their attention reads,
the C kernel attends as SDPA does, and a step that fits what the mirror holds keeps its tensors."""

import pytest
import torch

from minipic_lite.config import ModelConfig, SchedulerConfig
from minipic_lite.decode_mirror import MIN_CAPACITY, MIN_SLOTS, DecodeMirror
from minipic_lite.hashing import root_hash
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.models import native
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.scheduler import Scheduler

B = 4


def tiny_config() -> ModelConfig:
    return ModelConfig("llama", 64, 32, 64, 2, 4, 2, 8, 1e-6, 10000.0, 256, False)  # 2 layers, 2 kv heads, D = 8


def test_the_budget_counts_the_bytes_allocated_and_an_exact_fit_is_taken():
    mirror = DecodeMirror(tiny_config(), position_free=True, max_bytes=0)
    assert mirror.token_bytes == 2 * 2 * 2 * 8 * 4  # a key and a value of each layer and kv head, float32
    first = MIN_SLOTS * MIN_CAPACITY * mirror.token_bytes  # the first allocation, whatever it is asked to hold
    mirror.max_bytes = first - 1
    assert not mirror._reserve(1, 1) and mirror.k.numel() == 0
    mirror.max_bytes = first
    assert mirror._reserve(1, 1) and mirror.k.nbytes + mirror.v.nbytes == first


def test_a_lone_long_request_takes_one_slot_of_the_budget():
    """The slot axis starts at one: a budget of one slot of 8,192 keys holds a request of 6,000 (where eight slots to
    start with would have put it past the budget, and the op would have served every step)."""
    mirror = DecodeMirror(tiny_config(), position_free=True, max_bytes=0)
    mirror.max_bytes = 8192 * mirror.token_bytes
    assert mirror._reserve(1, 6000) and mirror.k.shape[1] == 1 and mirror.k.shape[3] == 8192
    assert not mirror._reserve(2, 6000) and mirror.k.shape[1] == 1  # two would pass it: the op serves that step


def decoding(num_requests: int):
    """A scheduler whose requests (prompts of 5, 6, ... tokens) have had their prefill: each next step decodes."""
    sched = Scheduler(SchedulerConfig(8, 64, 256), KVCacheManager(32))
    seqs = [
        Request(str(i), list(range(5 + i)), SamplingParams(max_tokens=8), B, root_hash("t"))
        for i in range(num_requests)
    ]
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule()
    sched.postprocess(out, [[1] for _ in out.scheduled], lambda seq: False)
    return sched, seqs


def decode_step(mirror, sched, kv_cache, cos_sin):
    out = sched.schedule()
    step = mirror.prepare(out, kv_cache, cos_sin, torch.zeros(len(out.scheduled), dtype=torch.int32))
    sched.postprocess(out, [[1] for _ in out.scheduled], lambda seq: False)
    return step


def first_key_row(kv_cache, seq) -> torch.Tensor:
    return kv_cache[0, :, seq.block_table[0], 0]  # (L, KVH, D): key 0 of each layer


def test_a_request_is_mirrored_once_and_again_from_scratch_after_a_preemption():
    """Key 0, changed in the paged cache after it was mirrored: a request's later steps keep the mirrored copy (each
    key is copied and rotated once in its life, also for a request preempted before), and a request whose preemption
    count moved (recomputed) copies it again."""
    mirror = DecodeMirror(tiny_config(), position_free=False, max_bytes=1 << 20)  # NOTE: keys copied as they are
    sched, (seq,) = decoding(1)
    seq.num_preemptions = 1  # mirrored for the first time after an earlier preemption
    kv_cache, cos_sin = torch.randn(2, 2, 33, B, 2, 8), torch.randn(256, 8)
    decode_step(mirror, sched, kv_cache, cos_sin)
    mirrored = first_key_row(kv_cache, seq).clone()
    kv_cache[0] += 1.0
    step = decode_step(mirror, sched, kv_cache, cos_sin)
    assert step.slots.tolist() == [0] and torch.equal(mirror.k[:, 0, :, 0], mirrored)
    seq.num_preemptions = 2  # recomputed since the last step
    (slot,) = decode_step(mirror, sched, kv_cache, cos_sin).slots.tolist()
    assert torch.equal(mirror.k[:, slot, :, 0], first_key_row(kv_cache, seq))


def test_attention_of_requests_in_slots_out_of_order_is_each_requests_own():
    """Two requests in slots 0 and 2 (the one between finished): each query attends to its own slot's keys, its own
    step's key included, as one SDPA call per request would."""
    mirror = DecodeMirror(tiny_config(), position_free=True, max_bytes=1 << 20)
    sched, seqs = decoding(3)
    kv_cache, cos_sin = torch.randn(2, 2, 33, B, 2, 8), torch.randn(256, 8)
    decode_step(mirror, sched, kv_cache, cos_sin)
    sched.finish(seqs[1], "stop")
    step = decode_step(mirror, sched, kv_cache, cos_sin)
    assert step.slots.tolist() == [0, 2] and not step.in_order
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 2, 8), torch.randn(2, 2, 8)  # 4 heads over 2 kv heads
    out = step.attend(0, q, k, v, scale=0.35)
    for row, (slot, position) in enumerate(zip(step.slots.tolist(), step.positions.tolist(), strict=True)):
        keys, values = mirror.k[0, slot, :, : position + 1], mirror.v[0, slot, :, : position + 1]  # (KVH, n, D)
        assert torch.equal(keys[:, position], k[row]) and torch.equal(values[:, position], v[row])
        expected = torch.nn.functional.scaled_dot_product_attention(q[row].view(2, 2, 8), keys, values, scale=0.35)
        torch.testing.assert_close(out[row], expected.reshape(4, 8))


def test_capacity_doubles_only_past_what_a_step_asks():
    """A step of exactly 64 keys takes the first 64 (no doubling at the edge): a budget of one slot of 64 holds it."""
    mirror = DecodeMirror(tiny_config(), position_free=True, max_bytes=0)
    mirror.max_bytes = MIN_CAPACITY * mirror.token_bytes
    assert mirror._reserve(1, MIN_CAPACITY) and mirror.k.shape[3] == MIN_CAPACITY
    mirror.max_bytes = 1 << 30
    assert mirror._reserve(1, 2 * MIN_CAPACITY) and mirror.k.shape[3] == 2 * MIN_CAPACITY


def test_the_copies_are_in_the_type_their_attention_reads():
    """A bf16 model's copies: bf16 for the C kernel, float32 for SDPA (slower in bf16 on the CPU), and float32 where
    the kernel cannot take the heads (D = 8) or is not built here."""
    cfg = ModelConfig("llama", 64, 32, 64, 2, 4, 2, 16, 1e-6, 10000.0, 256, False)  # D = 16: the kernel takes it
    mirror = DecodeMirror(cfg, position_free=True, max_bytes=1 << 20, dtype=torch.bfloat16)
    assert mirror._reserve(1, 1)
    on_kernel = torch.bfloat16 if native.load() is not None else torch.float32
    assert mirror.native == (native.load() is not None) and mirror.k.dtype == mirror.v.dtype == on_kernel
    mirror.use_native(False)
    assert not mirror.native and mirror.k.dtype == mirror.v.dtype == torch.float32
    mirror.use_native(True)
    assert mirror.k.dtype == on_kernel
    small = DecodeMirror(tiny_config(), position_free=True, max_bytes=1 << 20, dtype=torch.bfloat16)
    assert not small.native and small.k.dtype == torch.float32


@pytest.mark.parametrize(("head_dim", "layer"), [(8, 0), (16, 1)], ids=["sdpa-heads", "c-kernel-heads"])
def test_a_query_sees_only_the_keys_from_its_visible_start_on(head_dim, layer):
    """A decode after a span that starts at key 3 (SSEP): its query attends to keys 3..its own, the other's to all, as
    SDPA over those keys does; at D = 16 through the C kernel where it is built (D = 8 always takes SDPA)."""
    cfg = ModelConfig("llama", 64, 32, 64, 2, 4, 2, head_dim, 1e-6, 10000.0, 256, False)
    mirror = DecodeMirror(cfg, position_free=True, max_bytes=1 << 20)
    if head_dim == 16:
        assert mirror.native == (native.load() is not None)
    sched, seqs = decoding(2)
    kv_cache, cos_sin = torch.randn(2, 2, 33, B, 2, head_dim), torch.randn(256, head_dim)
    step = mirror.prepare(sched.schedule(), kv_cache, cos_sin, torch.tensor([3, 0], dtype=torch.int32))
    assert step.visible_start.tolist() == [3, 0] and step.positions.tolist() == [5, 6]
    q, k, v = torch.randn(2, 4, head_dim), torch.randn(2, 2, head_dim), torch.randn(2, 2, head_dim)
    attended = step.attend(layer, q, k, v, scale=0.35)
    for row, (slot, first, last) in enumerate([(0, 3, 5), (1, 0, 6)]):
        keys, values = mirror.k[layer, slot, :, first : last + 1], mirror.v[layer, slot, :, first : last + 1]
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[row].view(2, 2, head_dim), keys, values, scale=0.35
        )
        torch.testing.assert_close(attended[row], expected.reshape(4, head_dim))


def test_a_step_that_asks_exactly_what_the_mirror_holds_keeps_its_tensors():
    """Growing copies every key the mirror holds: a step that asks exactly the slots and the capacity it has (most
    decode steps) keeps its tensors as they are."""
    mirror = DecodeMirror(tiny_config(), position_free=True, max_bytes=1 << 20)
    assert mirror._reserve(2, MIN_CAPACITY) and mirror.k.shape[1] == 2 and mirror.k.shape[3] == MIN_CAPACITY
    k, v = mirror.k, mirror.v
    assert mirror._reserve(2, MIN_CAPACITY) and mirror.k is k and mirror.v is v
