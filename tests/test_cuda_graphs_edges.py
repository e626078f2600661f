"""Edges of the CUDA-graph buckets and static buffers (cuda_graphs.py) that test_cuda_graphs leaves open, without a
GPU and without a model: no prefill bucket of one sequence (it has no padding sequence) and none with as many tokens
as sequences (that is a decode bucket), the block tables a continuation stages, `set_padding` over buffers an older
step used, and the table width a bucket holds for a max_model_len that is not a multiple of the block size."""

from types import SimpleNamespace

import pytest
import torch

from minipic_lite.cuda_graphs import StaticInputs, StepGraphs, graph_shapes, pick_shape
from minipic_lite.models.step import HostStep, StepInputs, StepMetadata


def test_prefill_buckets_have_a_padding_sequence_and_more_tokens_than_sequences():
    """S > 1 (one sequence and its tokens leave no room for a padding sequence), S < T: a bucket of 16 sequences
    and 16 tokens is the decode bucket, listed once."""
    shapes = graph_shapes((1, 2, 16), max_num_seqs=16, token_sizes=(16, 32), max_tokens_per_seq=32)
    assert shapes == [(1, 1), (2, 2), (2, 16), (16, 16), (2, 32), (16, 32), (17, 32)]


def decode_step(tables: list[list[int]], positions: list[int]) -> HostStep:
    host = HostStep()
    for table, p in zip(tables, positions, strict=True):
        host.add_chunk(list(range(p + 1)), table, [(p, p + 1)], p + 1, None, True, 4)
    return host


def test_stage_tables_rewrites_every_row_it_is_given():
    """A continuation whose requests took blocks: each request's table as it is now, the last request's too."""
    static = StaticInputs(max_seqs=4, max_tokens=16, max_blocks=4, scratch_block=40, block_size=4, device="cpu")
    static.stage(decode_step([[5, 2], [9]], [6, 3]), (2, 2))
    static.stage_tables([[5, 2, 11], [9, 12]])
    assert static.block_tables[0, :3].tolist() == [5, 2, 11] and static.block_tables[1, :2].tolist() == [9, 12]


def test_set_padding_writes_the_padding_stage_writes_over_an_older_step():
    static = StaticInputs(max_seqs=4, max_tokens=16, max_blocks=4, scratch_block=40, block_size=4, device="cpu")
    older = HostStep()
    for i in range(4):
        older.add_chunk([60 + i] * 4, [30 + i], [(0, 4)], 4, [1, 1, 1, 1], True, 4)
    static.stage(older, (4, 16))  # every buffer row of the bucket holds this step's values
    static.set_padding(1, 3, (4, 16))  # one real sequence of 3 tokens; 3 padding sequences take 1, 1 and 11
    assert static.cu_seqlens_q[2:5].tolist() == [4, 5, 16]  # the real sequence's end, 3, is stage's to write
    assert static.slot_mapping[3:16].tolist() == [160] * 13  # the scratch block's first slot
    assert static.positions[3:16].tolist() == [0] * 13 and static.visible_start[3:16].tolist() == [0] * 13
    assert static.block_tables[1:4].tolist() == [[40] * 4] * 3 and static.kv_lens[1:4].tolist() == [1, 1, 1]


def test_a_bucket_holds_the_table_of_a_request_as_long_as_max_model_len(monkeypatch):
    """max_model_len 130 in blocks of 4: 33 blocks, the last one partial; a longer table runs eagerly."""
    monkeypatch.setattr(StepGraphs, "_capture_all", lambda self: None)
    config = SimpleNamespace(scheduler=SimpleNamespace(max_model_len=130))
    runner = SimpleNamespace(config=config, block_size=4, scratch_block=99, device=torch.device("cpu"))
    graphs = StepGraphs(runner, [(1, 1), (2, 2)])
    assert graphs.max_blocks == 33 and graphs.static.block_tables.shape == (2, 33)

    def decode_of(num_blocks: int):
        seq = SimpleNamespace(block_table=list(range(num_blocks)))
        return SimpleNamespace(scheduled=[SimpleNamespace(seq=seq, num_query_tokens=1)])

    assert graphs.shape_for(decode_of(33)) == (1, 1) and graphs.shape_for(decode_of(34)) is None


def test_a_step_never_takes_a_bucket_of_fewer_sequences_even_at_its_token_count():
    """Three sequences of 16 tokens do not fit a (2, 16) bucket, and a (4, 16) bucket leaves no token for its padding
    sequence: no bucket, the step runs eagerly."""
    assert pick_shape([(2, 16), (4, 16)], 3, 16) is None


