"""Span semantics (DESIGN §2): segments, who sees whom, and what a block's hash is. Pure functions of token ids.

Control tokens
--------------
Three ids of the model's own vocabulary, named per model in `ControlTokens` (`EngineConfig.control`):

=========  =============================  =================================================================
id         SmolLM2 default (id)           meaning
=========  =============================  =================================================================
`ssep_id`  ``<repo_name>`` (3)            span separator: the block it starts opens a span that sees only itself
`pdep_id`  ``<reponame>`` (4)             prompt depend: the block it starts sees (and hashes) the whole prompt
`pad_id`   ``<file_sep>`` (5)             filler that moves the next marker to the first slot of a KV block
=========  =============================  =================================================================

The SmolLM2 defaults are StarCoder repository-metadata tokens that chat never produces; override them with
``LLM(control_tokens=ControlTokens(ssep_id=..., pdep_id=..., pad_id=...))`` (a model without such tokens gets
none, and then span prompts are refused). Markers and pads are ordinary tokens: they are embedded, attended to
and cached like any other. Only where they sit matters.

Rules
-----
* A marker (SSEP or PDEP) must be the first token of a KV block (index % block_size == 0); anywhere else it is a
  `ValueError` naming its index. `minipic_lite.prompts` pads with `pad_id` so this always holds.
* Segments: the prompt splits at marker blocks into the leading segment (before any marker), SSEP segments and
  PDEP segments, each running to the next marker. Generated tokens continue the last segment.
* Visibility: ``visible_start[i]`` is the segment's start in an SSEP segment, else 0; query i attends to keys
  ``visible_start[i] <= j <= i`` (Block-Attention's mask), at logical positions = indices in this request.
* Hashes, per full block b with tokens x_b, starting at the root (namespace) hash:

      h_b = H(root, x_b)       if x_b starts with SSEP   (chain reset: the span is cacheable anywhere)
            H(d_{b-1}, x_b)    if x_b starts with PDEP   (depends on the whole prompt before it)
            H(h_{b-1}, x_b)    otherwise

  where d_{b-1}, the prompt digest, names every token before block b: it is h_{b-1} itself when block b-1 lies
  outside SSEP segments (there h chains from the previous d, so it already does), and H'(d before the segment,
  h_{b-1}) inside one (`hashing.hash_digest`, a tagged sha256). DESIGN §2 chains d block by block
  (d_b = H(d_{b-1}, x_b)); per segment it costs one sha256 per SSEP segment instead of one per block, and two blocks
  still share a hash exactly when they see the same tokens (README, design notes). A prompt without markers
  hashes exactly as plain prefix caching.
* With position-free mode off (the vanilla rotated-key baseline) markers are ordinary tokens: no segments,
  plain chained hashes. Asking for span semantics there (a composed `Prompt` with markers) is a `ValueError`.

Reuse
-----
Lookup is per block (`KVCacheManager.allocate_prompt`): every full prompt block whose hash is cached is shared
wherever it sits, after a missing block too (a hole); only missing blocks are computed (queries need not be
contiguous), and the block of the last prompt token always is. A block is published when the step that computes
it is scheduled, and K/V are written before attention reads them, so a request admitted later in the same step
already shares it: one computation, one physical block, read at different offsets by different requests. Under
one token budget a waiting request is only admitted once the prompts scheduled before it are scheduled in full,
so their blocks are published by then. The same span twice in ONE prompt is computed once: the later copy waits
for the earlier one, as for a block another request is computing (kv_cache_manager.py).

Example (block_size 4, S = SSEP, P = PDEP, _ = pad)::

    tokens         s s s _ | S a a a | a _ _ _ | S b b _ | P q q
    segment        leading | ssep 1            | ssep 2  | pdep 3
    visible_start  0 ...   | 4 ...             | 12 ...  | 0 ...
    hash           chain   | H(root,.) chain   | H(root,.)| H(d_3, .)
"""

from __future__ import annotations

import enum
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from minipic_lite.config import SPAN_HASH_MEMO_BLOCKS, ControlTokens
from minipic_lite.hashing import TOKEN_BYTES, BlockHash, chain_hashes_bytes, hash_block_bytes, hash_digest, token_bytes


class SegmentKind(str, enum.Enum):
    LEADING = "leading"
    SSEP = "ssep"
    PDEP = "pdep"


@dataclass(frozen=True, slots=True)
class Segment:
    """Tokens [start, end) of one segment; `index` is its span id within the prompt."""

    kind: SegmentKind
    start: int
    end: int
    index: int

    @property
    def visible_start(self) -> int:
        return self.start if self.kind is SegmentKind.SSEP else 0


