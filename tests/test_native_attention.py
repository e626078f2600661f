"""The CPU's native decode attention (models/native.py) held to float64 attention over the same keys, and the decode
mirror on it held to the mirror on SDPA."""

import pytest
import torch
import torch.nn.functional as F

import minipic_lite as mp
from minipic_lite.models import native

pytestmark = pytest.mark.skipif(native.load() is None, reason="no C compiler or not Linux: the kernels are off")


def exact_attention(q, k, v, slots, first, last, scale):
    """The reference: each query's G heads over keys first..last of its slot, in float64, one SDPA call a query."""
    outs = []
    for i in range(q.shape[0]):
        s, a, b = int(slots[i]), int(first[i]), int(last[i]) + 1
        keys, values = k[s, :, a:b].double(), v[s, :, a:b].double()  # (KVH, len, D)
        outs.append(F.scaled_dot_product_attention(q[i].double(), keys, values, scale=scale))  # (KVH, G, D)
    return torch.stack(outs)


def mirror_layer(num_slots, num_kv_heads, capacity, head_dim, seed):
    torch.manual_seed(seed)
    k = torch.randn(num_slots, num_kv_heads, capacity, head_dim)
    return k, torch.randn_like(k)


def ranges(*pairs):
    return tuple(torch.tensor(values, dtype=torch.long) for values in zip(*pairs, strict=True))


@pytest.mark.parametrize("group", [1, 3, 4], ids=lambda g: f"G{g}")
@pytest.mark.parametrize("head_dim", [64, 128, 32], ids=lambda d: f"d{d}")  # 32: the loop for any width
@pytest.mark.parametrize("length", [1, 15, 16, 17, 256, 257, 700])  # within a 16-key group, one chunk, several
def test_one_query_equals_exact_attention_over_its_keys(group, head_dim, length):
    k, v = mirror_layer(2, 3, 704, head_dim, seed=length * head_dim + group)
    q = torch.randn(1, 3, group, head_dim)
    slots, first, last = ranges((1, 0, length - 1))
    out = native.decode_attention(q, k, v, slots, first, last, head_dim**-0.5)
    exact = exact_attention(q, k, v, slots, first, last, head_dim**-0.5)
    sdpa_err = max_err(F.scaled_dot_product_attention(q[0], k[1, :, :length], v[1, :, :length]), exact[0])
    print(f"max abs error {max_err(out, exact):.2e} (SDPA in float32: {sdpa_err:.2e})")
    assert out.shape == q.shape and out.dtype == torch.float32
    assert max_err(out, exact) < 2e-6


def max_err(actual, expected) -> float:
    return (actual.double() - expected).abs().max().item()


def test_queries_read_their_own_slots_and_key_ranges():
    """Slots out of order, a slot read by two queries, a visible range that starts past 0 (an SSEP span) and a
    query of 3 keys beside one of 900 (its chunks past its keys weigh nothing)."""
    k, v = mirror_layer(5, 2, 1024, 64, seed=0)
    q = torch.randn(4, 2, 3, 64)
    slots, first, last = ranges((3, 0, 899), (0, 0, 2), (3, 512, 700), (1, 17, 17))
    out = native.decode_attention(q, k, v, slots, first, last, 0.125)
    exact = exact_attention(q, k, v, slots, first, last, 0.125)
    print(f"max abs error {max_err(out, exact):.2e}")
    assert max_err(out, exact) < 2e-6
    assert max_err(out[3], v[1, :, 17:18].expand(2, 3, 64).double()) < 1e-6  # one key: its value, whatever the score


def test_scores_far_apart_weigh_as_exp_weighs_them():
    """Scores 0 to -300 apart in one row (base-2 exponents below -126 clamp to ~0): the softmax's exponentials,
    a polynomial in the kernel, against float64's."""
    head_dim, n = 64, 40
    k = torch.zeros(1, 1, n, head_dim)
    k[0, 0, :, 0] = torch.linspace(0, -300, n)  # score j = q[0] * k[j, 0] * scale
    k[0, 0, 5, 0] = -0.37  # and a few near the top
    k[0, 0, 9, 0] = -1.9
    v = torch.randn_like(k)
    q = torch.zeros(1, 1, 1, head_dim)
    q[..., 0] = 1.0
    slots, first, last = ranges((0, 0, n - 1))
    out = native.decode_attention(q, k, v, slots, first, last, 1.0)
    exact = exact_attention(q, k, v, slots, first, last, 1.0)
    print(f"max abs error {max_err(out, exact):.2e}")
    assert max_err(out, exact) < 1e-6


def test_a_nan_reaches_only_its_own_query():
    k, v = mirror_layer(2, 1, 64, 64, seed=1)
    v[0, 0, 10, 3] = float("nan")
    q = torch.randn(2, 1, 2, 64)
    slots, first, last = ranges((0, 0, 40), (1, 0, 40))
    out = native.decode_attention(q, k, v, slots, first, last, 0.125)
    assert out[0, 0, :, 3].isnan().all() and not out[1].isnan().any()
    ref = F.scaled_dot_product_attention(q[0:1].transpose(0, 1), k[:1, :, :41], v[:1, :, :41], scale=0.125)
    assert ref[0, 0, :, 3].isnan().all()  # as SDPA


def test_only_whole_vectors_of_16_floats_and_at_most_16_heads_a_group_are_taken():
    assert native.supports_attention(9, 3, 64) and native.supports_attention(32, 8, 128)
    assert not native.supports_attention(4, 2, 8)  # the tiny test models: SDPA serves their mirror
    assert not native.supports_attention(64, 2, 64)  # 32 query heads a kv head
    assert native.supports_attention(16, 1, 64) and not native.supports_attention(17, 1, 64)  # MAX_G: 16
    assert not native.supports_attention(8, 8, 512)


def test_the_mirror_on_the_kernel_decodes_the_tokens_of_the_mirror_on_sdpa(llm):
    """SmolLM2 in float32, requests at different lengths decoding together (several slots, one step): the same
    greedy tokens with the mirror's attention in C and through SDPA."""
    mirror = llm.engine.runner.decode_mirror
    assert mirror is not None and mirror.native
    params = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = ["The history of the printing press", "Write a haiku about caches. " * 12, "2 + 2 ="]
    on = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    mirror.use_native(False)
    try:
        off = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        mirror.use_native(True)
    assert on == off


def test_scratch_that_cannot_be_allocated_is_a_memory_error():
    """A key range whose partial sums would take 2^50 bytes (past any address space): the kernel's scratch fails to
    allocate, it returns before reading a key, and the call raises (no crash, no garbage out)."""
    k, v = mirror_layer(1, 1, 16, 64, seed=0)
    q = torch.randn(1, 1, 1, 64)
    slots, first, last = ranges((0, 0, 2**50 // 4 // 64 * 256 - 1))
    with pytest.raises(MemoryError, match="partial sums of 1 queries x 1 kv heads"):
        native.decode_attention(q, k, v, slots, first, last, 0.125)
    out = native.decode_attention(q, k, v, *ranges((0, 0, 15)), 0.125)  # the library serves on
    assert max_err(out, exact_attention(q, k, v, *ranges((0, 0, 15)), 0.125)) < 2e-6


def test_the_widest_heads_it_takes_equal_exact_attention():
    """256 dims and 16 query heads a kv head: the largest the kernel takes (its MAX_D and MAX_G)."""
    assert native.supports_attention(16, 1, 256) and native.supports_attention(32, 2, 64)
    k, v = mirror_layer(1, 1, 300, 256, seed=3)
    q = torch.randn(1, 1, 16, 256)
    slots, first, last = ranges((0, 0, 299))
    out = native.decode_attention(q, k, v, slots, first, last, 256**-0.5)
    assert max_err(out, exact_attention(q, k, v, slots, first, last, 256**-0.5)) < 2e-6


def test_a_bfloat16_mirror_is_read_as_bfloat16():
    """A bf16 model's mirror: the kernel widens each key and value exactly, so it equals exact attention over them."""
    k, v = (t.to(torch.bfloat16) for t in mirror_layer(2, 2, 300, 64, seed=4))
    q = torch.randn(2, 2, 3, 64)
    slots, first, last = ranges((1, 0, 299), (0, 5, 40))
    out = native.decode_attention(q, k, v, slots, first, last, 0.125)
    assert out.dtype == torch.float32
    assert max_err(out, exact_attention(q, k, v, slots, first, last, 0.125)) < 2e-6


def test_keys_and_values_of_two_types_or_a_query_not_in_float32_are_refused():
    k, v = mirror_layer(1, 1, 16, 64, seed=0)
    q, (slots, first, last) = torch.randn(1, 1, 1, 64), ranges((0, 0, 15))
    with pytest.raises(AssertionError):
        native.decode_attention(q, k, v.to(torch.bfloat16), slots, first, last, 0.125)
    with pytest.raises(AssertionError):
        native.decode_attention(q.to(torch.bfloat16), k, v, slots, first, last, 0.125)
