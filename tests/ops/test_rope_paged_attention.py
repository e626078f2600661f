"""rope_paged_attention: every implementation against the float32 reference, plus RoPE and launcher checks.

The Triton kernel runs under ``TRITON_INTERPRET=1`` (set in ``conftest.py`` before triton is imported) at
small shapes; the vectorized torch implementation runs a wider grid at larger shapes.
"""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops import apply_rope, rope_paged_attention, rope_paged_attention_ref
from ops.rope import rope_cos_sin
from ops.testing import Problem, SeqSpec, assert_close, make_problem

TOLERANCE = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}  # atol = rtol, vs float32 ref
DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}

# -- scenarios: lists of SeqSpec (kv_len, queried position ranges, SSEP segments) --
SCENARIOS = {
    "prefill_T63": [SeqSpec.prefill(63)],
    "decode_only": [SeqSpec.decode(n) for n in (1, 17, 40, 100)],
    "holes": [SeqSpec(80, ((0, 16), (48, 64), (70, 80)))],
    "ssep_segments": [SeqSpec(96, ((0, 96),), ((16, 48), (48, 80)))],
    "mixed": [
        SeqSpec(63, ((0, 16), (48, 63)), ((16, 48),)),
        SeqSpec.decode(40),
        SeqSpec(70, ((20, 70),), ((16, 50),)),
        SeqSpec.decode(1),
    ],
    "chunk_after_cache": [SeqSpec(77, ((45, 77),)), SeqSpec(33, ((32, 33),))],
    "short_over_long": [SeqSpec(1100, ((1090, 1100),))],  # 69 key tiles of 16: with 48 splits, 35 hold keys
}
LARGE_SCENARIOS = {
    "many_blocks_prefill": [SeqSpec(1000, ((0, 200), (600, 1000)), ((200, 600),))],
    "many_blocks_decode": [SeqSpec.decode(n) for n in (1, 63, 500, 999, 1024, 257)],
    "many_blocks_mixed": [SeqSpec(700, ((512, 700),))] + [SeqSpec.decode(100 + 37 * i) for i in range(12)],
}
HEADS = {"mha4": (4, 4), "gqa3": (9, 3), "gqa4": (8, 2)}


def run_impl(problem: Problem, impl: str, **kwargs) -> torch.Tensor:
    if impl == "triton":
        from ops.triton_kernel import rope_paged_attention_triton

        out = torch.full_like(problem.q, float("nan"))  # poisoned: every element must be written
        return rope_paged_attention_triton(*problem.args(), out=out, **kwargs)
    return rope_paged_attention(*problem.args(), impl=impl)


def check_against_ref(problem: Problem, impl: str, what: str, **kwargs) -> None:
    k_before, v_before = problem.k_cache.clone(), problem.v_cache.clone()
    actual = run_impl(problem, impl, **kwargs)
    expected = rope_paged_attention_ref(*problem.args())
    tol = TOLERANCE[problem.q.dtype]
    assert actual.dtype == problem.q.dtype and actual.shape == problem.q.shape
    assert_close(actual, expected, atol=tol, rtol=tol, what=what)
    assert torch.equal(problem.k_cache, k_before) and torch.equal(problem.v_cache, v_before), "cache written"


# ------------------------------------------------------------------------------------------------------
# the Triton kernel (interpreter): a curated grid, each axis covered at least once
# ------------------------------------------------------------------------------------------------------