def test_staged_metadata_gives_the_op_no_decode_hint():
    """A graph's metadata serves every step its bucket replays, whatever their mix of decodes and prefills: it never
    claims leading decodes, though the eager metadata of the same step does."""
    static = StaticInputs(max_seqs=4, max_tokens=16, max_blocks=4, scratch_block=40, block_size=4, device="cpu")
    host = decode_step([[5, 2], [9]], [6, 3])
    assert StepMetadata.build(host, torch.device("cpu")).num_decode_seqs == 2
    assert static.stage(host, (2, 2)).meta.num_decode_seqs == 0


def test_a_lone_token_staged_in_a_bucket_as_wide_as_the_buffers_pads_every_token_after_it():
    """One decode in a (2, 16) bucket on buffers of 16 tokens: a padding sequence of 15 tokens covers what an older
    step of 16 tokens left in every token row."""
    static = StaticInputs(max_seqs=4, max_tokens=16, max_blocks=4, scratch_block=40, block_size=4, device="cpu")
    older = HostStep()
    for i in range(4):
        older.add_chunk([60 + i] * 4, [30 + i], [(0, 4)], 4, [1, 1, 1, 1], True, 4)
    static.stage(older, (4, 16))
    inputs = static.stage(decode_step([[5]], [2]), (2, 16))
    assert inputs.input_ids.tolist() == [2] and static.cu_seqlens_q[:3].tolist() == [0, 1, 16]
    assert static.positions.tolist() == [2] + [0] * 15 and static.visible_start.tolist() == [0] * 16
    assert static.slot_mapping.tolist() == [22] + [160] * 15  # block 5's slot 2, then the scratch block's first slot
    assert static.kv_lens[:2].tolist() == [3, 1] and static.block_tables[:2, 0].tolist() == [5, 40]


def test_set_padding_of_the_widest_bucket_makes_every_sequence_padding():
    """The capture pads each bucket from no real sequence: in the bucket of every buffer row, sequences 0..2 take one
    token each and the last takes the other 13."""
    static = StaticInputs(max_seqs=4, max_tokens=16, max_blocks=4, scratch_block=40, block_size=4, device="cpu")
    static.set_padding(0, 0, (4, 16))
    assert static.cu_seqlens_q.tolist() == [0, 1, 2, 3, 16] and static.kv_lens.tolist() == [1, 1, 1, 1]
    assert static.slot_mapping.tolist() == [160] * 16 and static.block_tables[:, 0].tolist() == [40] * 4


def test_set_padding_leaves_the_real_sequences_entries_alone():
    """It writes the padding only: a real sequence's end and kv_len are its step's to write (`stage`), whatever the
    buffers hold meanwhile."""
    static = StaticInputs(max_seqs=4, max_tokens=16, max_blocks=4, scratch_block=40, block_size=4, device="cpu")
    older = HostStep()
    for i in range(4):
        older.add_chunk([60 + i] * 4, [30 + i], [(0, 4)], 4, [1, 1, 1, 1], True, 4)
    static.stage(older, (4, 16))
    static.set_padding(1, 3, (4, 16))
    assert static.cu_seqlens_q[:2].tolist() == [0, 4] and static.kv_lens.tolist() == [4, 1, 1, 1]
    assert static.block_tables[0, 0] == 30 and static.slot_mapping[:3].tolist() == [120, 121, 122]


def test_the_buffers_hold_the_most_sequences_and_the_most_tokens_of_any_bucket(monkeypatch):
    """The widest bucket in sequences and the widest in tokens need not be the same one: (4, 4) and (2, 16)."""
    monkeypatch.setattr(StepGraphs, "_capture_all", lambda self: None)
    config = SimpleNamespace(scheduler=SimpleNamespace(max_model_len=16))
    runner = SimpleNamespace(config=config, block_size=4, scratch_block=9, device=torch.device("cpu"))
    graphs = StepGraphs(runner, [(4, 4), (2, 16)])
    assert graphs.static.block_tables.shape == (4, 4) and graphs.static.input_ids.shape == (16,)


def test_a_graph_replays_only_inputs_staged_in_its_buffers(monkeypatch):
    """Eager inputs live in tensors of their own: a replay would read whatever step the static buffers hold."""
    monkeypatch.setattr(StepGraphs, "_capture_all", lambda self: None)
    config = SimpleNamespace(scheduler=SimpleNamespace(max_model_len=16))
    runner = SimpleNamespace(config=config, block_size=4, scratch_block=9, device=torch.device("cpu"))
    graphs = StepGraphs(runner, [(1, 1)])
    host = decode_step([[5]], [2])
    eager = StepInputs(torch.tensor(host.input_ids), StepMetadata.build(host, torch.device("cpu")), torch.tensor([0]))
    with pytest.raises(AssertionError, match="stage the step"):
        graphs.run(eager, (1, 1))
