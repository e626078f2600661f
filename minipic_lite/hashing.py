"""Block hashes: pure functions of token ids (DESIGN §2).

A block's hash names its KV content. With plain prefix caching it chains: h_b = H(h_{b-1}, x_b), with
h_{-1} = the root, which carries a namespace (model, dtype, cache mode) so that caches of different
configurations never alias. The span markers (SSEP resets the chain, PDEP hashes the whole prompt) are
applied in `spans.py` on top of the same `hash_block`.

The ids a hash covers are Python ints, packed once per prompt (`pack_token_ids`): what validation reads in C and
what the block hashes are made of.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import struct
from collections.abc import Sequence

import numpy as np

BlockHash = bytes
TOKEN_BYTES = 8  # a token id in the hashed bytes: little-endian int64


def root_hash(namespace: str) -> BlockHash:
    return hashlib.sha256(namespace.encode()).digest()


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """The tokens as little-endian int64, what a block hash covers (TOKEN_BYTES per token)."""
    # NOTE: struct packs a list of Python ints about 3x faster than numpy converts it (16k tokens: 0.16 ms)
    return struct.pack(f"<{len(token_ids)}q", *token_ids)


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """H(parent, tokens): sha256 over the parent hash and the tokens as little-endian int64."""
    return hash_block_bytes(parent, token_bytes(token_ids))


def hash_block_bytes(parent: BlockHash, block_bytes: bytes) -> BlockHash:
    """`hash_block` of tokens already in `token_bytes` form (one conversion for a whole prompt)."""
    return hashlib.sha256(parent + block_bytes).digest()


def hash_digest(span_base: BlockHash, span_hash: BlockHash) -> BlockHash:
    """The prompt digest inside an SSEP segment: H(the digest before the segment, the segment's last block hash),
    its input tagged (65 bytes; a block hash's input is 32 + 8 x tokens) so it never meets a block's."""
    return hashlib.sha256(b"d" + span_base + span_hash).digest()


def chain_hashes(parent: BlockHash, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Chained hashes of the full blocks of `token_ids` (a partial tail block gets none)."""
    num_full = len(token_ids) // block_size * block_size
    return chain_hashes_bytes(parent, token_bytes(token_ids[:num_full]), block_size * TOKEN_BYTES)


def chain_hashes_bytes(parent: BlockHash, data: bytes, width: int) -> list[BlockHash]:
    """`chain_hashes` of tokens in `token_bytes` form, `width` bytes per block (a partial tail gets none)."""
    # NOTE: the loop of a 16k-token prompt's chain: one sha256 call per block is most of its time (~0.6 us
    # each, of which ~0.1 us is the compression itself), so nothing else is done per block.
    sha256, hashes = hashlib.sha256, []
    append = hashes.append
    for start in range(0, len(data) - width + 1, width):
        parent = sha256(parent + data[start : start + width]).digest()
        append(parent)
    return hashes


def as_token_ids(token_ids) -> list[int]:
    """A prompt's token ids as a new list of Python ints: integers of any kind (numpy's, torch's) taken as their
    values; anything else (a float, a string) is a ValueError naming it.

    NOTE: one `operator.index` an id, in place of a scan of the ids' types and a copy, which refused numpy's
    integers (calling them outside the vocabulary); no slower (bench/host_ttft.py, 16.7k ids on 2 CPU cores:
    validate 0.76 ms median against 0.79)."""
    try:
        return list(map(operator.index, token_ids))
    except TypeError:
        bad = [t for t in token_ids if not hasattr(type(t), "__index__")]  # NOTE: a list, so that None is named too
        if not bad:  # an integer-like that refuses to be one (a float tensor's item): its own error
            raise
        raise ValueError(f"token id {bad[0]!r} is not an integer") from None


def pack_token_ids(token_ids) -> tuple[list[int], bytes | None]:
    """`as_token_ids`, and the ids packed as `token_bytes` (None: an id past int64): what validation reads and the
    request hashes.

    NOTE: a list or tuple of Python ints (a tokenizer's, a composed prompt's) is packed as it is and copied, in place
    of an `operator.index` an id: struct takes integers only, and a sum that stays a Python int shows that none is
    numpy's or torch's (a bool, a Python int, stays one); anything else takes that path. 16.6k ids on 2 CPU cores:
    0.31 ms against 0.59 median, `make_request` 0.43 against 0.61 (8 x 2048 cached, bench/host_ttft.py's prompts)."""
    if isinstance(token_ids, list | tuple):
        with contextlib.suppress(struct.error), np.errstate(over="ignore"):  # NOTE: errors: the slow path names them
            data = token_bytes(token_ids)
            if type(sum(token_ids)) is int:
                return list(token_ids), data
    ids = as_token_ids(token_ids)
    with contextlib.suppress(struct.error):  # NOTE: an id past int64
        return ids, token_bytes(ids)
    return ids, None