SHORT = {"PRE_ROTATE": False, "BLOCK_M": 128, "TABLE_AHEAD": True}  # pick_config's short read on CUDA (head_dim 128)
TABLE_AHEAD = {"TABLE_AHEAD": True, "num_stages": 3, "TILE_N": 16}
DENSE_HALVES = {"DENSE": True, "Q_SPLIT": 2, "TILE_N": 16}
SPLIT_IDS = {"SPLIT_IDS": True, "NUM_SPLITS": 4}
MERGE_CUT = {"NUM_SPLITS": 8, "MERGE_D_CHUNK": 32, "MERGE_WARPS": 2}  # the merge's dims over programs, 2 warps each
TRITON_CASES = [
    # scenario, heads, head_dim, rotary_dim, block_size, dtype, position_free, extra, config
    ("prefill_T63", "gqa4", 64, None, 16, torch.float32, True, {}, None),
    ("decode_only", "gqa4", 64, None, 16, torch.float32, True, {}, None),
    ("holes", "gqa3", 64, None, 16, torch.float32, True, {}, None),
    ("ssep_segments", "mha4", 64, None, 32, torch.float32, True, {}, None),
    ("mixed", "gqa4", 64, None, 16, torch.float32, True, {"repeat_block": True}, None),
    ("mixed", "gqa4", 64, None, 16, torch.float32, True, {"share_span": True}, None),
    ("mixed", "gqa3", 64, 32, 16, torch.float32, True, {}, None),
    ("mixed", "gqa4", 64, None, 16, torch.float32, False, {}, None),
    ("mixed", "gqa4", 128, None, 32, torch.bfloat16, True, {"repeat_block": True}, None),
    ("mixed", "gqa4", 128, 64, 16, torch.float16, True, {"share_span": True}, None),
    ("mixed", "mha4", 256, 64, 16, torch.float32, True, {}, None),
    ("chunk_after_cache", "gqa3", 64, None, 16, torch.bfloat16, True, {}, None),
    ("mixed", "gqa4", 64, None, 16, torch.float32, True, {}, {"PRE_ROTATE": False}),
    ("mixed", "gqa4", 128, 32, 32, torch.bfloat16, True, {}, {"PRE_ROTATE": False, "BLOCK_M": 64}),
    ("decode_only", "gqa3", 64, None, 16, torch.float32, True, {}, {"PRE_ROTATE": True}),
    ("decode_only", "gqa4", 64, None, 16, torch.float32, True, {}, {"NUM_SPLITS": 4}),
    ("mixed", "gqa3", 64, 32, 16, torch.float16, True, {"repeat_block": True}, {"NUM_SPLITS": 2, "TILE_N": 32}),
    # a short prefill over a cached context as CUDA runs it: one query tile per sequence, keys rotated in the
    # kernel, split-KV (ssep: a split can hold no key a row may see)
    ("chunk_after_cache", "gqa4", 64, None, 16, torch.bfloat16, True, {}, {**SHORT, "NUM_SPLITS": 4}),
    ("ssep_segments", "mha4", 64, 32, 16, torch.float32, True, {}, {**SHORT, "NUM_SPLITS": 8, "TILE_N": 16}),
    # the merge's dims cut over programs (MERGE_D_CHUNK), with one or two warps each
    ("decode_only", "gqa4", 64, None, 16, torch.float32, True, {}, {"NUM_SPLITS": 4, "MERGE_D_CHUNK": 16}),
    ("chunk_after_cache", "gqa4", 64, None, 16, torch.bfloat16, True, {}, {**SHORT, **MERGE_CUT}),
    # more splits than pick_config takes (a sweep's): the reduce kernel widens past 32 to merge them all
    ("short_over_long", "gqa4", 64, None, 16, torch.float32, True, {}, {**SHORT, "NUM_SPLITS": 48, "TILE_N": 16}),
    # the grid's axis order against the launcher's choice (tiles last exactly when the key range is split)
    ("decode_only", "gqa4", 64, None, 16, torch.float32, True, {}, {"NUM_SPLITS": 4, "TILES_LAST": False}),
    ("mixed", "gqa3", 64, None, 16, torch.float32, True, {"share_span": True}, {"TILES_LAST": True}),
    # the next tile's block ids read an iteration ahead (TABLE_AHEAD: the short read's default on CUDA), with
    # 16-key tiles so each loop walks several: decode, a short read over 1,100 keys split 4 ways, masked SSEP
    # segments (a split's loop may be empty), partial rotary, keys as stored, pre-rotated keys (one table for both)
    ("decode_only", "gqa4", 64, None, 16, torch.float32, True, {}, {**TABLE_AHEAD, "NUM_SPLITS": 1}),
    ("short_over_long", "gqa4", 64, None, 16, torch.bfloat16, True, {}, {**SHORT, **TABLE_AHEAD, "NUM_SPLITS": 4}),
    ("ssep_segments", "mha4", 64, 32, 16, torch.float32, True, {}, {**SHORT, **TABLE_AHEAD, "NUM_SPLITS": 2}),
    ("mixed", "gqa4", 128, 64, 16, torch.bfloat16, True, {"share_span": True}, {**TABLE_AHEAD, "PRE_ROTATE": False}),
    ("mixed", "gqa4", 64, None, 16, torch.float32, False, {}, TABLE_AHEAD),
    ("mixed", "gqa3", 64, None, 16, torch.float32, True, {"repeat_block": True}, {**TABLE_AHEAD, "PRE_ROTATE": True}),
    # tiles smaller than a block (16 keys in blocks of 32): a key's slot is not the same in every tile
    ("short_over_long", "gqa4", 64, None, 32, torch.bfloat16, True, {}, {**SHORT, **TABLE_AHEAD, "NUM_SPLITS": 4}),
    ("decode_only", "gqa4", 64, None, 32, torch.float32, True, {}, {**TABLE_AHEAD, "NUM_SPLITS": 2}),
    # a split's block ids read once before its loop and taken from registers tile by tile (SPLIT_IDS): 16- and
    # 32-key tiles over 16-key blocks, 16-key tiles in 32-key blocks (refused: the ids are read tile by tile),
    # masked SSEP segments (a split may start past the sequence's first tile), a short read over 1,100 keys
    ("decode_only", "gqa4", 64, None, 16, torch.float32, True, {}, {**SPLIT_IDS, "TILE_N": 16}),
    ("decode_only", "gqa4", 64, None, 16, torch.bfloat16, True, {}, {**SPLIT_IDS, "NUM_SPLITS": 2, "TILE_N": 32}),
    ("decode_only", "gqa4", 64, None, 32, torch.float32, True, {}, {**SPLIT_IDS, "NUM_SPLITS": 2, "TILE_N": 16}),
    ("ssep_segments", "mha4", 64, 32, 16, torch.float32, True, {}, {**SHORT, **SPLIT_IDS, "TILE_N": 16}),
    ("short_over_long", "gqa4", 64, None, 16, torch.bfloat16, True, {}, {**SHORT, **SPLIT_IDS, "num_stages": 3}),
    # the dense kernel (gathered K and V, tensor-descriptor loads; the default for 16-bit prefill on Hopper)
    ("mixed", "gqa4", 128, None, 16, torch.bfloat16, True, {"repeat_block": True}, {"DENSE": True}),
    ("mixed", "gqa3", 64, 32, 32, torch.float16, True, {"share_span": True}, {"DENSE": True, "TILE_N": 32}),
    ("mixed", "gqa4", 64, None, 16, torch.bfloat16, False, {}, {"DENSE": True, "BLOCK_M": 16, "TILE_N": 16}),
    ("ssep_segments", "mha4", 256, 64, 16, torch.float16, True, {}, {"DENSE": True, "BLOCK_M": 64, "TILE_N": 32}),
    ("prefill_T63", "gqa3", 64, None, 16, torch.bfloat16, True, {}, {"DENSE": True, "WARP_SPECIALIZE": True}),
    ("mixed", "gqa4", 64, None, 16, torch.float32, True, {}, {"DENSE": True}),  # float32: the paged kernel
    # the dense kernel's tile as two halves sharing each key tile (Q_SPLIT): a half may split a token's heads (gqa3)
    ("mixed", "gqa4", 128, None, 16, torch.bfloat16, True, {"repeat_block": True}, {**DENSE_HALVES, "BLOCK_M": 64}),
    ("ssep_segments", "gqa3", 64, 32, 16, torch.float16, True, {}, {**DENSE_HALVES, "BLOCK_M": 32}),
    ("prefill_T63", "gqa4", 64, None, 16, torch.bfloat16, False, {}, {**DENSE_HALVES, "WARP_SPECIALIZE": True}),
    ("mixed", "gqa4", 64, None, 16, torch.bfloat16, True, {}, {**DENSE_HALVES, "BLOCK_M": 32, "HEADS_FIRST": True}),
]


def case_id(case) -> str:
    scenario, heads, head_dim, rotary_dim, block_size, dtype, pf, extra, config = case
    parts = [scenario, heads, f"d{head_dim}", f"B{block_size}", DTYPE_IDS[dtype]]
    parts.append("rope" + ("" if rotary_dim is None else str(rotary_dim)) if pf else "stored")
    parts += list(extra) + [f"{k}={v}" for k, v in (config or {}).items()]
    return "-".join(parts)


@pytest.mark.parametrize("case", TRITON_CASES, ids=[case_id(c) for c in TRITON_CASES])
def test_triton_matches_reference(case):
    scenario, heads, head_dim, rotary_dim, block_size, dtype, pf, extra, config = case
    num_heads, num_kv_heads = HEADS[heads]
    problem = make_problem(
        SCENARIOS[scenario], num_heads, num_kv_heads, head_dim, block_size, dtype, rotary_dim, pf,
        seed=zlib.crc32(case_id(case).encode()) % 10_000, **extra,
    )  # fmt: skip
    check_against_ref(problem, "triton", case_id(case), config=config)


@pytest.mark.parametrize("position_free", [True, False], ids=["rope", "stored"])
def test_triton_reads_a_mixed_steps_leading_decodes_in_a_launch_of_their_own(monkeypatch, position_free):
    """Decodes first, then a prefill that makes the batch prefill-like (39 query tokens a sequence x 4 heads > 128
    rows): with the hint the decodes take a decode launch and the prefill its own, into one output that matches
    the reference; without it, one launch."""
    from ops import triton_kernel

    seqs = [SeqSpec.decode(40), SeqSpec.decode(1), SeqSpec.decode(100), SeqSpec(170, ((20, 170),), ((40, 90),))]
    problem = make_problem(seqs, 8, 2, 64, 16, torch.float32, None, position_free, seed=5)
    launches = []
    kernel = triton_kernel.rope_paged_attention_triton

    def recorded(q, *args, **kwargs):
        launches.append((q.shape[0], args[2].shape[0]))  # (tokens, sequences)
        # NOTE: Triton compiles a variant per pointer alignment: after 3 decodes a slice of kv_lens starts 12 bytes in
        assert all(t.data_ptr() % 16 == 0 for t in (q, *args[2:7])), "a launch would compile an unaligned variant"
        return kernel(q, *args, **kwargs)

    monkeypatch.setattr(triton_kernel, "rope_paged_attention_triton", recorded)
    check_against_ref(problem, "triton", "split", num_decode_seqs=3)
    assert launches == [(153, 4), (3, 3), (150, 1)]
    launches.clear()
    check_against_ref(problem, "triton", "unsplit", num_decode_seqs=0)
    assert launches == [(153, 4)]
    assert triton_kernel.is_split_worth_it(153, 4, 4, 3) and not triton_kernel.is_split_worth_it(153, 4, 4, 4)
    assert not triton_kernel.is_split_worth_it(20, 4, 4, 3), "a short batch reads as one (decode-like configs)"


@pytest.mark.parametrize("splits", [1, 4])
def test_one_token_sequences_map_tiles_to_sequences_without_a_search(monkeypatch, splits):
    """A decode batch (as many query tokens as sequences) launches one query tile a sequence, tile i reading
    sequence i with no search of cu_seqlens_q (ONE_TOKEN_SEQS): its output is bitwise the searched launch's and
    matches the reference. pick_config sets it for decodes only, and a config that claims it for a batch with more
    tokens than sequences is refused."""
    from ops import triton_kernel as tk

    grids, kernel = [], tk._rope_paged_attention_kernel

    class Recorder:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(tk, "_rope_paged_attention_kernel", Recorder())
    seqs = [SeqSpec.decode(n) for n in (1, 40, 17, 100, 33)]
    problem = make_problem(seqs, 9, 3, 32, 16, torch.float32, None, True, seed=11)
    cfg = {"NUM_SPLITS": splits, "TILE_N": 16}
    assert tk.config_for_args(problem.q, problem.k_cache, problem.block_tables, problem.cos_sin)["ONE_TOKEN_SEQS"]
    check_against_ref(problem, "triton", "one token a sequence", config=cfg)
    direct = run_impl(problem, "triton", config=cfg)
    searched = run_impl(problem, "triton", config={**cfg, "ONE_TOKEN_SEQS": False})
    assert torch.equal(direct, searched)
    tiles = [grid[2] if splits > 1 else grid[0] for grid in grids]
    assert tiles == [5, 5, 5 // 4 + 5], "one tile a sequence; the search launches the general grid"
    assert not tk.pick_config(6, 5, 3, 3, 32, 128, True, torch.device("cpu"))["ONE_TOKEN_SEQS"]
    prefill = make_problem([SeqSpec.prefill(3), SeqSpec.decode(9)], 9, 3, 32, 16, torch.float32, None, True, seed=2)
    with pytest.raises(ValueError, match="ONE_TOKEN_SEQS"):
        run_impl(prefill, "triton", config={"ONE_TOKEN_SEQS": True})


def test_offsets_fit_int32_counts_the_farthest_element():
    """The read kernel's int32 offsets (INT32_OFFSETS) hold while every element lies less than 2^31 elements from its
    tensor's first: a layer of 2^17 blocks of 16 x 8 x 128 (2^31 elements) is the last that fits."""
    from ops.triton_kernel import offsets_fit_int32

    def layer(num_blocks):  # shapes only: a meta tensor has no storage
        return torch.empty(num_blocks, 16, 8, 128, device="meta")

    assert offsets_fit_int32(layer(2**17)) and not offsets_fit_int32(layer(2**17 + 1))
    assert offsets_fit_int32(layer(8), None, torch.empty(4096, 128, device="meta"))
    assert not offsets_fit_int32(layer(8), layer(2**17 + 1)), "every tensor counts"
    # a layer of the engine's [2, layers, blocks, B, H, D] cache: its blocks' stride, not its neighbours'
    cache = torch.empty(2, 4, 2**16, 16, 8, 128, device="meta")
    assert offsets_fit_int32(*cache[:, 3]) and not offsets_fit_int32(cache[0])


@pytest.mark.parametrize("scenario", ["decode", "short"])
def test_int32_offsets_read_what_int64_offsets_read(monkeypatch, scenario):
    """The read kernel with its key, value and cos/sin offsets in int32 (the default where they fit) gives bitwise
    the int64 path's output, both the reference's; a config asking for int32 where they do not fit is refused."""
    from ops import triton_kernel as tk

    seqs = [SeqSpec.decode(n) for n in (1, 40, 17)] if scenario == "decode" else [SeqSpec.prefill(60, start=51)]
    config = {"NUM_SPLITS": 2, "TILE_N": 16, "TABLE_AHEAD": True}
    problem = make_problem(seqs, 9, 3, 32, 16, torch.bfloat16, None, True, seed=5)
    assert tk.offsets_fit_int32(problem.k_cache, problem.v_cache, problem.cos_sin)
    check_against_ref(problem, "triton", f"int32 offsets, {scenario}", config=config)
    wide = run_impl(problem, "triton", config={**config, "INT32_OFFSETS": False})
    assert torch.equal(run_impl(problem, "triton", config=config), wide)
    monkeypatch.setattr(tk, "offsets_fit_int32", lambda *tensors: False)  # as over a layer of 2^31 elements
    with pytest.raises(ValueError, match="INT32_OFFSETS"):
        run_impl(problem, "triton", config={**config, "INT32_OFFSETS": True})
    assert torch.equal(run_impl(problem, "triton", config=config), wide), "then the default takes int64"


@pytest.mark.parametrize("max_grid", [65535, 4])
def test_dense_heads_first_grid_falls_back_past_the_grid_limit(monkeypatch, max_grid):
    """HEADS_FIRST puts the kv heads on the grid's x axis and the query tiles on y (CUDA: at most 65,535): past it the
    launch keeps tiles on x. Both grids give the reference's output."""
    from ops import triton_kernel as tk

    grids = []
    kernel = tk._dense_attention_kernel

    class Recorder:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(tk, "MAX_GRID_Z", max_grid)
    monkeypatch.setattr(tk, "_dense_attention_kernel", Recorder())
    problem = make_problem(SCENARIOS["mixed"], 8, 2, 64, 16, torch.float16, None, True, seed=3)
    check_against_ref(problem, "triton", "heads first", config={"DENSE": True, "TILE_N": 16, "HEADS_FIRST": True})
    (grid,) = grids
    num_tiles = max(grid)  # the scenario's 4 sequences of 1-50 query tokens: more than 4 tiles
    assert num_tiles > 4 and grid == ((2, num_tiles) if max_grid == 65535 else (num_tiles, 2))


def test_triton_runs_in_the_interpreter():
    """The CPU tests must exercise the real kernel, not silently skip it."""
    from triton.runtime.interpreter import InterpretedFunction

    from ops.triton_kernel import _dense_attention_kernel, _gather_kv_kernel, _rope_paged_attention_kernel

    for kernel in (_rope_paged_attention_kernel, _gather_kv_kernel, _dense_attention_kernel):
        assert isinstance(kernel, InterpretedFunction)


# ------------------------------------------------------------------------------------------------------
# the torch implementation: the full Cartesian grid at small shapes, larger shapes on a few axes
# ------------------------------------------------------------------------------------------------------


TORCH_GRID = [  # (block_size, dtype): every dtype at B=16, float32 at B=32
    (16, torch.float32),
    (16, torch.float16),
    (16, torch.bfloat16),
    (32, torch.float32),
]


@pytest.fixture(autouse=True)
def one_thread():
    """These problems are small: one intra-op thread is faster and steadier on shared CI cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("block_size,dtype", TORCH_GRID, ids=[f"B{b}-{DTYPE_IDS[d]}" for b, d in TORCH_GRID])
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, None), (128, 32), (256, 64)], ids=["d64", "d128r32", "d256r64"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_torch_matches_reference(scenario, block_size, head_dim, rotary_dim, heads, dtype):
    num_heads, num_kv_heads = HEADS[heads]
    problem = make_problem(
        SCENARIOS[scenario], num_heads, num_kv_heads, head_dim, block_size, dtype, rotary_dim,
        seed=block_size + head_dim, repeat_block=True, share_span=True,
    )  # fmt: skip
    check_against_ref(problem, "torch", f"torch {scenario} {heads} d{head_dim} B{block_size} {dtype}")


@pytest.mark.parametrize("position_free", [True, False], ids=["rope", "stored"])
@pytest.mark.parametrize("scenario", list(LARGE_SCENARIOS))
def test_torch_matches_reference_many_blocks(scenario, position_free):
    problem = make_problem(
        LARGE_SCENARIOS[scenario], 8, 2, 64, 16, torch.float32, position_free=position_free, seed=3,
        extra_blocks=50, repeat_block=True, share_span=True,
    )  # fmt: skip
    check_against_ref(problem, "torch", f"torch {scenario}")


@pytest.mark.parametrize("min_queries", [1, 10**9], ids=["every_group_by_runs", "no_group_by_runs"])
@pytest.mark.parametrize("position_free", [True, False], ids=["rope", "stored"])
@pytest.mark.parametrize("scenario", list(SCENARIOS) + list(LARGE_SCENARIOS))
def test_torch_by_runs_and_in_padded_groups_both_match_reference(scenario, position_free, min_queries, monkeypatch):
    """The two ways of the torch path, each forced on every group (decodes, holes, spans, finals, chunks after
    cached blocks): each matches the reference."""
    monkeypatch.setattr("ops.torch_impl.RUNS_MIN_QUERIES", min_queries)
    specs = {**SCENARIOS, **LARGE_SCENARIOS}[scenario]
    problem = make_problem(
        specs, 9, 3, 64, 16, position_free=position_free, seed=11, repeat_block=True, share_span=True
    )
    check_against_ref(problem, "torch", f"torch {scenario} min_queries={min_queries}")


def test_query_runs_cut_where_visible_start_changes():
    from ops.torch_impl import query_runs

    assert query_runs([0, 0, 0]) == [(0, 3)]
    assert query_runs([0, 0, 4, 4, 4, 9, 0, 0]) == [(0, 2), (2, 5), (5, 6), (6, 8)]
    assert query_runs([7]) == [(0, 1)]


def test_a_span_prompts_long_runs_read_only_their_own_windows(monkeypatch):
    """A prefill of a lead, two spans and a final: the runs path takes it (every sequence has 32 queries or more),
    the spans and the lead attend causally over their own keys (three is_causal calls), the final through a mask
    over the whole prompt, and the result is the reference's."""
    import torch.nn.functional as F

    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        "ops.torch_impl.F.scaled_dot_product_attention",
        lambda q, k, v, **kw: calls.append((k.shape[-2], kw.get("is_causal", False))) or sdpa(q, k, v, **kw),
    )
    problem = make_problem([SeqSpec(128, ((0, 128),), ((16, 64), (64, 112)))], 9, 3, 64, 16, seed=2)
    check_against_ref(problem, "torch", "a span prompt by runs")
    assert calls == [(16, True), (48, True), (48, True), (128, False)]


