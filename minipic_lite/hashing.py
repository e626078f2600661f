"""Block hashes: pure functions of token ids (DESIGN §2).

A block's hash names its KV content. With plain prefix caching it chains: h_b = H(h_{b-1}, x_b), with
h_{-1} = the root, which carries a namespace (model, dtype, cache mode) so that caches of different
configurations never alias. The span markers (SSEP resets the chain, PDEP hashes the whole prompt) are
applied in `spans.py` on top of the same `hash_block`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

BlockHash = bytes


def root_hash(namespace: str) -> BlockHash:
    return hashlib.sha256(namespace.encode()).digest()


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """H(parent, tokens): sha256 over the parent hash and the tokens as little-endian int64."""
    return hashlib.sha256(parent + np.asarray(token_ids, dtype="<i8").tobytes()).digest()


def chain_hashes(parent: BlockHash, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Chained hashes of the full blocks of `token_ids` (a partial tail block gets none)."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes
