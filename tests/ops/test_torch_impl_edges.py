"""Edges of the torch path (ops/torch_impl.py) that test_rope_paged_attention leaves open: a table entry past a
sequence's last block holds anything, even where that sequence's keys end exactly on a block boundary or the cache
has a single block; the grouping by query count keeps padding under 2x; a group at exactly RUNS_MIN_QUERIES queries
a sequence goes run by run."""

import random

import torch

from ops import rope_paged_attention, torch_impl
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


def test_a_cache_of_one_block_serves_a_batch_whose_sequences_read_different_block_counts():
    # one physical block, read once by a decode over 10 keys and twice by one over 20 (block 0 at logical 0 and 1):
    # the first sequence's unused table entry must not send the padded gather to a block that does not exist
    problem = make_problem([SeqSpec.decode(10), SeqSpec.decode(20)], 4, 2, 16, 16, torch.float32, seed=5)
    args = list(problem.args())
    args[1], args[2] = args[1][:1].clone(), args[2][:1].clone()
    args[3] = torch.tensor([[0, -1], [0, 0]], dtype=torch.int32)
    expected = rope_paged_attention(*args, impl="ref")
    torch.testing.assert_close(rope_paged_attention(*args, impl="torch"), expected, rtol=2e-5, atol=2e-5)


def test_query_count_groups_keep_padding_under_twice_and_decodes_among_themselves():
    q_lens = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 512, 1, 257, 300, 2, 1]
    random.Random(0).shuffle(q_lens)
    groups = torch_impl.group_by_query_len(q_lens)
    assert sorted(s for g in groups for s in g) == list(range(len(q_lens)))
    for group in groups:
        lens = [q_lens[s] for s in group]
        assert max(lens) < 2 * min(lens), lens  # each sequence padded to under twice its own query count
        assert min(lens) > 1 or max(lens) == 1, lens  # decode tokens never padded to a chunk's rows


def test_a_group_of_exactly_runs_min_queries_a_sequence_goes_run_by_run(monkeypatch):
    n = torch_impl.RUNS_MIN_QUERIES
    calls = []
    attend_runs = torch_impl.attend_runs
    monkeypatch.setattr(torch_impl, "attend_runs", lambda *args: calls.append(args[5].tolist()) or attend_runs(*args))
    problem = make_problem([SeqSpec.prefill(n), SeqSpec(n + 5, ((5, n + 5),))], 4, 2, 16, 16, torch.float32, seed=6)
    expected = rope_paged_attention(*problem.args(), impl="ref")
    torch.testing.assert_close(rope_paged_attention(*problem.args(), impl="torch"), expected, rtol=2e-5, atol=2e-5)
    assert calls == [[0, n, 2 * n]]  # both sequences, in one call