def find_markers(
    token_ids: Sequence[int], control: ControlTokens, data: bytes | None = None
) -> list[tuple[int, SegmentKind]]:
    """(index, kind) of every SSEP / PDEP token, in order. `data`: the same tokens in `hashing.token_bytes` form,
    searched instead of the list (a 16.5k-token prompt: 0.27 -> 0.016 ms)."""
    kinds = {control.pdep_id: SegmentKind.PDEP, control.ssep_id: SegmentKind.SSEP}  # NOTE: SSEP wins a tie
    kinds.pop(None, None)
    find = indices_of if data is None else lambda _, token_id: indices_in_bytes(data, token_id)
    markers = [(i, kind) for token_id, kind in kinds.items() for i in find(token_ids, token_id)]
    return sorted(markers, key=lambda marker: marker[0])


def indices_of(values: Sequence[int], value: int) -> Iterator[int]:
    """Every index of `value` in `values`, in order (`Sequence.index` scans in C: a prompt holds few markers)."""
    index = -1
    while True:
        try:
            index = values.index(value, index + 1)
        except ValueError:
            return
        yield index


def indices_in_bytes(data: bytes, value: int) -> list[int]:
    """Every index of `value` in tokens packed as `hashing.token_bytes` (`indices_of` over the bytes, in numpy).
    NOTE: not `bytes.find`: a small id's 8-byte pattern is mostly zeros, as the text is, and its search crawled."""
    return np.flatnonzero(np.frombuffer(data, dtype="<i8") == value).tolist()


def check_markers(
    token_ids: Sequence[int],
    control: ControlTokens,
    block_size: int,
    position_free: bool = True,
    require_spans: bool = False,
    data: bytes | None = None,
) -> list[tuple[int, SegmentKind]]:
    """The markers that take effect (empty: plain prefix semantics). Raises ValueError naming a bad marker's index.

    In position-free mode every marker takes effect and must start a block. With position-free mode off markers
    are ordinary tokens, unless `require_spans` (the caller composed a span prompt): then the first one is an error.
    `data`: as for `find_markers`.
    """
    markers = find_markers(token_ids, control, data)
    if not position_free:
        if require_spans and markers:
            index, kind = markers[0]
            raise ValueError(
                f"span marker {kind.name} at index {index}: span semantics need position_free=True "
                "(with rotated keys a cached span cannot move to another offset)"
            )
        return []
    for index, kind in markers:
        if index % block_size:
            raise ValueError(
                f"span marker {kind.name} (token id {token_ids[index]}) at index {index} is not at a KV block start "
                f"(block_size {block_size}): pad what precedes it to a multiple of {block_size} tokens"
            )
    return markers


def split_segments(num_tokens: int, markers: Sequence[tuple[int, SegmentKind]]) -> list[Segment]:
    """The segments of a prompt of `num_tokens` tokens with the given (already checked) markers."""
    bounds = [(0, SegmentKind.LEADING)] if not markers or markers[0][0] > 0 else []
    bounds += markers
    ends = [start for start, _ in bounds[1:]] + [num_tokens]
    return [Segment(kind, start, end, i) for i, ((start, kind), end) in enumerate(zip(bounds, ends, strict=True))]


def visible_starts(segments: Sequence[Segment], start: int = 0, end: int | None = None) -> list[int]:
    """`visible_start[i]` for the tokens [start, end) of the segments (end None: to the last segment's end); tokens
    past the last segment continue it, as generated tokens do. The segments partition [0, their end)."""
    end = segments[-1].end if end is None else end
    starts, index = [], bisect_right(segments, start, key=attrgetter("start")) - 1
    while start < end:  # NOTE: a run a segment (a chunk meets few), not a loop a token
        seg = segments[index]
        stop = end if index == len(segments) - 1 else min(end, seg.end)
        starts += [seg.visible_start] * (stop - start)
        start, index = stop, index + 1
    return starts


class VisibleStarts(Sequence[int]):
    """`visible_start[i]` of every token of a sequence (its prompt's, then the generated ones), read from its segments
    when asked: a list a token would cost a 16k-token prompt two passes (its layout's and its request's copy) where a
    step reads the few tokens it computes. `tokens` is the sequence (only its length is read)."""

    __slots__ = ("segments", "tokens")

    def __init__(self, segments: Sequence[Segment], tokens: Sized):
        self.segments, self.tokens = segments, tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            starts = visible_starts(self.segments, start, max(start, stop)) if step == 1 else None
            return starts if starts is not None else [self[i] for i in range(start, stop, step)]
        index = range(len(self))[index]  # NOTE: a negative index counts from the end; out of range raises
        return visible_starts(self.segments, index, index + 1)[0]

    def __iter__(self):
        return iter(self[:])

    def __eq__(self, other) -> bool:  # NOTE: compares as the list it stands for
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"VisibleStarts({list(self)!r})"


