"""Multi-step decode (bursts): the same tokens, texts and finish reasons as one step per scheduler visit."""

import pytest
import torch

import minipic_lite as mp
from minipic_lite.model_runner import StepInputs, advance_decode_inputs
from minipic_lite.models.step import StepMetadata


@pytest.fixture(scope="module")
def burst_llm(model_dir):
    return mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=512, num_scheduler_steps=4)


def record_bursts(llm) -> list[int]:
    """Patch the engine's scheduler to record each visit's num_steps."""
    seen, schedule = [], llm.engine.scheduler.schedule

    def recording():
        out = schedule()
        seen.append(out.num_steps)
        return out

    llm.engine.scheduler.schedule = recording
    return seen


def test_advance_decode_inputs_feeds_back_tokens_at_the_next_slot():
    meta = StepMetadata(
        slot_mapping=torch.tensor([4 * 3 + 3, 4 * 5 + 1]),
        block_tables=torch.tensor([[0, 3, 9], [5, 6, 0]], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32),
        positions=torch.tensor([7, 1]),  # B = 4: position 7 is the last slot of logical block 1 (physical 3)
        kv_lens=torch.tensor([8, 2], dtype=torch.int32),
        visible_start=torch.tensor([4, 0], dtype=torch.int32),
    )
    inputs = StepInputs(torch.tensor([11, 12]), meta, torch.tensor([0, 1]))
    nxt = advance_decode_inputs(inputs, torch.tensor([21, 22]), block_size=4)
    assert nxt.input_ids.tolist() == [21, 22]
    assert nxt.meta.positions.tolist() == [8, 2] and nxt.meta.kv_lens.tolist() == [9, 3]
    assert nxt.meta.slot_mapping.tolist() == [9 * 4 + 0, 5 * 4 + 2]  # seq 0 crosses into block 9
    assert nxt.meta.visible_start.tolist() == [4, 0] and nxt.logits_indices.tolist() == [0, 1]


