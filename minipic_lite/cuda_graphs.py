"""Decode steps as CUDA graphs (gpt-fast / nano-vllm style), one per bucketed batch size.

A decode step has a static shape once its batch is padded to a bucket: one token per sequence and a block
table as wide as `max_model_len` allows. We capture `model -> logits` for each bucket on static input
buffers; a step copies its inputs into the buffers and replays. Padding rows write their K/V into a scratch
block that no request owns, and attend only to it.
"""

from __future__ import annotations

import torch

from minipic_lite.config import cdiv
from minipic_lite.models.step import StepMetadata
from minipic_lite.scheduler import SchedulerOutput


class DecodeGraphs:
    def __init__(self, runner, batch_sizes: tuple[int, ...]):
        self.runner = runner
        max_num_seqs = runner.config.scheduler.max_num_seqs
        sizes = sorted({b for b in batch_sizes if b < max_num_seqs} | {max_num_seqs})
        self.batch_sizes = sizes
        max_bs, dev = sizes[-1], runner.device
        self.max_blocks = cdiv(runner.config.scheduler.max_model_len, runner.block_size)
        self.scratch_block = runner.scratch_block
        i32 = torch.int32
        self.input_ids = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self.slot_mapping = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self.block_tables = torch.full((max_bs, self.max_blocks), self.scratch_block, dtype=i32, device=dev)
        self.cu_seqlens_q = torch.arange(max_bs + 1, dtype=i32, device=dev)
        self.kv_lens = torch.ones(max_bs, dtype=i32, device=dev)
        self.visible_start = torch.zeros(max_bs, dtype=i32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._capture_all()

    def _meta(self, bs: int) -> StepMetadata:
        return StepMetadata(
            slot_mapping=self.slot_mapping[:bs],
            block_tables=self.block_tables[:bs],
            cu_seqlens_q=self.cu_seqlens_q[: bs + 1],
            positions=self.positions[:bs],
            kv_lens=self.kv_lens[:bs],
            visible_start=self.visible_start[:bs],
        )

    @torch.inference_mode()
    def _capture_all(self) -> None:
        model, cache = self.runner.model, self.runner.kv_cache
        self.slot_mapping.fill_(self.scratch_block * self.runner.block_size)
        pool = None
        for bs in reversed(self.batch_sizes):  # largest first, so smaller graphs reuse its memory pool
            meta = self._meta(bs)
            model.compute_logits(model(self.input_ids[:bs], meta, cache))  # warm-up (Triton autotune, JIT)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[bs] = model.compute_logits(model(self.input_ids[:bs], meta, cache))
            pool = graph.pool() if pool is None else pool
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def can_run(self, out: SchedulerOutput) -> bool:
        return (
            out.is_decode_only
            and len(out.scheduled) <= self.batch_sizes[-1]
            and all(len(s.seq.block_table) <= self.max_blocks for s in out.scheduled)
        )

    def run(self, inputs, num_seqs: int) -> torch.Tensor:
        """Copy the step's inputs into the static buffers, replay the bucket's graph, return [num_seqs, V]."""
        bs = next(b for b in self.batch_sizes if b >= num_seqs)
        meta = inputs.meta
        width = meta.block_tables.shape[1]
        self.input_ids[:num_seqs].copy_(inputs.input_ids)
        self.positions[:num_seqs].copy_(meta.positions)
        self.slot_mapping[:num_seqs].copy_(meta.slot_mapping)
        self.block_tables[:num_seqs, :width].copy_(meta.block_tables)
        self.kv_lens[:num_seqs].copy_(meta.kv_lens)
        self.visible_start[:num_seqs].copy_(meta.visible_start)
        # padding rows: their own scratch slot, one key, position 0
        self.slot_mapping[num_seqs:bs].fill_(self.scratch_block * self.runner.block_size)
        self.block_tables[num_seqs:bs].fill_(self.scratch_block)
        self.positions[num_seqs:bs].zero_()
        self.kv_lens[num_seqs:bs].fill_(1)
        self.visible_start[num_seqs:bs].zero_()
        self.graphs[bs].replay()
        return self.logits[bs][:num_seqs]