def marker_blocks(segments: Sequence[Segment], block_size: int) -> dict[int, SegmentKind]:
    """Logical block index -> kind, for the blocks that start with a marker."""
    return {seg.start // block_size: seg.kind for seg in segments if seg.kind is not SegmentKind.LEADING}


# -- hashes ------------------------------------------------------------------------------------------------


@dataclass(slots=True)  # NOTE: never mutated; not frozen only because one is made per block (a frozen init costs 2x)
class HashState:
    """Where the chains stand after the last hashed block: its hash h_{b-1} (`parent`), and `span_base`, the prompt
    digest before the SSEP segment that block lies in (None: it lies in none, and the digest is `parent` itself)."""

    parent: BlockHash
    span_base: BlockHash | None = None

    def digest(self) -> BlockHash:
        """d, which names every token hashed so far: h_{b-1} itself outside SSEP segments (there h chains from the
        previous d), and H(d before the segment, h_{b-1}) inside one (its h chains from the root)."""
        return self.parent if self.span_base is None else hash_digest(self.span_base, self.parent)


def next_block_hash(
    state: HashState, root: BlockHash, block_bytes: bytes, kind: SegmentKind | None
) -> tuple[BlockHash, HashState]:
    """h_b for one full block (its tokens as `hashing.token_bytes`), and the state after it. `kind` is the
    block's marker (None: no marker). The plain statement that `block_hashes` computes run by run."""
    if kind is SegmentKind.SSEP:  # h_b = H(root, x_b): the chain restarts; d before the segment is kept
        block_hash = hash_block_bytes(root, block_bytes)
        return block_hash, HashState(block_hash, state.digest())
    if kind is SegmentKind.PDEP:  # h_b = H(d_{b-1}, x_b): the whole prompt before it
        block_hash = hash_block_bytes(state.digest(), block_bytes)
        return block_hash, HashState(block_hash)
    block_hash = hash_block_bytes(state.parent, block_bytes)  # h_b = H(h_{b-1}, x_b)
    return block_hash, HashState(block_hash, state.span_base)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    root: BlockHash,
    markers: Mapping[int, SegmentKind] | None = None,
    state: HashState | None = None,
    first_block: int = 0,
    memo: SpanHashMemo | None = None,
    data: bytes | None = None,
) -> tuple[list[BlockHash], HashState]:
    """Hashes of the full blocks of `token_ids` (a partial tail gets none), and the state after the last one.

    `token_ids` start at logical block `first_block`, continuing from `state` (None: the root), so a growing
    sequence hashes its new blocks incrementally. `markers` maps a logical block index to its marker kind
    (`marker_blocks`); blocks not in it continue their segment's chain (generated tokens always do). `memo`
    remembers the chains of runs met before (the hashes are the same with or without it). `data`: `token_ids` in
    `hashing.token_bytes` form, when the caller has it (validation packed the prompt already).

    Exactly `next_block_hash` block after block, computed run by run: the blocks are cut at markers, and each
    run's h chains from

        SSEP         the root                  (the same in every prompt: from the memo once seen)
        PDEP         the digest d before it    (one hash after an SSEP segment: H(d before it, its last h))
        no marker    the last h                (the first run of a prompt, or a continued segment)

    so the digest costs one hash per SSEP segment, not one per block (DESIGN §2's d_b = H(d_{b-1}, x_b) hashed a
    16k-token prompt's 1,035 blocks again for every new order of its documents; see the README's design notes).
    With `memo`, every chain of a span prompt is looked up there first. A prompt without markers (one run) always
    hashes its chain: it would seldom be met again whole.
    """
    state = state or HashState(root)
    width, num_blocks = block_size * TOKEN_BYTES, len(token_ids) // block_size
    if num_blocks == 0:
        return [], state
    if data is None:  # NOTE: one conversion for all blocks (and a partial tail's tokens, not copied first)
        data = token_bytes(token_ids)
    memo = memo if markers else None
    hashes: list[BlockHash] = []
    parent, span_base = state.parent, state.span_base
    for start, end, kind in marker_runs(markers or {}, first_block, num_blocks):
        run = data[start * width : end * width]
        if kind is SegmentKind.SSEP:
            span_base = HashState(parent, span_base).digest()
            hashes += run_chain(memo, root, run, width)
        elif kind is SegmentKind.PDEP:
            hashes += run_chain(memo, HashState(parent, span_base).digest(), run, width)
            span_base = None
        else:
            hashes += run_chain(memo, parent, run, width)
        parent = hashes[-1]
    return hashes, HashState(parent, span_base)


