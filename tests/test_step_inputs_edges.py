"""Edges of the step metadata (models/step.py) that test_step_inputs leaves open: the warm-up's one-sequence
prefill over a partial last block."""

import torch

from minipic_lite.models.step import StepMetadata


def test_one_sequence_covers_a_partial_last_block():
    meta = StepMetadata.one_sequence(10, 4, torch.device("cpu"))
    assert meta.block_tables.tolist() == [[0, 1, 2]]
    assert meta.slot_mapping.tolist() == list(range(10)) and meta.positions.tolist() == list(range(10))
    assert (meta.cu_seqlens_q.tolist(), meta.kv_lens.tolist(), meta.num_decode_seqs) == ([0, 10], [10], 0)
