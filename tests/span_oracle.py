"""Span semantics restated from DESIGN §2 for the tests, sharing no code with `minipic_lite.spans` or `hashing`.

The engine derives segments, `visible_start` and block hashes from the tokens; a test that built its expected
mask or hits with those same functions would agree with the engine whatever the rule says. So this module
writes the rule down again, as directly as the design states it:

* SSEP and PDEP tokens open a segment; tokens before the first marker form the leading segment; generated
  tokens continue the last segment.
* Query i sees keys j with start(i) <= j <= i, where start(i) is the index of the SSEP token that opened i's
  segment, and 0 in a leading or PDEP segment.
* A block's KV is a function of the tokens it sees (from its segment's start to its own end, at positions
  that are indices in the request), so a full block of a later prompt is a hit exactly when some earlier
  prompt had a full block that saw the same tokens, and it is not the block of the last prompt token.

Each recipe also says which segments it lays out (prompts.py's docstring, DESIGN §2); `recipe_segment_kinds`
writes that down, so a test can check that a composed prompt is the recipe it claims to be.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from minipic_lite.prompts import Module  # a data class of the recipe's description, not span logic

LEADING, SSEP, PDEP = "leading", "ssep", "pdep"


def visible_starts(token_ids: Sequence[int], ssep_id: int, pdep_id: int) -> list[int]:
    """start(i) for every token: the last SSEP at or before i if no PDEP came after it, else 0."""
    starts, start = [], 0
    for i, token in enumerate(token_ids):
        if token == ssep_id:
            start = i
        elif token == pdep_id:
            start = 0
        starts.append(start)
    return starts


def segment_kinds(token_ids: Sequence[int], ssep_id: int, pdep_id: int) -> list[str]:
    """The kind of each segment in order, read off the marker tokens."""
    kinds = [] if token_ids and token_ids[0] in (ssep_id, pdep_id) else [LEADING]
    return kinds + [SSEP if t == ssep_id else PDEP for t in token_ids if t in (ssep_id, pdep_id)]


def recipe_segment_kinds(recipe: str, items: Sequence) -> list[str]:
    """What each recipe lays out, from its description (`items`: documents, or the prompt_cache schema)."""
    if recipe == "prefix":  # [head doc_1 ... doc_n question tail]: no markers
        return [LEADING]
    if recipe == "block_attention":  # [head] [S doc_1] ... [S doc_n] [P question tail]
        return [LEADING] + [SSEP] * len(items) + [PDEP]
    if recipe == "epic":  # [head] ([P link of doc_i] [S rest of doc_i])... [P question tail]
        return [LEADING] + [PDEP, SSEP] * len(items) + [PDEP]
    if recipe == "prompt_cache":  # [head] modules as S, parameters as P, in schema order; [P question tail]
        return [LEADING] + [SSEP if isinstance(m, Module) else PDEP for m in items] + [PDEP]
    raise ValueError(f"unknown recipe {recipe!r}")


def block_contexts(token_ids: Sequence[int], starts: Sequence[int], block_size: int) -> list[tuple[int, ...]]:
    """For each full block, the tokens it sees: from its segment's start to its own end."""
    num_full = len(token_ids) // block_size
    return [tuple(token_ids[starts[b * block_size] : (b + 1) * block_size]) for b in range(num_full)]


def predicted_hits(
    token_ids: Sequence[int], earlier: Sequence[Sequence[int]], block_size: int, ssep_id: int, pdep_id: int
) -> list[bool]:
    """Per block of `token_ids` (the partial last one too): is it a cache hit after the `earlier` prompts ran?

    Assumes nothing was evicted. The block holding the last prompt token is always computed.
    """
    seen = set()
    for ids in earlier:
        seen.update(block_contexts(ids, visible_starts(ids, ssep_id, pdep_id), block_size))
    contexts = block_contexts(token_ids, visible_starts(token_ids, ssep_id, pdep_id), block_size)
    num_blocks = -(-len(token_ids) // block_size)
    num_hittable = (len(token_ids) - 1) // block_size
    return [b < num_hittable and contexts[b] in seen for b in range(num_blocks)]


# -- transformers with an explicit mask ----------------------------------------------------------------------


def explicit_mask(starts: Sequence[int], num_keys: int, dtype) -> torch.Tensor:
    """[1, 1, Q, K] additive mask for the last Q = len(starts) query rows: 0 where starts[i] <= j <= i."""
    num_queries = len(starts)
    i = torch.arange(num_keys - num_queries, num_keys)[:, None]  # query positions
    j = torch.arange(num_keys)[None, :]
    visible = (j >= torch.tensor(list(starts))[:, None]) & (j <= i)
    mask = torch.zeros(num_queries, num_keys, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    return mask[None, None]


@torch.no_grad()
def hf_greedy(hf_model, token_ids: Sequence[int], starts: Sequence[int], num_new_tokens: int):
    """(logits [len(prompt) + num_new_tokens - 1, vocab], greedy tokens): one forward over the prompt with the
    explicit mask, then greedy steps; each new token continues the last segment (sees keys from starts[-1])."""
    dtype = hf_model.dtype
    # NOTE: transformers 5.x renamed past_key_values to cache; older versions only know the old name.
    cache_arg = "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"
    ids = torch.tensor([list(token_ids)])
    out = hf_model(ids, attention_mask=explicit_mask(starts, len(token_ids), dtype), use_cache=True)
    logits, past = [out.logits[0]], getattr(out, cache_arg)
    tokens = [int(logits[-1][-1].argmax())]
    while len(tokens) < num_new_tokens:
        position = len(token_ids) + len(tokens) - 1
        out = hf_model(
            torch.tensor([[tokens[-1]]]),
            attention_mask=explicit_mask([starts[-1]], position + 1, dtype),
            position_ids=torch.tensor([[position]]),
            use_cache=True,
            **{cache_arg: past},
        )
        past = getattr(out, cache_arg)
        logits.append(out.logits[0])
        tokens.append(int(out.logits[0, -1].argmax()))
    return torch.cat(logits), tokens