def test_the_advance_kernel_writes_what_advance_decode_inputs_builds():
    """The graphs' one-launch advance (Triton, interpreted here) against the torch reference, in place on buffers
    shaped as a graph's: 300 sequences (three programs), tokens fed back from a burst's column (strided)."""
    from minipic_lite.advance_kernel import advance_decode_in_place

    gen = torch.Generator().manual_seed(0)
    num_seqs, block_size, width = 300, 4, 9
    kv_lens = torch.randint(1, block_size * (width - 1), (num_seqs,), generator=gen, dtype=torch.int32)
    positions = kv_lens.long() - 1
    tables = torch.randint(0, 1000, (num_seqs, width), generator=gen, dtype=torch.int32)
    slots = tables.gather(1, (positions // block_size)[:, None]).squeeze(1).long() * block_size + positions % block_size
    meta = StepMetadata(slots, tables, torch.arange(num_seqs + 1, dtype=torch.int32), positions, kv_lens,
                        torch.zeros(num_seqs, dtype=torch.int32))  # fmt: skip
    inputs = StepInputs(torch.randint(0, 50, (num_seqs,), generator=gen), meta, torch.arange(num_seqs))
    burst = torch.randint(0, 50, (num_seqs, 3), generator=gen)  # (num_seqs, num_steps): feed back column 1
    expected = advance_decode_inputs(inputs, burst[:, 1], block_size)
    buffers = [t.clone() for t in (inputs.input_ids, positions, slots, kv_lens, tables)]
    advance_decode_in_place(burst[:, 1], *buffers, block_size)
    input_ids, positions_after, slots_after, kv_lens_after, tables_after = buffers
    assert torch.equal(input_ids, expected.input_ids) and torch.equal(positions_after, expected.meta.positions)
    assert torch.equal(slots_after, expected.meta.slot_mapping) and torch.equal(kv_lens_after, expected.meta.kv_lens)
    assert torch.equal(tables_after, tables), "the tables are read, not written"
    assert (positions_after % block_size == 0).any(), "some sequence crossed into its next block"


def test_bursts_give_the_same_outputs_as_single_steps(llm, burst_llm):
    prompts = ["1, 2, 3, 4, 5, 6,", "The capital of France is", "def fibonacci(n):", "Once upon a time"]
    base = llm.generate(prompts[0], mp.SamplingParams(max_tokens=12, temperature=0.0), use_tqdm=False)[0]
    params = [
        mp.SamplingParams(max_tokens=13, temperature=0.0, stop=[base.text.split(",")[2]]),  # stops mid-burst
        mp.SamplingParams(max_tokens=7, temperature=0.0),  # ends on a max_tokens that is no multiple of 4
        mp.SamplingParams(max_tokens=21, temperature=0.0, stop_token_ids=[base.token_ids[5]]),
        mp.SamplingParams(max_tokens=18, temperature=0.9, top_p=0.9, seed=5),
    ]
    expected = llm.generate(prompts, params, use_tqdm=False)
    seen = record_bursts(burst_llm)
    num_generated_before = burst_llm.engine.stats.num_generated_tokens  # NOTE: the module's engine, shared
    outs = burst_llm.generate(prompts, params, use_tqdm=False)
    assert max(seen) == 4  # bursts did run
    for out, exp in zip(outs, expected, strict=True):
        assert (out.token_ids, out.text, out.finish_reason, out.stop_reason) == (
            exp.token_ids, exp.text, exp.finish_reason, exp.stop_reason,
        )  # fmt: skip
    assert outs[0].finish_reason == "stop" and outs[1].finish_reason == "length"
    pool = burst_llm.engine.pool
    pool.check_integrity()
    assert pool.num_free_blocks == pool.num_blocks
    num_generated = burst_llm.engine.stats.num_generated_tokens - num_generated_before
    assert num_generated == sum(len(o.token_ids) for o in outs)


def test_blocks_completed_by_a_final_burst_are_hit_by_the_next_request(burst_llm):
    burst_llm.engine.pool.reset_prefix_cache()
    prompt_ids = burst_llm.encode("Write a long story about a robot:")[0]
    # the last step computes position 47 (the end of block 2) and stops: that burst completes block 2
    params = mp.SamplingParams(max_tokens=49 - len(prompt_ids), temperature=0.0, ignore_eos=True)
    first = burst_llm.generate([prompt_ids], params, use_tqdm=False)[0]
    follow = first.prompt_token_ids + first.token_ids
    assert len(follow) == 49
    again = burst_llm.generate([follow], mp.SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert again.num_cached_tokens == 48


def graph_buffers(num_seqs: int, padding: int, block_size: int, width: int, extra_columns: int):
    """A decode step's buffers as a graph holds them: views of the first `num_seqs` rows of larger buffers (the padding
    rows after them), tables read from the first `width` columns of wider rows."""
    gen = torch.Generator().manual_seed(1)
    rows = num_seqs + padding
    kv_lens = torch.randint(1, block_size * (width - 1), (rows,), generator=gen, dtype=torch.int32)
    tables = torch.randint(0, 1000, (rows, width + extra_columns), generator=gen, dtype=torch.int32)
    positions = kv_lens.long() - 1
    slots = tables.gather(1, (positions // block_size)[:, None]).squeeze(1).long() * block_size + positions % block_size
    input_ids = torch.randint(0, 50, (rows,), generator=gen)
    return [input_ids, positions, slots, kv_lens, tables]


def test_the_advance_kernel_reads_strided_tables_and_writes_no_padding_row():
    """130 sequences (a second program of 2) in buffers of 140 rows whose tables are 5 columns of rows of 12: the
    sequences advance as the reference builds it, the padding rows stay as they were."""
    from minipic_lite.advance_kernel import advance_decode_in_place

    num_seqs, block_size, width = 130, 4, 5
    full = graph_buffers(num_seqs, 10, block_size, width, extra_columns=7)
    before = [t.clone() for t in full]
    views = [t[:num_seqs] for t in full[:4]] + [full[4][:num_seqs, :width]]
    assert views[4].stride(0) == width + 7
    meta = StepMetadata(views[2].clone(), views[4].clone(), torch.arange(num_seqs + 1, dtype=torch.int32),
                        views[1].clone(), views[3].clone(), torch.zeros(num_seqs, dtype=torch.int32))  # fmt: skip
    sampled = torch.arange(num_seqs) + 7
    expected = advance_decode_inputs(StepInputs(views[0].clone(), meta, torch.arange(num_seqs)), sampled, block_size)
    advance_decode_in_place(sampled, *views, block_size)
    for got, want in zip(views[:4], (expected.input_ids, *(getattr(expected.meta, name)
                         for name in ("positions", "slot_mapping", "kv_lens"))), strict=True):  # fmt: skip
        assert torch.equal(got, want)
    for after, old in zip(full, before, strict=True):
        assert torch.equal(after[num_seqs:], old[num_seqs:]), "a padding row was written"


@pytest.mark.parametrize(
    "case",
    ["input_ids_int32", "positions_strided", "slot_mapping_short", "kv_lens_int64", "tables_int64",
     "tables_column_major", "kv_lens_short", "sampled_int32"],
)  # fmt: skip
def test_the_advance_kernel_refuses_buffers_it_would_misread(case):
    """Each buffer's type, length and layout are checked before the launch: the kernel would read or write the wrong
    elements (or bytes) of any of them, silently."""
    from minipic_lite.advance_kernel import advance_decode_in_place

    input_ids, positions, slots, kv_lens, tables = graph_buffers(4, 0, 4, 3, extra_columns=0)
    sampled = torch.arange(4)
    if case == "input_ids_int32":
        input_ids = input_ids.int()
    elif case == "positions_strided":
        positions = torch.stack([positions, positions], 1).flatten()[::2]
    elif case == "slot_mapping_short":
        slots = slots[:3]
    elif case == "kv_lens_int64":
        kv_lens = kv_lens.long()
    elif case == "tables_int64":
        tables = tables.long()
    elif case == "tables_column_major":
        tables = tables.t().contiguous().t()
    elif case == "kv_lens_short":
        kv_lens = kv_lens[:3]
    elif case == "sampled_int32":
        sampled = sampled.int()
    buffers = (input_ids, positions, slots, kv_lens, tables)
    saved = [t.clone() for t in buffers]
    with pytest.raises(AssertionError):
        advance_decode_in_place(sampled, *buffers, 4)
    assert all(torch.equal(a, b) for a, b in zip(buffers, saved, strict=True)), "refused before a write"