def test_auto_uses_torch_on_cpu():
    problem = make_problem(SCENARIOS["mixed"], 8, 2, 64, 16, seed=5)
    auto = rope_paged_attention(*problem.args())
    assert torch.equal(auto, rope_paged_attention(*problem.args(), impl="torch"))


# ------------------------------------------------------------------------------------------------------
# property: rotating keys at write time == rotating them in the op (position-free mode)
# ------------------------------------------------------------------------------------------------------


def rotate_at_write(problem: Problem) -> Problem:
    """The same problem with keys rotated at their logical position and stored unshared (one slot each)."""
    block_size = problem.k_cache.shape[1]
    num_seqs, max_blocks = problem.block_tables.shape
    k_rot = torch.zeros((num_seqs * max_blocks, *problem.k_cache.shape[1:]), dtype=problem.k_cache.dtype)
    v_new = torch.zeros_like(k_rot)
    for s in range(num_seqs):
        kv_len = int(problem.kv_lens[s])
        j = torch.arange(kv_len)
        src = problem.block_tables[s, j // block_size].long(), j % block_size
        dst = s * max_blocks + j // block_size, j % block_size
        k_rot[dst] = apply_rope(problem.k_cache[src], j, problem.cos_sin)
        v_new[dst] = problem.v_cache[src]
    tables = torch.arange(num_seqs * max_blocks, dtype=torch.int32).view(num_seqs, max_blocks)
    args = problem.args()
    return Problem(args[0], k_rot, v_new, tables, *args[4:8], None, args[9])


@st.composite
def problems(draw):
    num_seqs = draw(st.integers(1, 3))
    specs = []
    for _ in range(num_seqs):
        kv_len = draw(st.integers(1, 70))
        start = draw(st.integers(0, kv_len - 1))
        cut = draw(st.integers(start, kv_len - 1))  # queries [start, cut) + [hole_end, kv_len): a hole
        hole_end = draw(st.integers(cut, kv_len - 1))
        ranges = tuple(r for r in ((start, cut), (hole_end, kv_len)) if r[1] > r[0])
        seg_start = draw(st.integers(0, kv_len - 1))
        specs.append(SeqSpec(kv_len, ranges, ((seg_start, kv_len),) if draw(st.booleans()) else ()))
    num_heads, num_kv_heads = HEADS[draw(st.sampled_from(list(HEADS)))]
    rotary_dim = draw(st.sampled_from([None, 16, 32]))
    block_size = draw(st.sampled_from([16, 32]))
    return make_problem(
        specs, num_heads, num_kv_heads, 64, block_size, torch.float32, rotary_dim,
        seed=draw(st.integers(0, 1000)), repeat_block=draw(st.booleans()), share_span=draw(st.booleans()),
    )  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_rotate_at_write_equals_position_free(problem):
    rotated = rotate_at_write(problem)
    position_free = rope_paged_attention(*problem.args(), impl="torch")
    at_write = rope_paged_attention(*rotated.args(), impl="torch")
    assert_close(position_free, at_write, atol=1e-5, rtol=1e-5, what="torch: rotate at read vs at write")
    assert_close(rope_paged_attention_ref(*rotated.args()), at_write, atol=1e-5, rtol=1e-5, what="ref vs torch")


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_rotate_at_write_equals_position_free_triton(problem):
    rotated = rotate_at_write(problem)
    assert_close(run_impl(problem, "triton"), run_impl(rotated, "triton"), atol=1e-5, rtol=1e-5, what="triton")


# ------------------------------------------------------------------------------------------------------
# apply_rope against transformers' rotate_half formulation
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rotary_dim", [64, 32], ids=["full", "partial"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_apply_rope_matches_transformers(rotary_dim, dtype):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    head_dim, num_tokens = 64, 37
    cos_sin = rope_cos_sin(500, rotary_dim, base=10000.0)
    positions = torch.randint(0, 500, (num_tokens,))
    x = torch.randn(num_tokens, 3, head_dim).to(dtype)
    half = rotary_dim // 2
    cos = torch.cat([cos_sin[positions, :half]] * 2, dim=-1)[None]  # (1, T, r) as transformers builds it
    sin = torch.cat([cos_sin[positions, half:]] * 2, dim=-1)[None]
    x_hf = x.float().transpose(0, 1)[None]  # (1, heads, T, d)
    rotated, _ = apply_rotary_pos_emb(x_hf[..., :rotary_dim], x_hf[..., :rotary_dim], cos, sin)
    expected = torch.cat([rotated, x_hf[..., rotary_dim:]], dim=-1)[0].transpose(0, 1)  # (T, heads, d)
    actual = apply_rope(x, positions, cos_sin)
    assert actual.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert_close(actual, expected, atol=tol, rtol=tol, what=f"apply_rope r={rotary_dim} {dtype}")
    assert torch.equal(actual[..., rotary_dim:], x[..., rotary_dim:])


def test_rope_cos_sin_layout():
    cos_sin = rope_cos_sin(10, 8, base=100.0)
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    assert torch.allclose(cos_sin[7, :4].double(), torch.cos(7 * inv_freq))
    assert torch.allclose(cos_sin[7, 4:].double(), torch.sin(7 * inv_freq))


# ------------------------------------------------------------------------------------------------------
# launcher checks: each bad argument raises ValueError naming it
# ------------------------------------------------------------------------------------------------------


def _replace(args: dict, **changes) -> dict:
    return {**args, **changes}


def _bad_cu_start(a):
    return _replace(a, cu_seqlens_q=a["cu_seqlens_q"] + 1)


def _bad_block(a):
    tables = a["block_tables"].clone()
    tables[0, 0] = a["k_cache"].shape[0]
    return _replace(a, block_tables=tables)


def _with(name, fn):
    def change(a):
        t = a[name].clone()
        fn(t)
        return _replace(a, **{name: t})

    return change


BAD_ARGS = {
    "q_rank": ("q", lambda a: _replace(a, q=a["q"][0])),
    "q_dtype_int": ("q", lambda a: _replace(a, q=a["q"].int())),
    "q_noncontiguous": ("q", lambda a: _replace(a, q=a["q"].transpose(1, 2).contiguous().transpose(1, 2))),
    "k_dtype": ("k_cache", lambda a: _replace(a, k_cache=a["k_cache"].double())),
    "k_device": ("k_cache", lambda a: _replace(a, k_cache=a["k_cache"].to("meta"))),
    "v_shape": ("v_cache", lambda a: _replace(a, v_cache=a["v_cache"][:, :, :, :32])),
    "gqa_divisibility": ("k_cache", lambda a: _replace(a, q=a["q"][:, :3])),
    "block_tables_float": ("block_tables", lambda a: _replace(a, block_tables=a["block_tables"].float())),
    "block_id_out_of_range": ("block_tables", _bad_block),
    "block_id_negative": ("block_tables", _with("block_tables", lambda t: t.__setitem__((0, 0), -1))),
    "cu_not_from_zero": ("cu_seqlens_q", _bad_cu_start),
    "cu_not_monotone": ("cu_seqlens_q", _with("cu_seqlens_q", lambda t: t.__setitem__(1, t[2]))),
    "cu_length": ("cu_seqlens_q", lambda a: _replace(a, cu_seqlens_q=a["cu_seqlens_q"][:-1])),
    "kv_len_too_long": ("kv_lens", _with("kv_lens", lambda t: t.__setitem__(0, 10_000))),
    "kv_len_zero": ("kv_lens", _with("kv_lens", lambda t: t.__setitem__(0, 0))),
    "q_position_past_kv_len": ("q_positions", _with("q_positions", lambda t: t.__setitem__(0, 1000))),
    "q_positions_length": ("q_positions", lambda a: _replace(a, q_positions=a["q_positions"][:-1])),
    "visible_start_past_position": ("visible_start", _with("visible_start", lambda t: t.__setitem__(-1, 999))),
    "visible_start_negative": ("visible_start", _with("visible_start", lambda t: t.__setitem__(0, -1))),
    "visible_start_rank": ("visible_start", lambda a: _replace(a, visible_start=a["visible_start"][None])),
    "rotary_dim_odd": ("cos_sin", lambda a: _replace(a, cos_sin=a["cos_sin"][:, :7])),
    "rotary_dim_too_big": ("cos_sin", lambda a: _replace(a, cos_sin=torch.cat([a["cos_sin"]] * 3, dim=1))),
    "cos_sin_too_few_rows": ("cos_sin", lambda a: _replace(a, cos_sin=a["cos_sin"][:3])),
    "scale_negative": ("scale", lambda a: _replace(a, scale=-1.0)),
    "q_not_a_tensor": ("q", lambda a: _replace(a, q=a["q"].tolist())),
    "k_head_dim": ("k_cache", lambda a: _replace(a, k_cache=a["k_cache"][..., :32], v_cache=a["v_cache"][..., :32])),
    "no_sequence": ("block_tables", lambda a: _replace(a, block_tables=a["block_tables"][:0])),
    "no_query_token": (
        "q",
        lambda a: _replace(a, q=a["q"][:0], q_positions=a["q_positions"][:0], visible_start=a["visible_start"][:0]),
    ),
    "cos_sin_dtype": ("cos_sin", lambda a: _replace(a, cos_sin=a["cos_sin"].int())),
    "kv_lens_strided": ("kv_lens", lambda a: _replace(a, kv_lens=torch.stack([a["kv_lens"]] * 2, 1)[:, 0])),
    "cos_sin_strided": ("cos_sin", lambda a: _replace(a, cos_sin=torch.stack([a["cos_sin"]] * 2, 2)[..., 0])),
}


@pytest.fixture
def valid_args() -> dict:
    problem = make_problem(SCENARIOS["mixed"], 8, 2, 64, 16, seed=11)
    names = ["q", "k_cache", "v_cache", "block_tables", "cu_seqlens_q", "q_positions", "kv_lens"]
    names += ["visible_start", "cos_sin", "scale"]
    return dict(zip(names, problem.args(), strict=True))


@pytest.mark.parametrize("bad", list(BAD_ARGS))
def test_launcher_rejects(valid_args, bad):
    name, change = BAD_ARGS[bad]
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        rope_paged_attention(**change(valid_args))


@pytest.mark.parametrize("num_decode_seqs", [-1, 1, 5], ids=["negative", "not-a-decode", "past-the-batch"])
def test_launcher_rejects_a_wrong_decode_hint(valid_args, num_decode_seqs):
    with pytest.raises(ValueError, match="^num_decode_seqs"):  # NOTE: "mixed" starts with a 31-token sequence
        rope_paged_attention(**valid_args, num_decode_seqs=num_decode_seqs)


def test_launcher_rejects_unknown_impl(valid_args):
    with pytest.raises(ValueError, match="^impl"):
        rope_paged_attention(**valid_args, impl="cuda")


def test_check_false_reads_no_values(valid_args, monkeypatch):
    import ops.launcher

    def fail(*args, **kwargs):
        raise AssertionError("value checks ran with check=False")

    monkeypatch.setattr(ops.launcher, "_check_values", fail)
    monkeypatch.setattr(ops.launcher, "validate", fail)
    rope_paged_attention(**valid_args, check=False)
    with pytest.raises(AssertionError):
        rope_paged_attention(**valid_args, check=True)


def test_valid_args_pass(valid_args):
    out = rope_paged_attention(**valid_args, impl="ref")
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("elem_size", [2, 4], ids=["16-bit", "float32"])
def test_every_cuda_config_fits_in_shared_memory(monkeypatch, elem_size):
    """Q and the pipelined K/V tiles of every config pick_config makes on an H200 fit its budget, measured
    exceptions included (the short read's 64-key tiles at 3 stages, measured in bf16, once took float32 engines
    too: 295 KB, and the 8B-width engine failed at warm-up)."""
    from ops import triton_kernel as tk

    monkeypatch.setattr(tk, "_num_sms", lambda index: 132)
    monkeypatch.setattr(tk, "_has_tma", lambda index: True)
    cuda = torch.device("cuda", 0)
    for head_dim, group, seqs, tokens_per_seq, context, rotary, table in itertools.product(
        (64, 128, 256), (1, 4, 8), (1, 2, 64), (1, 5, 17, 32, 129, 2048), (576, 16384), (True, False), (2, 4)
    ):
        cfg = tk.pick_config(seqs * tokens_per_seq, seqs, 8, group, head_dim, context, rotary, cuda,
                             elem_size=elem_size, table_elem_size=table)  # fmt: skip
        tiles = cfg["BLOCK_M"] + 2 * cfg["num_stages"] * cfg["TILE_N"]
        assert elem_size * head_dim * tiles <= tk.SHARED_MEMORY_BUDGET, (head_dim, group, seqs, tokens_per_seq, cfg)


def test_pick_config_reads_a_short_prefill_over_a_long_context_like_a_decode(monkeypatch):
    """19 new tokens over 16k cached keys on an H200 (132 SMs, 8 kv heads, group 4): one 128-row query tile per
    sequence, keys rotated in the kernel, 16 splits of 64-key tiles. A 2,048-token chunk keeps the dense (gathered,
    TMA) path."""
    from ops import triton_kernel as tk

    monkeypatch.setattr(tk, "_num_sms", lambda index: 132)
    monkeypatch.setattr(tk, "_has_tma", lambda index: True)
    cuda = torch.device("cuda", 0)
    short = tk.pick_config(19, 1, 8, 4, 128, 16384, True, cuda, table_elem_size=2)
    assert (short["BLOCK_M"], short["NUM_SPLITS"], short["PRE_ROTATE"], short["DENSE"]) == (128, 16, False, False)
    # measured: 64-key tiles, 8 warps, 3 stages, the block ids read a tile ahead, one program per SM (head_dim 128)
    assert (short["TILE_N"], short["num_warps"], short["num_stages"], short["TABLE_AHEAD"]) == (64, 8, 3, True)
    assert short["SPLIT_IDS"]  # a split's block ids read once, before its loop (measured on an H100)
    assert short["MAX_REGS"] is None
    graphed = tk.pick_config(32, 2, 8, 4, 128, 16384, True, cuda, table_elem_size=2)  # the (2, 32) graph bucket
    assert graphed["NUM_SPLITS"] == short["NUM_SPLITS"]  # its padding sequence (one key) does not count
    three = tk.pick_config(60, 3, 8, 4, 128, 16384, True, cuda, table_elem_size=2)  # 2 prompts + the padding
    assert (three["BLOCK_M"], three["NUM_SPLITS"], three["DENSE"]) == (128, 8, False)  # 2 x 8 x 8 = 128 programs
    nine = tk.pick_config(9 * 17, 9, 8, 4, 128, 16384, True, cuda, table_elem_size=2)
    assert nine["NUM_SPLITS"] == 2  # 8 sequences x 8 kv heads x 2 splits: ~1 program per SM
    small_heads = tk.pick_config(19, 1, 8, 4, 64, 16384, True, cuda, table_elem_size=2)  # not measured: as before
    assert (small_heads["TILE_N"], small_heads["NUM_SPLITS"], small_heads["TABLE_AHEAD"]) == (64, 32, False)
    long = tk.pick_config(2048, 1, 8, 4, 128, 16384, True, cuda, table_elem_size=2)
    assert long["DENSE"] and long["NUM_SPLITS"] == 1
    # measured: every head's last query tiles first while a sequence's K and V take at most 8 MB (1k 1.26x, 2k 1.08x,
    # 4k 0.3% slower)
    assert not long["HEADS_FIRST"], "16k keys: 64 MB of K and V"
    prompt_1k = tk.pick_config(1024, 1, 8, 4, 128, 1024, True, cuda)
    assert prompt_1k["DENSE"] and prompt_1k["HEADS_FIRST"] and (prompt_1k["BLOCK_M"], prompt_1k["TILE_N"]) == (64, 64)
    assert tk.pick_config(4 * 2048, 4, 8, 4, 128, 2048, True, cuda)["HEADS_FIRST"]  # 8 MB a sequence
    assert not tk.pick_config(2048, 1, 8, 4, 128, 2064, True, cuda)["HEADS_FIRST"]
    assert not tk.pick_config(1024, 1, 8, 4, 64, 1024, True, cuda)["HEADS_FIRST"], "measured at head_dim 128 only"
    prompt_8k = tk.pick_config(8192, 1, 8, 4, 128, 8192, True, cuda)
    assert not prompt_8k["HEADS_FIRST"]  # a long prefill: its 256-row tiles as two halves sharing each key tile
    assert (prompt_8k["BLOCK_M"], prompt_8k["TILE_N"], prompt_8k["Q_SPLIT"], prompt_8k["WARP_SPECIALIZE"]) == (
        256,
        64,
        2,
        False,
    )  # measured on the H200: 8k-32k 7-8% faster than one 128x128 warp-specialized tile
    prompt_4k = tk.pick_config(4096, 1, 8, 4, 128, 4096, True, cuda)  # 16 MB of K and V: the halves, heads first
    assert (prompt_4k["BLOCK_M"], prompt_4k["Q_SPLIT"], prompt_4k["HEADS_FIRST"]) == (256, 2, True)
    prompt_6k = tk.pick_config(6144, 1, 8, 4, 128, 6144, True, cuda)  # not measured between 4k and 8k: as before
    assert (prompt_6k["BLOCK_M"], prompt_6k["Q_SPLIT"], prompt_6k["HEADS_FIRST"]) == (64, 1, False)
    # the launch order is a constexpr of the dense kernel: each order is a variant of its own for the warm-up
    assert tk.compile_key(prompt_1k) != tk.compile_key(tk.pick_config(1024, 1, 8, 4, 128, 4096, True, cuda))
    assert tk.compile_key(prompt_4k) != tk.compile_key(prompt_8k)
    decode = tk.pick_config(1, 1, 8, 4, 128, 16384, True, cuda, table_elem_size=2)
    assert (decode["BLOCK_M"], decode["NUM_SPLITS"], decode["DENSE"]) == (16, 64, False)
    decode_8k = tk.pick_config(1, 1, 8, 4, 128, 8192, True, cuda, table_elem_size=2)
    # measured: 64 splits of 128 keys beat 32 of 256 at 1 x 8k (which beat 16 of 512), in tables 8k wide or more
    assert decode_8k["NUM_SPLITS"] == 64
    assert tk.pick_config(1, 1, 8, 4, 128, 4096, True, cuda, table_elem_size=2)["NUM_SPLITS"] == 16  # as before
    assert tk.pick_config(2, 2, 8, 4, 128, 8192, True, cuda, table_elem_size=2)["NUM_SPLITS"] == 32  # 528 programs
    fp32_decode = tk.pick_config(1, 1, 8, 4, 128, 8192, True, cuda, elem_size=4, table_elem_size=4)
    assert fp32_decode["NUM_SPLITS"] == 32, "measured in bf16 only"
    # the merge compiles per width (32 splits or fewer share one): 64 splits are a variant of their own
    assert tk.compile_key(decode_8k) != tk.compile_key(tk.pick_config(2, 2, 8, 4, 128, 8192, True, cuda,
                                                                      table_elem_size=2))  # fmt: skip
    assert decode_8k["MAX_REGS"] is None, "decode keeps ptxas' register choice (capped at 128 it spills)"
    # measured: 32-key tiles with the block ids read ahead, 2 stages when split many ways and 3 otherwise (bf16 table)
    assert (decode_8k["TILE_N"], decode_8k["num_stages"], decode_8k["TABLE_AHEAD"]) == (32, 2, True)
    rag = tk.pick_config(32, 32, 8, 4, 128, 8192, True, cuda, table_elem_size=2)  # the RAG table's decode step
    assert (rag["NUM_SPLITS"], rag["TILE_N"], rag["num_stages"], rag["MAX_REGS"]) == (2, 32, 3, None)
    eight = tk.pick_config(8, 8, 8, 4, 128, 8192, True, cuda, table_elem_size=2)
    assert (eight["NUM_SPLITS"], eight["num_stages"]) == (8, 2)  # past DEEP_PIPELINE_MAX_SPLITS
    batch = tk.pick_config(64, 64, 8, 4, 128, 8192, True, cuda, table_elem_size=2)
    assert (batch["NUM_SPLITS"], batch["TILE_N"], batch["num_stages"], batch["TABLE_AHEAD"]) == (1, 32, 3, True)
    assert batch["MAX_REGS"] == 128  # 4 programs of 4 warps an SM (ptxas, sm_90a: 126 registers, no spill)
    fp32_table = tk.pick_config(64, 64, 8, 4, 128, 8192, True, cuda, table_elem_size=4)  # not measured: as before
    assert (fp32_table["TILE_N"], fp32_table["num_stages"], fp32_table["TABLE_AHEAD"]) == (32, 3, False)


def test_triton_merge_never_reads_the_output_of_a_split_with_no_keys(monkeypatch):
    """Splits past the end of a short key range write only their (max, sum): their partial output stays as
    allocated (here NaN), and the merge must not read it (0 x NaN is NaN)."""
    import ops.triton_kernel as triton_kernel

    problem = make_problem(SCENARIOS["decode_only"], 8, 2, 64, 16, seed=5)
    real_empty = torch.empty

    def nan_filled(*shape, **kwargs):
        t = real_empty(*shape, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    with monkeypatch.context() as patch:
        patch.setattr(triton_kernel.torch, "empty", nan_filled)
        actual = triton_kernel.rope_paged_attention_triton(*problem.args(), config={"NUM_SPLITS": 64, "TILE_N": 16})
    expected = rope_paged_attention_ref(*problem.args())
    assert_close(actual, expected, atol=1e-4, rtol=1e-4, what="64 splits over short key ranges")


def test_merge_config_cuts_dims_only_past_max_splits():
    """One warp a (token, head) up to MAX_SPLITS splits; past it one warp a 32-dim chunk, four warps where head_dim
    is no wider than a chunk."""
    from ops.triton_kernel import merge_config

    assert [merge_config(s, 128) for s in (2, 16, 32, 33, 64, 128)] == [(1, 0)] * 3 + [(1, 32)] * 3
    assert (merge_config(64, 64), merge_config(64, 32), merge_config(64, 16)) == ((1, 32), (4, 0), (4, 0))


def test_triton_merge_cut_over_dims_writes_every_dim_and_refuses_a_chunk_that_does_not_tile_them():
    """MERGE_D_CHUNK: each program merges one chunk of a (token, head)'s dims; together they write all of them (the
    output starts NaN), matching the reference; a chunk that is not a power of two dividing head_dim is refused."""
    problem = make_problem(SCENARIOS["decode_only"], 8, 2, 64, 16, seed=7)
    expected = rope_paged_attention_ref(*problem.args())
    for chunk in (32, 16):
        config = {"NUM_SPLITS": 8, "TILE_N": 16, "MERGE_D_CHUNK": chunk}
        actual = run_impl(problem, "triton", config=config)  # NOTE: into a NaN-filled output
        assert_close(actual, expected, atol=1e-4, rtol=1e-4, what=f"merge in chunks of {chunk} dims")
    for bad in (48, 24):
        with pytest.raises(ValueError, match="d_chunk must be a power of two dividing head_dim 64"):
            run_impl(problem, "triton", config={"NUM_SPLITS": 8, "TILE_N": 16, "MERGE_D_CHUNK": bad})


# (num_heads, num_kv_heads, head_dim, rotary, elem_size, table_elem_size): Llama-3-8B in bf16 as the engine runs it,
# a small fp32 model, keys as stored (the vanilla baseline)
VARIANT_MODELS = [(32, 8, 128, True, 2, 2), (9, 3, 64, True, 4, 4), (32, 8, 128, False, 2, 4)]


@pytest.mark.parametrize("model", VARIANT_MODELS, ids=["8b-bf16", "small-fp32", "8b-stored"])
def test_variant_shapes_cover_every_config_pick_config_chooses(monkeypatch, model):
    """On an H200-like device, every compiled variant that some step shape (up to 8,192 tokens over tables up to
    16,896 keys) would pick is among the shapes the engine warms up: none compiles in the middle of serving."""
    from ops import triton_kernel as tk

    monkeypatch.setattr(tk, "_num_sms", lambda index: 132)
    monkeypatch.setattr(tk, "_has_tma", lambda index: True)
    num_heads, num_kv_heads, head_dim, rotary, elem, table = model
    cuda, max_tokens, max_context = torch.device("cuda", 0), 8192, 16896
    warmed = {
        tk.compile_key(
            tk.pick_config(t, s, num_kv_heads, num_heads // num_kv_heads, head_dim, k, rotary, cuda, elem, table)
        )  # fmt: skip
        for t, s, k in tk.variant_shapes(
            num_heads, num_kv_heads, head_dim, rotary, cuda, elem, table, max_tokens, max_context
        )  # fmt: skip
    }
    seqs = [*range(1, 70), 96, 100, 128, 200, 256, 300, 512]
    per_seq = [*range(1, 161), 200, 500, 1000, 4096, 8191, 8192]
    widths = [16, 32, 64, 128, 256, 272, 512, 1024, 2048, 4096, 8176, 8192, 8208, 16384, max_context]
    picked = {
        tk.compile_key(
            tk.pick_config(s * p, s, num_kv_heads, num_heads // num_kv_heads, head_dim, k, rotary, cuda, elem, table)
        )  # fmt: skip
        for s in seqs
        for p in per_seq
        for k in widths
        if s * p <= max_tokens and p <= k
    }
    assert picked - warmed == set()
    assert len(warmed) == len(tk.variant_shapes(num_heads, num_kv_heads, head_dim, rotary, cuda, elem, table,
                                                max_tokens, max_context))  # one shape per variant  # fmt: skip


def test_warm_up_launches_each_variant_once(monkeypatch):
    """The warm-up's launches (interpreter): one per variant, each picking a variant no other launch picked."""
    from ops import triton_kernel as tk

    keys, launch = [], tk.rope_paged_attention_triton

    def spy(q, k_cache, v_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start, cos_sin, scale):
        keys.append(tk.compile_key(tk.config_for_args(q, k_cache, block_tables, cos_sin)))
        assert q_positions.dtype == torch.int64 and cu_seqlens_q.dtype == kv_lens.dtype == torch.int32
        out = launch(q, k_cache, v_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start, cos_sin,
                     scale)  # fmt: skip
        assert torch.isfinite(out).all()
        return out

    monkeypatch.setattr(tk, "rope_paged_attention_triton", spy)
    cos_sin = rope_cos_sin(256, 16)
    count = tk.warm_up(4, 2, 16, 16, torch.float32, cos_sin, torch.device("cpu"), 64, 256)
    assert count == len(keys) >= 1 and len(set(keys)) == len(keys)


def test_warm_up_reads_the_engines_caches_where_they_hold_enough_blocks(monkeypatch):
    """Given a layer's K and V (`caches`), the warm-up launches on them, so its variants compile with the offsets'
    width that serving takes (INT32_OFFSETS); a launch needing more blocks than they hold reads zeros of its own."""
    from ops import triton_kernel as tk

    read, launch = [], tk.rope_paged_attention_triton
    monkeypatch.setattr(tk, "rope_paged_attention_triton", lambda *args: read.append(args[1:3]) or launch(*args))
    cos_sin = rope_cos_sin(256, 16)
    k, v = torch.randn(2, 2, 16, 2, 16).unbind(0)  # 2 blocks of 16: shapes of up to 32 tokens a sequence fit
    count = tk.warm_up(4, 2, 16, 16, torch.float32, cos_sin, torch.device("cpu"), 64, 256, caches=(k, v))
    fits = [n // s <= 32 for n, s, _ in tk.variant_shapes(4, 2, 16, True, torch.device("cpu"), 4, 4, 64, 256)]
    assert count == len(read) == len(fits) and any(fits) and not all(fits)
    assert [kc is k and vc is v for kc, vc in read] == fits
    assert all(not kc.any() for (kc, _), fit in zip(read, fits, strict=True) if not fit)


def test_warm_up_runs_the_variants_an_h200_picks(monkeypatch):
    """The warm-up with the configs pick_config chooses on an H200 (split decode and short reads, the dense path),
    run here by the interpreter: every launch finishes with finite outputs."""
    from ops import triton_kernel as tk

    real_pick, cuda, outputs = tk.pick_config, torch.device("cuda", 0), []
    monkeypatch.setattr(tk, "_num_sms", lambda index: 132)
    monkeypatch.setattr(tk, "_has_tma", lambda index: True)
    monkeypatch.setattr(tk, "pick_config", lambda *args, **kw: real_pick(*args[:7], cuda, *args[8:], **kw))
    launch = tk.rope_paged_attention_triton
    monkeypatch.setattr(tk, "rope_paged_attention_triton", lambda *args: outputs.append(launch(*args)) or outputs[-1])
    cos_sin = rope_cos_sin(1024, 64).to(torch.bfloat16)
    count = tk.warm_up(8, 2, 64, 16, torch.bfloat16, cos_sin, torch.device("cpu"), 512, 1024)
    shapes = tk.variant_shapes(8, 2, 64, True, cuda, 2, 2, 512, 1024)
    assert count == len(outputs) == len(shapes) >= 4  # decode and short, each split or not; dense
    assert any(tk.pick_config(t, s, 2, 4, 64, k, True, cuda, 2, 2)["DENSE"] for t, s, k in shapes)
    assert all(torch.isfinite(out).all() for out in outputs)
