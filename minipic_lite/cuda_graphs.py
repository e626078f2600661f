"""Steps as CUDA graphs (gpt-fast / nano-vllm style), one per bucketed shape (num_seqs, num_tokens).

A step has a static shape once it is padded to a bucket: `num_tokens` query tokens in `num_seqs` sequences, and
block tables as wide as `max_model_len` allows. We capture `model -> logits of the step's sampling rows` (its
`logits_indices`, padded) and their greedy tokens for each bucket on static input buffers; a step copies its
inputs into the buffers and replays. Decode steps are the
buckets with one token per sequence; a prefill or mixed step with few new tokens (a prompt whose documents are
cached) takes a bucket with more tokens than sequences. Padding sequences write their K/V into a scratch block
that no request owns, and attend only to it:

    real: 1 sequence, 19 tokens        bucket (2, 24):  cu_seqlens_q = [0, 19, 24]
                                                         sequence 1 = 5 padding tokens on the scratch block

A step's inputs and padding are written on the host into pinned mirrors of the static buffers and move in two
copies (`StaticInputs.stage`); the steps of a burst after its first are advanced in the buffers on the device, in
one launch (`StaticInputs.advance`).
"""

from __future__ import annotations

import struct

import torch

from minipic_lite.chunks import SchedulerOutput
from minipic_lite.config import cdiv
from minipic_lite.models.step import HostStep, StepInputs, StepMetadata
from minipic_lite.sampler import argmax_rows


def graph_shapes(
    batch_sizes: tuple[int, ...], max_num_seqs: int, token_sizes: tuple[int, ...], max_tokens_per_seq: int
) -> list[tuple[int, int]]:
    """The buckets (num_seqs, num_tokens) to capture, smallest first: a decode bucket (S, S) per batch size up to
    `max_num_seqs`, and prefill buckets (S, T) with S < T <= S * max_tokens_per_seq for T in `token_sizes`, where
    S > 1 (a padding sequence) and up to max_num_seqs + 1 (so a full batch with a prefill in it has one)."""
    seqs = sorted({b for b in batch_sizes if b < max_num_seqs} | {max_num_seqs})
    decode = [(s, s) for s in seqs]
    prefill_seqs = [s for s in seqs if s > 1] + [max_num_seqs + 1]
    prefill = [(s, t) for s in prefill_seqs for t in token_sizes if s < t <= s * max_tokens_per_seq]
    return sorted(decode + prefill, key=lambda shape: (shape[1], shape[0]))


def pick_shape(shapes: list[tuple[int, int]], num_seqs: int, num_tokens: int) -> tuple[int, int] | None:
    """The bucket with the fewest tokens (then sequences) that holds the step: padding sequences take one token
    at least, so the padding tokens must cover the padding sequences. None: no bucket fits (run eagerly)."""
    for seqs, tokens in shapes:  # NOTE: sorted by (tokens, seqs)
        pad_seqs, pad_tokens = seqs - num_seqs, tokens - num_tokens
        if pad_seqs >= 0 and pad_tokens >= pad_seqs and (pad_seqs > 0 or pad_tokens == 0):
            return seqs, tokens
    return None


def padding_lens(num_seqs: int, num_tokens: int, shape: tuple[int, int]) -> list[int]:
    """Query tokens of each padding sequence: one each, the last takes the rest."""
    pad_seqs, pad_tokens = shape[0] - num_seqs, shape[1] - num_tokens
    return [1] * (pad_seqs - 1) + [pad_tokens - pad_seqs + 1] if pad_seqs else []


