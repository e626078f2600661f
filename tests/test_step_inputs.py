"""The step's host inputs (models/step.py): the slot mapping built by block runs, and the tensors built from it."""

from __future__ import annotations

import random

import torch

from minipic_lite.models.step import HostStep, StepMetadata, host_tensor


def slots_by_token(block_table: list[int], ranges, block_size: int) -> list[int]:
    """The reference: each position's slot, one at a time."""
    positions = [p for start, end in ranges for p in range(start, end)]
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]


def test_the_slot_mapping_by_block_runs_equals_the_slot_of_every_position():
    rng = random.Random(0)
    for _ in range(300):
        block_size = rng.choice([1, 4, 16])
        num_tokens = rng.randint(6, 200)
        table = rng.sample(range(1000), -(-num_tokens // block_size))
        cuts = sorted(rng.sample(range(num_tokens + 1), rng.choice([2, 4, 6])))  # increasing, with holes
        ranges = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=True) if a < b] or [(0, num_tokens)]
        host = HostStep()
        host.add_chunk(list(range(num_tokens)), table, ranges, num_tokens, None, True, block_size)
        assert host.slot_mapping == slots_by_token(table, ranges, block_size)
        assert host.positions == [p for a, b in ranges for p in range(a, b)]


def test_step_tensors_hold_the_host_lists():
    host = HostStep()
    host.add_chunk([7, 8, 9, 10, 11], [5, 2], [(0, 2), (3, 5)], 5, [0, 0, 1, 1, 3], True, 4)
    host.add_chunk([4], [9], [(0, 1)], 1, None, True, 4)
    meta = StepMetadata.build(host, torch.device("cpu"))
    assert meta.slot_mapping.tolist() == [20, 21, 23, 8, 36] and meta.slot_mapping.dtype == torch.long
    assert meta.block_tables.tolist() == [[5, 2], [9, 0]] and meta.block_tables.dtype == torch.int32
    assert meta.cu_seqlens_q.tolist() == [0, 4, 5] and meta.positions.tolist() == [0, 1, 3, 4, 0]
    assert meta.visible_start.tolist() == [0, 0, 1, 3, 0] and meta.kv_lens.tolist() == [5, 1]
    assert host_tensor([], torch.long).shape == (0,)
    assert host_tensor([2**40, -3], torch.long).tolist() == [2**40, -3]
