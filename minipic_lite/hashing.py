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
TOKEN_BYTES = 8  # a token id in the hashed bytes: little-endian int64


def root_hash(namespace: str) -> BlockHash:
    return hashlib.sha256(namespace.encode()).digest()


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """The tokens as little-endian int64, what a block hash covers (TOKEN_BYTES per token)."""
    return np.asarray(token_ids, dtype="<i8").tobytes()


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """H(parent, tokens): sha256 over the parent hash and the tokens as little-endian int64."""
    return hash_block_bytes(parent, token_bytes(token_ids))


def hash_block_bytes(parent: BlockHash, block_bytes: bytes) -> BlockHash:
    """`hash_block` of tokens already in `token_bytes` form (one conversion for a whole prompt)."""
    return hashlib.sha256(parent + block_bytes).digest()


def chain_hashes(parent: BlockHash, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Chained hashes of the full blocks of `token_ids` (a partial tail block gets none)."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes
