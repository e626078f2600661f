"""Decode steps after a span that does not start at 0: the CPU decode mirror and the paged op against the oracle.

A prompt that ends inside an SSEP span at an offset leaves its generated tokens in that span (DESIGN §2): they
see keys from the span's start on, not the system turn before it. Prompts that end in a PDEP segment (every
recipe's question) or whose span starts at 0 cannot tell the two apart, so these prompts end inside a span at
offset 48 or 32. The oracle is transformers in float64 with the mask of `tests/span_oracle.py`; a check that the
same oracle without the span mask generates other tokens keeps the test able to fail.
"""

import pytest
import torch

import minipic_lite as mp
from minipic_lite.config import ModelConfig
from minipic_lite.decode_mirror import DecodeMirror
from minipic_lite.prompts import Piece
from minipic_lite.spans import SegmentKind
from ops import rope_paged_attention
from ops.rope import rope_cos_sin
from tests import span_oracle
from tests.conftest import FP32_LOGITS_ATOL, max_abs_err

NUM_NEW_TOKENS = 12
GREEDY = mp.SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True)
PIRATE = (
    "You are a pirate. Every answer you give is about ships, treasure and the open sea, and you always speak "
    "like a pirate would. Never break character, not even when the user asks you to stop being a pirate."
)
CITIES = "The following text is a list of the largest cities in Germany, with their populations and rivers."


def span_tail_prompt(llm, system: str, doc: str, offset: int):
    """[system, padded] [SSEP doc]: the prompt ends inside a span that starts at `offset`."""
    prompt = llm.composer.compose([Piece(system, label="system"), Piece(doc, SegmentKind.SSEP, "doc")])
    starts = oracle_starts(llm, prompt.token_ids)
    assert starts[-1] == offset, f"the span starts at {starts[-1]}, not {offset}: adjust the system text"
    return prompt


def oracle_starts(llm, token_ids):
    control = llm.config.control
    return span_oracle.visible_starts(list(token_ids), control.ssep_id, control.pdep_id)


@pytest.fixture(scope="module")
def prompts(llm):
    return [
        span_tail_prompt(llm, PIRATE, "My favourite food is", 48),
        "The capital of France is",  # no span: decodes beside the others with visible_start 0
        span_tail_prompt(llm, CITIES, "The capital of France is", 32),
    ]


@pytest.fixture(scope="module")
def expected(llm, hf_model64, prompts):
    """Per prompt: (token ids, starts, oracle logits, oracle tokens), and the tokens without the span mask."""
    cases = []
    for prompt in prompts:
        ids = llm.encode(prompt)[0]
        starts = oracle_starts(llm, ids)
        logits, tokens = span_oracle.hf_greedy(hf_model64, ids, starts, NUM_NEW_TOKENS)
        cases.append((ids, starts, logits, tokens))
    ids, starts = cases[0][0], cases[0][1]
    _, unmasked = span_oracle.hf_greedy(hf_model64, ids, [0] * len(ids), NUM_NEW_TOKENS)
    assert unmasked != cases[0][3], "the span mask must change what the pirate prompt generates"
    return cases


def served_by_mirror(llm, monkeypatch) -> list:
    """Record each decode step's mirror plan (None: the mirror declined and the op served it)."""
    mirror = llm.engine.runner.decode_mirror
    steps, prepare = [], mirror.prepare
    monkeypatch.setattr(mirror, "prepare", lambda *args: steps.append(prepare(*args)) or steps[-1])
    return steps


def paged_only(llm, monkeypatch):
    """The same engine with the mirror switched off: every decode step reads the paged cache through the op."""
    monkeypatch.setattr(llm.engine.runner, "decode_mirror", None)


@pytest.fixture(params=["mirror", "paged_op"])
def decode_path(request, llm, monkeypatch):
    llm.engine.pool.reset_prefix_cache()
    if request.param == "mirror":
        steps = served_by_mirror(llm, monkeypatch)
    else:
        paged_only(llm, monkeypatch)
        steps = None
    yield steps
    monkeypatch.undo()
    assert not llm.engine.has_unfinished()
    llm.engine.pool.check_integrity()


def test_decode_after_an_offset_span_sees_only_the_span(llm, prompts, expected, decode_path):
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    for out, (_, _, _, tokens) in zip(outs, expected, strict=True):
        assert out.token_ids == tokens, out.prompt
    if decode_path is not None:  # the mirror served every decode step of the batch
        assert len(decode_path) == NUM_NEW_TOKENS - 1 and all(step is not None for step in decode_path)


def test_decode_logits_after_an_offset_span_equal_the_oracle(llm, prompts, expected, decode_path):
    ids, _, oracle_logits, _ = expected[0]
    rows = []
    handle = llm.engine.runner.model.lm_head.register_forward_hook(lambda m, args, out: rows.append(out.float()))
    try:
        (out,) = llm.generate(prompts[0], GREEDY, use_tqdm=False)
    finally:
        handle.remove()
    decode_logits = torch.cat(rows[1:])  # rows[0]: the prefill step's last token
    assert decode_logits.shape[0] == NUM_NEW_TOKENS - 1
    # NOTE: decode steps run on oneDNN's prepacked weights (models/packed_linear.py), which round differently
    # from prefill's MKL matmuls; measured 3.8e-5 (mirror) and 5.4e-5 (paged op) at two threads.
    assert max_abs_err(decode_logits, oracle_logits[len(ids) :]) <= FP32_LOGITS_ATOL


def test_capacity_the_mirror_has_not_written_cannot_poison_attention(monkeypatch):
    """Fresh memory may hold NaN, and attention multiplies a masked-out value by 0 (0 * NaN = NaN): slots and
    positions the mirror grows into must hold numbers before any step reads past them. Without that, a request
    decoding beside a longer one got token 0 from its first decode step (found by the test above)."""
    real = torch.Tensor.new_empty
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: real(self, *a, **k).fill_(float("nan")))
    mirror = DecodeMirror(ModelConfig("llama", 64, 32, 64, 2, 4, 2, 8, 1e-6, 10000.0, 256, False), True, 1 << 20)
    assert mirror._reserve(3, 70) and mirror._reserve(9, 130)  # the first allocation, then growth
    assert torch.isfinite(mirror.k).all() and torch.isfinite(mirror.v).all()


# -- the op alone: a decode query at the end of an SSEP span at an offset ------------------------------------


def dense_attention(q, keys, values, key_positions, cos_sin, scale):
    """One query token (already rotated, as the op takes it) against explicit keys rotated at their positions:
    softmax, weighted sum, in float64."""
    half = cos_sin.shape[1] // 2

    def rotate(x, positions):  # x (n, heads, d)
        cos, sin = cos_sin[positions, None, :half].double(), cos_sin[positions, None, half:].double()
        x1, x2 = x[..., :half].double(), x[..., half:].double()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    group = q.shape[0] // keys.shape[1]
    kr = rotate(keys, key_positions).repeat_interleave(group, dim=1)  # (n, H, d)
    weights = (torch.einsum("hd,nhd->hn", q.double(), kr) * scale).softmax(-1)
    return torch.einsum("hn,nhd->hd", weights, values.double().repeat_interleave(group, dim=1))


@pytest.mark.parametrize("impl", ["torch", "triton", "ref"])
def test_op_decode_at_the_end_of_an_offset_span_reads_only_the_span(impl):
    """Three decode tokens (kv_len 75, 40, 17) whose spans start at 48, 16 and 0, over shuffled blocks."""
    gen = torch.Generator().manual_seed(0)
    B, num_heads, num_kv_heads, head_dim = 16, 4, 2, 64
    kv_lens, span_starts = [75, 40, 17], [48, 16, 0]
    num_blocks = sum(-(-n // B) for n in kv_lens) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    tables, cursor = torch.zeros(3, 5, dtype=torch.int32), 0
    for s, n in enumerate(kv_lens):
        count = -(-n // B)
        tables[s, :count] = perm[cursor : cursor + count]
        cursor += count
    k_cache = torch.randn(num_blocks, B, num_kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(num_blocks, B, num_kv_heads, head_dim, generator=gen)
    q = torch.randn(3, num_heads, head_dim, generator=gen)
    cos_sin = rope_cos_sin(128, head_dim)
    positions = torch.tensor([n - 1 for n in kv_lens])
    args = (q, k_cache, v_cache, tables, torch.tensor([0, 1, 2, 3], dtype=torch.int32), positions)
    args += (torch.tensor(kv_lens, dtype=torch.int32), torch.tensor(span_starts, dtype=torch.int32), cos_sin)
    out = rope_paged_attention(*args, head_dim**-0.5, impl=impl)
    for s, (n, start) in enumerate(zip(kv_lens, span_starts, strict=True)):
        j = torch.arange(start, n)  # the span's keys, and no key before it
        rows = tables[s, j // B].long(), j % B
        expected = dense_attention(q[s], k_cache[rows], v_cache[rows], j, cos_sin, head_dim**-0.5)
        assert max_abs_err(out[s], expected) <= 1e-5
