"""Edges of the step metadata (models/step.py) that test_step_inputs leaves open: the warm-up's one-sequence
prefill over a partial and over a whole last block, every tensor's dtype, and a hybrid's scratch states."""

import torch

from minipic_lite.models.step import HostStep, RecurrentStep, StepMetadata


def test_one_sequence_covers_a_partial_last_block():
    meta = StepMetadata.one_sequence(10, 4, torch.device("cpu"))
    assert meta.block_tables.tolist() == [[0, 1, 2]]
    assert meta.slot_mapping.tolist() == list(range(10)) and meta.positions.tolist() == list(range(10))
    assert (meta.cu_seqlens_q.tolist(), meta.kv_lens.tolist(), meta.num_decode_seqs) == ([0, 10], [10], 0)


def test_one_sequence_over_whole_blocks_takes_no_block_more():
    meta = StepMetadata.one_sequence(8, 4, torch.device("cpu"))
    assert meta.block_tables.tolist() == [[0, 1]] and meta.slot_mapping.tolist() == list(range(8))


def test_every_step_tensor_has_the_ops_dtype():
    """The op's contract (ops/README.md): int64 token rows, int32 per-sequence rows, int32 visible starts."""
    host = HostStep()
    host.add_chunk([7, 8, 9], [3], [(0, 3)], 3, [0, 1, 1], True, 4)
    host.add_chunk([4], [9], [(0, 1)], 1, None, True, 4)
    meta = StepMetadata.build(host, torch.device("cpu"))
    dtypes = {name: getattr(meta, name).dtype for name in ("slot_mapping", "positions", "block_tables",
                                                           "cu_seqlens_q", "kv_lens", "visible_start")}  # fmt: skip
    assert dtypes == {"slot_mapping": torch.long, "positions": torch.long, "block_tables": torch.int32,
                      "cu_seqlens_q": torch.int32, "kv_lens": torch.int32, "visible_start": torch.int32}  # fmt: skip


def test_scratch_states_are_zeros_per_sequence_with_the_ssm_in_float32():
    """The warm-up's states of a bf16 model: the conv inputs in the model's dtype, the recurrent state in float32."""
    host = HostStep()
    host.add_chunk([1, 2, 3], [0], [(0, 3)], 3, None, True, 4)
    host.add_chunk([4], [1], [(0, 1)], 1, None, True, 4)
    meta = StepMetadata.build(host, torch.device("cpu"))
    step = RecurrentStep.scratch(((3, 10, 2), (3, 4, 8, 8)), meta, torch.bfloat16)
    assert step.conv.shape == (3, 2, 10, 2) and step.conv.dtype == torch.bfloat16
    assert step.ssm.shape == (3, 2, 4, 8, 8) and step.ssm.dtype == torch.float32
    assert not step.conv.any() and not step.ssm.any()
    assert (step.slot_ids, step.query_lens, step.cu_seqlens_cpu.tolist()) == ([0, 1], [3, 1], [0, 3, 4])


def test_a_recurrent_step_is_a_decode_only_when_every_sequence_has_one_query_token():
    """The hybrid's one-token recurrent update serves a step of decodes only: one prefill among them needs the
    chunked path."""
    conv, ssm = torch.zeros(1, 3, 4, 2), torch.zeros(1, 3, 2, 4, 4)
    assert RecurrentStep.build([0, 2], [0, 1, 2], conv, ssm).is_decode
    assert not RecurrentStep.build([0, 2], [0, 1, 4], conv, ssm).is_decode