class StaticInputs:
    """The graphs' input buffers: slices of two flat device tensors, each with a host mirror (pinned on CUDA).

        int64  [ input_ids | positions | slot_mapping ]  T each,  [ logits_indices ]  S
        int32  [ visible_start ] T,  [ cu_seqlens_q ] S + 1,  [ kv_lens ] S,  [ block_tables ] S x W

    `stage` writes a step's fields and its bucket's padding into the mirrors (struct.pack_into, in C) and moves
    each mirror in one asynchronous copy: two copies a step, where a copy per field and the padding's fills on
    the device took ~25 launches of host time while the GPU waited for the replay. Only the entries of a table
    below its kv_len are read: the rest may hold an older step's ids.
    """

    def __init__(self, max_seqs: int, max_tokens: int, max_blocks: int, scratch_block: int, block_size: int, device):
        T, S, W = max_tokens, max_seqs, max_blocks
        self.max_tokens, self.max_blocks, self.block_size = T, W, block_size
        self.scratch_slot = scratch_block * block_size
        self.device64 = torch.zeros(3 * T + S, dtype=torch.long, device=device)
        self.device32 = torch.zeros(T + 2 * S + 1 + S * W, dtype=torch.int32, device=device)
        pin = torch.device(device).type == "cuda"
        self.host64 = torch.zeros(self.device64.shape, dtype=torch.long, pin_memory=pin)
        self.host32 = torch.zeros(self.device32.shape, dtype=torch.int32, pin_memory=pin)
        self.bytes64 = memoryview(self.host64.numpy()).cast("B")  # NOTE: writes land in the pinned tensor
        self.bytes32 = memoryview(self.host32.numpy()).cast("B")
        self.copied = torch.cuda.Event() if pin else None  # the last copies out of the mirrors
        self.stream = torch.cuda.current_stream(device) if pin else None  # the engine's stream, looked up once
        self.input_ids, self.positions, self.slot_mapping = self.device64[: 3 * T].view(3, T)
        self.logits_indices = self.device64[3 * T :]  # rows of the sampling tokens, then 0s
        self.visible_start, self.cu_seqlens_q = self.device32[:T], self.device32[T : T + S + 1]
        self.kv_lens = self.device32[T + S + 1 : T + 2 * S + 1]
        self.kv_lens_at, self.tables_at = T + S + 1, T + 2 * S + 1  # int32 offsets
        self.block_tables = self.device32[self.tables_at :].view(S, W)
        # constant runs the padding copies from (bytes)
        self.zeros = bytes(8 * T)
        self.scratch_slots = struct.pack(f"<{T}q", *[self.scratch_slot] * T)
        self.scratch_block, self.scratch_block_bytes = scratch_block, struct.pack("<i", scratch_block)
        self.ramp = torch.arange(1, S + 1, dtype=torch.int32, device=device)  # the padding sequences' cu offsets
        self.slot_mapping.fill_(self.scratch_slot)
        self.block_tables.fill_(scratch_block)
        self.kv_lens.fill_(1)
        self.host64.copy_(self.device64)
        self.host32.copy_(self.device32)

    def stage(self, host: HostStep, shape: tuple[int, int]) -> StepInputs:
        """Write `host`'s step padded to the bucket `shape` (as `padding_lens` lays it out) into the buffers; the
        inputs of the real tokens and sequences, as views of them."""
        seqs, tokens = shape
        n, num_seqs, num_sampling = len(host.input_ids), len(host.kv_lens), len(host.logits_indices)
        T, W, b64, b32, pack = self.max_tokens, self.max_blocks, self.bytes64, self.bytes32, struct.pack_into
        if self.copied is not None:
            self.copied.synchronize()  # NOTE: the last step's copies have left the mirrors (its sync waited already)
        pad = tokens - n  # padding tokens: any input id, position 0, the scratch slot, visible from 0
        pack(f"<{n}q", b64, 0, *host.input_ids)
        pack(f"<{n}q", b64, 8 * T, *host.positions)
        b64[8 * (T + n) : 8 * (T + tokens)] = self.zeros[: 8 * pad]
        pack(f"<{n}q", b64, 16 * T, *host.slot_mapping)
        b64[8 * (2 * T + n) : 8 * (2 * T + tokens)] = self.scratch_slots[: 8 * pad]
        pack(f"<{seqs}q", b64, 24 * T, *host.logits_indices, *[0] * (seqs - num_sampling))
        pack(f"<{n}i", b32, 0, *host.visible_start)
        b32[4 * n : 4 * tokens] = self.zeros[: 4 * pad]
        pad_cu = [n + k for k in range(1, seqs - num_seqs)] + [tokens] if seqs > num_seqs else []
        pack(f"<{seqs + 1}i", b32, 4 * T, *host.cu_seqlens_q, *pad_cu)
        pack(f"<{seqs}i", b32, 4 * self.kv_lens_at, *host.kv_lens, *[1] * (seqs - num_seqs))
        self._pack_tables(host.block_tables)
        rows_at = 4 * self.tables_at
        for i in range(num_seqs, seqs):  # NOTE: a padding sequence reads its first entry only (one key)
            b32[rows_at + 4 * W * i : rows_at + 4 * W * i + 4] = self.scratch_block_bytes
        self.device64.copy_(self.host64, non_blocking=True)
        end = self.tables_at + seqs * W
        self.device32[:end].copy_(self.host32[:end], non_blocking=True)
        if self.copied is not None:
            self.copied.record(self.stream)
        sampled_rows = self.logits_indices[:num_sampling]
        return StepInputs(self.input_ids[:n], self.meta(num_seqs, n), sampled_rows, is_staged=True)

    def _pack_tables(self, tables: list[list[int]]) -> None:
        rows_at, W = 4 * self.tables_at, self.max_blocks
        for i, table in enumerate(tables):
            struct.pack_into(f"<{len(table)}i", self.bytes32, rows_at + 4 * W * i, *table)

    def stage_tables(self, tables: list[list[int]]) -> None:
        """The first `len(tables)` rows of the block tables, written as `stage` writes them (a continuation whose
        requests took blocks: async scheduling). The copy is queued behind the steps already on the device."""
        if self.copied is not None:
            self.copied.synchronize()  # NOTE: the staged step's copies left the mirrors before that step ran
        self._pack_tables(tables)
        start, end = self.tables_at, self.tables_at + len(tables) * self.max_blocks
        self.device32[start:end].copy_(self.host32[start:end], non_blocking=True)
        if self.copied is not None:
            self.copied.record(self.stream)

    def warm_up_advance(self) -> None:
        """Compile `advance`'s kernel now (its one variant), not at the second step of the first burst."""
        from minipic_lite.advance_kernel import advance_decode_in_place

        device = self.device64.device
        long, int32 = (torch.zeros(1, dtype=t, device=device) for t in (torch.long, torch.int32))
        tables = torch.zeros(1, 2, dtype=torch.int32, device=device)  # NOTE: position 1 lies in block 0 or 1
        advance_decode_in_place(long, long.clone(), long.clone(), long.clone(), int32, tables, self.block_size)

    def meta(self, num_seqs: int, num_tokens: int) -> StepMetadata:
        """The buffers' first `num_seqs` sequences and `num_tokens` tokens, as a step's metadata (views)."""
        return StepMetadata(
            slot_mapping=self.slot_mapping[:num_tokens],
            block_tables=self.block_tables[:num_seqs],
            cu_seqlens_q=self.cu_seqlens_q[: num_seqs + 1],
            positions=self.positions[:num_tokens],
            kv_lens=self.kv_lens[:num_seqs],
            visible_start=self.visible_start[:num_tokens],
        )

    def set_padding(self, num_seqs: int, num_tokens: int, shape: tuple[int, int]) -> None:
        """`stage`'s padding, written on the device (the capture's warm-up and capture, which stage nothing)."""
        seqs, tokens = shape
        if seqs == num_seqs:
            return
        torch.add(self.ramp[: seqs - num_seqs - 1], num_tokens, out=self.cu_seqlens_q[num_seqs + 1 : seqs])
        self.cu_seqlens_q[seqs].fill_(tokens)
        self.slot_mapping[num_tokens:tokens].fill_(self.scratch_slot)
        self.positions[num_tokens:tokens].zero_()
        self.visible_start[num_tokens:tokens].zero_()
        self.block_tables[num_seqs:seqs].fill_(self.scratch_block)
        self.kv_lens[num_seqs:seqs].fill_(1)

    def advance(self, inputs: StepInputs, sampled: torch.Tensor) -> None:
        """The decode step staged in the buffers (`inputs`, its views) becomes the next one, fed `sampled` [num_seqs]:
        what `model_runner.advance_decode_inputs` builds, written in place in one launch (a burst's later steps).
        NOTE: only the tokens, positions, slots and kv_lens change: sequences, tables, visible_start, sampled rows
        and padding stay."""
        from minipic_lite.advance_kernel import advance_decode_in_place  # NOTE: imports triton

        meta = inputs.meta
        advance_decode_in_place(
            sampled, inputs.input_ids, meta.positions, meta.slot_mapping, meta.kv_lens, meta.block_tables,
            self.block_size,
        )  # fmt: skip


