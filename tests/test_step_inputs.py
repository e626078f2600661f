"""The step's host inputs (models/step.py): the slot mapping built by block runs, the tensors built from it; and the
host tier's copies of a step, batched by runs (ModelRunner.copy_blocks)."""

from __future__ import annotations

import random

import torch

from minipic_lite.models.step import HostStep, StepMetadata, host_tensor, leading_decodes


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
    assert meta.num_decode_seqs == 0, "the decode comes after the prefill: no leading decodes"
    assert host_tensor([], torch.long).shape == (0,)
    assert host_tensor([2**40, -3], torch.long).tolist() == [2**40, -3]


def test_leading_decodes_counts_the_one_token_sequences_at_the_start():
    assert leading_decodes([0, 1, 2, 3, 20, 21]) == 3  # the decode after the prefill does not count
    assert leading_decodes([0, 1, 2]) == 2 and leading_decodes([0, 5, 6]) == 0 and leading_decodes([0]) == 0


# -- the host tier's copies, batched by runs (ModelRunner.copy_blocks) --------------------------------------------


def test_batched_host_copies_keep_the_order_of_a_step():
    """Runs of copies in one direction move together, yet a load reads what an earlier eviction of the same step
    wrote to its slot, and an eviction after a load does not change what the load read: each copy's own effect."""
    from types import SimpleNamespace

    from minipic_lite.host_tier import BlockCopy
    from minipic_lite.model_runner import ModelRunner

    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(2, 3, 6, 4, 2, 8, generator=gen)  # [K/V, layers, blocks, B, H, D]
    host = torch.randn(5, 2, 3, 4, 2, 8, generator=gen)  # [slots, K/V, layers, B, H, D]
    runner = SimpleNamespace(kv_cache=kv.clone(), host_cache=host.clone(), device=torch.device("cpu"), dtype=kv.dtype)
    copies = [BlockCopy(True, 1, 0), BlockCopy(True, 2, 3), BlockCopy(False, 4, 0), BlockCopy(False, 5, 2),
              BlockCopy(True, 4, 2), BlockCopy(False, 0, 2)]  # fmt: skip
    ModelRunner.copy_blocks(runner, copies)
    expected_kv, expected_host = kv.clone(), host.clone()
    for c in copies:  # the reference: one copy at a time, in order
        if c.to_host:
            expected_host[c.slot] = expected_kv[:, :, c.block_id]
        else:
            expected_kv[:, :, c.block_id] = expected_host[c.slot]
    assert torch.equal(runner.kv_cache, expected_kv) and torch.equal(runner.host_cache, expected_host)
    assert torch.equal(runner.kv_cache[:, :, 4], kv[:, :, 1])  # loaded what the first eviction wrote to slot 0
    assert torch.equal(runner.kv_cache[:, :, 5], host[2])  # read slot 2 before block 4's eviction overwrote it
    assert torch.equal(runner.kv_cache[:, :, 0], kv[:, :, 1])  # slot 2 after it: block 4's, which held block 1's


def test_a_mixed_steps_decodes_lead_so_the_op_gets_them_as_its_hint(tmp_path, monkeypatch):
    """The scheduler puts running decodes before a newly admitted prompt, and the engine passes how many lead to the
    op (`num_decode_seqs`): if the order changed, the hint would silently stop splitting mixed steps on the GPU."""
    import minipic_lite as mp
    from minipic_lite.models import llama
    from tests.conftest import save_tiny_llama

    llm = mp.LLM(str(save_tiny_llama(tmp_path / "tiny", vocab_size=64)), device="cpu", dtype="float32",
                 max_model_len=256, num_blocks=64, block_size=4, cpu_decode_mirror=False)  # fmt: skip
    hints, op = [], llama.rope_paged_attention

    def recorded(*args, **kwargs):
        hints.append((args[3].shape[0], kwargs["num_decode_seqs"]))  # (sequences, the hint)
        return op(*args, **kwargs)

    monkeypatch.setattr(llama, "rope_paged_attention", recorded)
    params = mp.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    def scenario(engine) -> list:  # NOTE: on the loop thread, in one call: the loop steps nothing in between
        for prompt in ([5, 6, 7, 8, 9], [10, 11, 12]):
            engine.add(engine.make_request(prompt, params))
        engine.step()  # both prompts prefill
        engine.add(engine.make_request(list(range(13, 53)), params))
        hints.clear()
        engine.step()  # the two decode, the new prompt prefills after them
        return list(hints)

    assert set(llm._loop.call(scenario)) == {(3, 2)}
