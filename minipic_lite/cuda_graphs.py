"""Steps as CUDA graphs (gpt-fast / nano-vllm style), one per bucketed shape (num_seqs, num_tokens).

A step has a static shape once it is padded to a bucket: `num_tokens` query tokens in `num_seqs` sequences, and
block tables as wide as `max_model_len` allows. We capture `model -> logits of the step's sampling rows` (its
`logits_indices`, padded) for each bucket on static input buffers; a step copies its inputs into the buffers
and replays. Decode steps are the
buckets with one token per sequence; a prefill or mixed step with few new tokens (a prompt whose documents are
cached) takes a bucket with more tokens than sequences. Padding sequences write their K/V into a scratch block
that no request owns, and attend only to it:

    real: 1 sequence, 19 tokens        bucket (2, 32):  cu_seqlens_q = [0, 19, 32]
                                                         sequence 1 = 13 padding tokens on the scratch block
"""

from __future__ import annotations

import torch

from minipic_lite.chunks import SchedulerOutput
from minipic_lite.config import cdiv
from minipic_lite.models.step import StepMetadata


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


class StepGraphs:
    def __init__(self, runner, shapes: list[tuple[int, int]]):
        self.runner = runner
        self.shapes = shapes
        max_seqs, max_tokens = max(s for s, _ in shapes), max(t for _, t in shapes)
        self.max_blocks = cdiv(runner.config.scheduler.max_model_len, runner.block_size)
        self.scratch_slot = runner.scratch_block * runner.block_size
        dev, i32, i64 = runner.device, torch.int32, torch.long
        self.input_ids = torch.zeros(max_tokens, dtype=i64, device=dev)
        self.positions = torch.zeros(max_tokens, dtype=i64, device=dev)
        self.slot_mapping = torch.full((max_tokens,), self.scratch_slot, dtype=i64, device=dev)
        self.visible_start = torch.zeros(max_tokens, dtype=i32, device=dev)
        self.block_tables = torch.full((max_seqs, self.max_blocks), runner.scratch_block, dtype=i32, device=dev)
        self.cu_seqlens_q = torch.zeros(max_seqs + 1, dtype=i32, device=dev)
        self.kv_lens = torch.ones(max_seqs, dtype=i32, device=dev)
        self.logits_indices = torch.zeros(max_seqs, dtype=i64, device=dev)  # rows of the sampling tokens, then 0s
        self.ramp = torch.arange(1, max_seqs + 1, dtype=i32, device=dev)  # the padding sequences' cu offsets
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.logits: dict[tuple[int, int], torch.Tensor] = {}
        self._capture_all()

    def _meta(self, shape: tuple[int, int]) -> StepMetadata:
        seqs, tokens = shape
        return StepMetadata(
            slot_mapping=self.slot_mapping[:tokens],
            block_tables=self.block_tables[:seqs],
            cu_seqlens_q=self.cu_seqlens_q[: seqs + 1],
            positions=self.positions[:tokens],
            kv_lens=self.kv_lens[:seqs],
            visible_start=self.visible_start[:tokens],
        )

    def _forward(self, shape: tuple[int, int]) -> torch.Tensor:
        """[num_seqs, vocab]: the logits of the rows in `logits_indices` (one per sequence at most)."""
        model, seqs = self.runner.model, shape[0]
        hidden = model(self.input_ids[: shape[1]], self._meta(shape), self.runner.kv_cache)
        return model.compute_logits(hidden[self.logits_indices[:seqs]])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        self.pool = None
        for shape in reversed(self.shapes):  # largest first, so smaller graphs reuse its memory pool
            self._set_padding(0, 0, shape)
            self._forward(shape)  # warm-up (Triton autotune, JIT)
            self.graphs[shape], self.logits[shape] = self._capture(shape)
        torch.cuda.synchronize()

    def _capture(self, shape: tuple[int, int]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(shape)
        self.pool = self.pool or graph.pool()
        return graph, logits

    def shape_for(self, out: SchedulerOutput) -> tuple[int, int] | None:
        if any(len(s.seq.block_table) > self.max_blocks for s in out.scheduled):
            return None
        num_tokens = sum(s.num_query_tokens for s in out.scheduled)
        return pick_shape(self.shapes, len(out.scheduled), num_tokens)

    def _set_padding(self, num_seqs: int, num_tokens: int, shape: tuple[int, int]) -> None:
        """Padding sequences after the real ones (`padding_lens`: one token each, the last takes the rest), on
        their own scratch slot, one key, position 0. Written on the device: no host copy in a replayed step."""
        seqs, tokens = shape
        if seqs == num_seqs:
            return
        torch.add(self.ramp[: seqs - num_seqs - 1], num_tokens, out=self.cu_seqlens_q[num_seqs + 1 : seqs])
        self.cu_seqlens_q[seqs].fill_(tokens)
        self.slot_mapping[num_tokens:tokens].fill_(self.scratch_slot)
        self.positions[num_tokens:tokens].zero_()
        self.visible_start[num_tokens:tokens].zero_()
        self.block_tables[num_seqs:seqs].fill_(self.runner.scratch_block)
        self.kv_lens[num_seqs:seqs].fill_(1)

    def run(self, inputs, shape: tuple[int, int]) -> torch.Tensor:
        """Copy the step's inputs into the static buffers, replay the bucket's graph; [num_sampling, vocab] logits,
        the rows of `inputs.logits_indices` (as an eager step computes them)."""
        meta = inputs.meta
        num_sampling = inputs.logits_indices.shape[0]
        num_tokens, num_seqs = inputs.input_ids.shape[0], meta.kv_lens.shape[0]
        width = meta.block_tables.shape[1]
        self.input_ids[:num_tokens].copy_(inputs.input_ids)
        self.positions[:num_tokens].copy_(meta.positions)
        self.slot_mapping[:num_tokens].copy_(meta.slot_mapping)
        self.visible_start[:num_tokens].copy_(meta.visible_start)
        self.cu_seqlens_q[: num_seqs + 1].copy_(meta.cu_seqlens_q)
        self.block_tables[:num_seqs, :width].copy_(meta.block_tables)
        self.kv_lens[:num_seqs].copy_(meta.kv_lens)
        self.logits_indices[:num_sampling].copy_(inputs.logits_indices)
        self.logits_indices[num_sampling : shape[0]].zero_()
        self._set_padding(num_seqs, num_tokens, shape)
        self.graphs[shape].replay()
        return self.logits[shape][:num_sampling]