class StepGraphs:
    def __init__(self, runner, shapes: list[tuple[int, int]]):
        self.runner = runner
        self.shapes = shapes
        max_seqs, max_tokens = max(s for s, _ in shapes), max(t for _, t in shapes)
        self.max_blocks = cdiv(runner.config.scheduler.max_model_len, runner.block_size)
        self.static = StaticInputs(
            max_seqs, max_tokens, self.max_blocks, runner.scratch_block, runner.block_size, runner.device
        )
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (logits, greedy tokens)
        self._capture_all()

    def _forward(self, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """([num_seqs, vocab], [num_seqs]): the logits of the rows in `logits_indices` (one per sequence at most)
        and their argmax, inside the graph (a greedy step runs no sampling kernel of its own)."""
        model, static, (seqs, tokens) = self.runner.model, self.static, shape
        hidden = model(static.input_ids[:tokens], static.meta(seqs, tokens), self.runner.kv_cache)
        logits = model.compute_logits(hidden[static.logits_indices[:seqs]])
        return logits, argmax_rows(logits)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        self.pool = None
        for shape in reversed(self.shapes):  # largest first, so smaller graphs reuse its memory pool
            self.static.set_padding(0, 0, shape)
            self._forward(shape)  # warm-up (Triton autotune, JIT)
            self.graphs[shape], self.outputs[shape] = self._capture(shape)
        self.static.warm_up_advance()
        torch.cuda.synchronize()

    def _capture(self, shape: tuple[int, int]) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self._forward(shape)
        self.pool = self.pool or graph.pool()
        return graph, outputs

    def shape_for(self, out: SchedulerOutput) -> tuple[int, int] | None:
        if any(len(s.seq.block_table) > self.max_blocks for s in out.scheduled):
            return None
        num_tokens = sum(s.num_query_tokens for s in out.scheduled)
        return pick_shape(self.shapes, len(out.scheduled), num_tokens)

    def run(self, inputs: StepInputs, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the bucket's graph on the step's inputs (staged in the static buffers): [num_sampling, vocab]
        logits, the rows of `inputs.logits_indices` (as an eager step computes them), and their argmax
        [num_sampling]. NOTE: both are the graph's own outputs, overwritten by its next replay."""
        assert inputs.is_staged, "a graph reads its static buffers: stage the step (or advance it) there"
        num_sampling = inputs.logits_indices.shape[0]
        self.graphs[shape].replay()
        logits, greedy = self.outputs[shape]
        return logits[:num_sampling], greedy[:num_sampling]