def run_chain(memo: SpanHashMemo | None, parent: BlockHash, run: bytes, width: int) -> list[BlockHash]:
    """The chain of `run` after `parent`: from `memo` for a run of two blocks or more, else hashed (a single
    block's lookup would cost what its hash does)."""
    if memo is not None and len(run) >= 2 * width:
        return memo.chain(parent, run, width)
    return chain_hashes_bytes(parent, run, width)


def marker_runs(
    markers: Mapping[int, SegmentKind], first_block: int, num_blocks: int
) -> list[tuple[int, int, SegmentKind | None]]:
    """The blocks [first_block, first_block + num_blocks) cut at marker blocks: (start, end, marker of the first
    block or None), as indices relative to `first_block`, in order."""
    starts = sorted(b - first_block for b in markers if first_block <= b < first_block + num_blocks)
    if not starts or starts[0] > 0:
        starts.insert(0, 0)
    ends = [*starts[1:], num_blocks]
    return [(start, end, markers.get(start + first_block)) for start, end in zip(starts, ends, strict=True)]


class SpanHashMemo:
    """Chained hashes of the runs of span prompts by content: `chain(parent, run, width)` is
    `hashing.chain_hashes_bytes(parent, run, width)`, remembered.

    An SSEP span restarts the chain at the root, so its hashes depend on its tokens alone, and a cached span is
    hashed again in every prompt that uses it; so is the digest chain through it, the same wherever the span
    follows the same prefix. At ~0.7 us a block that was most of a cached prompt's host time. The memo keys a
    chain by (parent, width, the run's length, its first and last blocks) and holds the run's bytes beside it: a hit
    compares them in full (one memcmp), so two runs never share a chain, and a run of the same key but other tokens
    takes its place. It keeps the most recently used chains, at most `max_blocks` hashes in all (and their runs'
    bytes). Safe from any thread (requests are built in callers' threads).

    NOTE: keyed by the whole run, the dict hashed every byte of it (the 130 kB of 8 x 2,048 cached ids: ~27 us warm
    on 2 CPU cores, in every request of them); two blocks of it are as good a key.
    """

    def __init__(self, max_blocks: int = SPAN_HASH_MEMO_BLOCKS):
        self.max_blocks = max_blocks
        # LRU (oldest first): (parent, width, len(run), first block, last block) -> (run, its chain)
        self._chains: OrderedDict[tuple[BlockHash, int, int, bytes, bytes], tuple[bytes, list[BlockHash]]] = (
            OrderedDict()
        )
        self._num_blocks = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._chains)

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def chain(self, parent: BlockHash, run: bytes, width: int) -> list[BlockHash]:
        """`chain_hashes_bytes(parent, run, width)`, remembered."""
        key = (parent, width, len(run), run[:width], run[-width:])
        with self._lock:
            entry = self._chains.get(key)
            if entry is not None and entry[0] == run:
                self._chains.move_to_end(key)
                return entry[1]
        hashes = chain_hashes_bytes(parent, run, width)
        if len(hashes) <= self.max_blocks:
            with self._lock:
                old = self._chains.pop(key, None)  # NOTE: another run of its key (or this one, kept by another thread)
                self._num_blocks += len(hashes) - (0 if old is None else len(old[1]))
                self._chains[key] = (run, hashes)
                while self._num_blocks > self.max_blocks:
                    self._num_blocks -= len(self._chains.popitem(last=False)[1][1])
        return hashes


@dataclass(frozen=True, slots=True)
class SpanLayout:
    """What span semantics make of one prompt: its segments and marker blocks (and from them `visible_start`)."""

    segments: tuple[Segment, ...]
    marker_blocks: Mapping[int, SegmentKind]

    @property
    def has_spans(self) -> bool:
        return bool(self.marker_blocks)

    @property
    def visible_start(self) -> tuple[int, ...]:
        """`visible_start[i]` per token of the prompt (made when asked: the engine reads it by ranges,
        `VisibleStarts`)."""
        return tuple(visible_starts(self.segments))


def span_layout(
    token_ids: Sequence[int],
    control: ControlTokens,
    block_size: int,
    position_free: bool = True,
    require_spans: bool = False,
    data: bytes | None = None,
) -> SpanLayout:
    """Check the markers of a prompt and lay it out (see `check_markers` for what raises and `data`)."""
    markers = check_markers(token_ids, control, block_size, position_free, require_spans, data)
    segments = split_segments(len(token_ids), markers)
    return SpanLayout(tuple(segments), marker_blocks(segments, block_size))


def prompt_block_hashes(
    token_ids: Sequence[int],
    control: ControlTokens,
    block_size: int,
    root: BlockHash,
    position_free: bool = True,
) -> list[BlockHash]:
    """The block hashes of a whole prompt (what the engine computes for it)."""
    layout = span_layout(token_ids, control, block_size, position_free)
    return block_hashes(token_ids, block_size, root, layout.marker_blocks)[0]
