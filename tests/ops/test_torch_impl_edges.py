"""Edges of the torch path (ops/torch_impl.py) that test_rope_paged_attention leaves open: a table entry past a
sequence's last block holds anything, even where that sequence's keys end exactly on a block boundary."""

import torch

from ops import rope_paged_attention
from ops.testing import SeqSpec, make_problem


def test_a_table_entry_right_after_a_full_last_block_is_never_read():
    # two decodes, 32 keys (two full blocks of 16) and 40: the group gathers three blocks for each
    problem = make_problem([SeqSpec.decode(32), SeqSpec.decode(40)], 4, 2, 16, 16, torch.float32, seed=4)
    args = list(problem.args())
    tables = args[3].clone()
    assert tables.shape[1] >= 3
    tables[0, 2] = -1  # past the first sequence's keys
    args[3] = tables
    expected = rope_paged_attention(*args, impl="ref")
    torch.testing.assert_close(rope_paged_attention(*args, impl="torch"), expected, rtol=2e-5, atol=2e-5)
