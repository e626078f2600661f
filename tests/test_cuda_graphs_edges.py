"""Edges of the CUDA-graph buckets and static buffers (cuda_graphs.py) that test_cuda_graphs leaves open, without a
GPU and without a model: no prefill bucket of one sequence (it has no padding sequence) and none with as many tokens
as sequences (that is a decode bucket), the block tables a continuation stages, `set_padding` over buffers an older
step used, and the table width a bucket holds for a max_model_len that is not a multiple of the block size."""

from types import SimpleNamespace

import torch

from minipic_lite.cuda_graphs import StaticInputs, StepGraphs, graph_shapes
from minipic_lite.models.step import HostStep


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
