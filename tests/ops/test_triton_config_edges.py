"""Edges of the Triton op's host-side config rules (ops/triton_kernel.py) that test_rope_paged_attention leaves open,
no kernel launched: the path thresholds of `pick_config`'s docstring at their ends (decode-like up to 16 query rows a
sequence, short prefills up to SHORT_PREFILL_ROWS, the dense path past it), rows per sequence rounded up, the next
power of two of a power of two being itself, an unsplit read's block ids read tile by tile even where they would fit
a split, a mixed step's leading decodes read apart exactly where the whole batch would take the prefill-like path
(a single leading decode included), and every config one Triton can compile, its tiles within shared memory."""

import pytest
import torch

from ops import triton_kernel as tk


@pytest.fixture
def h200(monkeypatch):
    """pick_config on CUDA as an H200 sees it (132 SMs, TMA), without a GPU."""
    monkeypatch.setattr(tk, "_num_sms", lambda index: 132)
    monkeypatch.setattr(tk, "_has_tma", lambda index: True)
    return torch.device("cuda", 0)


def path_of(cfg: dict) -> str:
    """The docstring's paths: decode-like 16-row tiles of 4 warps; a short prefill's one 128-row tile a sequence, 8
    warps, keys rotated in the kernel; the dense path (which pre-rotates into its gathered scratch)."""
    tiles = (cfg["BLOCK_M"], cfg["num_warps"], cfg["PRE_ROTATE"])
    if cfg["DENSE"]:
        return "dense"
    return {(16, 4, False): "decode", (128, 8, False): "short"}.get(tiles, f"other {tiles}")


@pytest.mark.parametrize(
    ("rows", "expected"),
    [(16, "decode"), (17, "short"), (tk.SHORT_PREFILL_ROWS, "short"), (tk.SHORT_PREFILL_ROWS + 1, "dense")],
)
def test_the_paths_change_just_past_16_and_short_prefill_rows(h200, rows, expected):
    """One sequence, GQA group 1 (rows = tokens), bf16, over 4k keys."""
    cfg = tk.pick_config(rows, 1, 8, 1, 128, 4096, True, h200, table_elem_size=2)
    assert path_of(cfg) == expected, cfg
    assert cfg["TABLE_AHEAD"] == (expected != "dense")  # measured at head_dim 128 in 16 bits: decode and short reads


def test_a_tile_holds_a_whole_gqa_group(h200):
    """256 query heads a kv head: one decode token's rows are more than any tile shape's 128."""
    cfg = tk.pick_config(1, 1, 1, 256, 128, 4096, True, h200, table_elem_size=2)
    assert cfg["BLOCK_M"] == 256 and cfg["DENSE"] and not cfg["ONE_TOKEN_SEQS"]  # the dense kernel has no such mode


@pytest.mark.parametrize(("num_seqs", "splits", "stages"), [(10, 4, 3), (5, 8, 2)])
def test_a_bf16_decode_keeps_three_stages_up_to_deep_pipeline_max_splits(h200, num_seqs, splits, stages):
    """528 programs (4 an SM) over num_seqs x 8 kv heads: 6 splits a tile fit, 4 taken; or 13, 8 taken."""
    cfg = tk.pick_config(num_seqs, num_seqs, 8, 4, 128, 4096, True, h200, table_elem_size=2)
    assert (cfg["NUM_SPLITS"], cfg["num_stages"]) == (splits, stages)


def test_rows_per_sequence_round_up():
    assert tk.rows_per_sequence(17, 2, 4) == 36  # 8.5 tokens a sequence -> 9, times the group
    assert tk.rows_per_sequence(16, 2, 4) == 32


def test_the_next_power_of_two_of_a_power_of_two_is_itself():
    assert [tk._next_pow2(x) for x in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]


def test_each_split_keeps_at_least_min_keys():
    """768 keys hold 3 splits of 256: the power of two at most that is 2."""
    assert tk.splits_to_fill(1000, 1, 768) == 2 and tk.splits_to_fill(1000, 1, 1024) == 4


def test_config_for_args_is_pick_configs_choice_for_the_launchs_shapes(h200):
    """A bf16 decode of one token with 32 query heads over 8 kv heads, tables of 512 blocks of 16 (8,192 keys) and a
    bf16 cos/sin table: stand-ins that carry the shapes, device and element sizes a CUDA launch has."""
    from types import SimpleNamespace

    q = SimpleNamespace(shape=(1, 32, 128), device=h200, element_size=lambda: 2)
    k_cache = SimpleNamespace(shape=(600, 16, 8, 128))
    block_tables = SimpleNamespace(shape=(1, 512))
    cos_sin = SimpleNamespace(element_size=lambda: 2)
    expected = tk.pick_config(1, 1, 8, 4, 128, 8192, True, h200, elem_size=2, table_elem_size=2)
    assert tk.config_for_args(q, k_cache, block_tables, cos_sin) == expected
    assert expected["NUM_SPLITS"] == tk.LONG_DECODE_SPLITS and expected["TABLE_AHEAD"]  # a long bf16 decode


def test_an_element_two_to_the_31_from_the_first_does_not_fit_int32():
    assert tk.offsets_fit_int32(torch.empty(2**31, device="meta"))  # the last element 2^31 - 1 from the first
    assert not tk.offsets_fit_int32(torch.empty(2**31 + 1, device="meta"))


def test_split_ids_hold_max_split_keys_of_block_ids_where_a_split_fits_them():
    """SPLIT_IDS: MAX_SPLIT_KEYS // block_size entries (one value per block size, whatever the tables' width), where
    every split's keys fit in MAX_SPLIT_KEYS; 0 (ids read tile by tile) when off, unsplit, past it, or with tiles
    that do not start on a block."""
    on, max_keys = {"SPLIT_IDS": True, "TILE_N": 64}, tk.MAX_SPLIT_KEYS
    assert tk.split_table_entries(on, 16, 1024, 16) == max_keys // 16  # the short read over 16k keys
    assert tk.split_table_entries(on, 16, 536, 32) == max_keys // 32  # 17,152 keys: 17 tiles, 1,088 keys a split
    assert tk.keys_per_split(16 * max_keys, 64, 16) == max_keys  # 32k keys fit 16 splits exactly ...
    assert tk.split_table_entries(on, 16, 16 * max_keys // 16, 16) == max_keys // 16
    assert tk.split_table_entries(on, 16, 16 * max_keys // 16 + 1, 16) == 0  # ... one block more does not
    assert tk.split_table_entries({**on, "SPLIT_IDS": False}, 16, 1024, 16) == 0
    assert tk.split_table_entries(on, 1, 1024, 16) == 0
    assert tk.split_table_entries({**on, "TILE_N": 16}, 16, 512, 32) == 0  # a 16-key tile inside a 32-key block
    assert tk.keys_per_split(1000, 64, 3) == 384  # 16 tiles in 3 splits: 6 tiles a split


def test_the_short_read_takes_split_ids_while_its_splits_fit_them(h200):
    """pick_config's short read (17 tokens, 8 kv heads of 4, d128, 16 splits) holds a split's block ids up to
    MAX_SPLIT_KEYS a split; past it, and for decode, they are read tile by tile."""

    def short_read(keys):
        return tk.pick_config(17, 1, 8, 4, 128, keys, True, h200, elem_size=2, table_elem_size=2)

    assert short_read(16 * tk.MAX_SPLIT_KEYS)["SPLIT_IDS"] and not short_read(16 * tk.MAX_SPLIT_KEYS + 64)["SPLIT_IDS"]
    assert not tk.pick_config(1, 1, 8, 4, 128, 8192, True, h200, elem_size=2, table_elem_size=2)["SPLIT_IDS"]


@pytest.mark.parametrize("rows", [tk.SHORT_PREFILL_ROWS, tk.SHORT_PREFILL_ROWS + 1])
def test_leading_decodes_are_read_apart_exactly_where_the_batch_would_take_the_prefill_path(h200, rows):
    """Two decodes then a chunk, GQA group 1: `rows` query rows a sequence on average (the chunk: 3 x rows - 2)."""
    num_tokens, num_seqs = 3 * rows, 3
    whole = tk.pick_config(num_tokens, num_seqs, 8, 1, 128, 4096, True, h200, table_elem_size=2)
    assert tk.is_split_worth_it(num_tokens, num_seqs, 1, 2) == whole["DENSE"]


def test_a_single_leading_decode_before_a_long_chunk_is_read_apart():
    assert tk.is_split_worth_it(1 + 4 * tk.SHORT_PREFILL_ROWS, 2, 1, 1)


def test_an_unsplit_read_takes_no_split_ids_even_where_its_keys_would_fit_them():
    on = {"SPLIT_IDS": True, "TILE_N": 64}
    assert tk.split_table_entries(on, 2, 8, 16) == tk.MAX_SPLIT_KEYS // 16  # 128 keys, two splits: they fit
    assert tk.split_table_entries(on, 1, 8, 16) == 0  # the same keys unsplit: ids tile by tile


def test_configs_whose_launches_compile_different_kernels_have_different_compile_keys(h200):
    """An unsplit read and a split one (the split compiles SPLIT_KV and a merge), one token a sequence or not (a
    constexpr of the read): a decode's config and its variants, each its own key."""
    cfg = tk.pick_config(1, 1, 8, 4, 128, 4096, True, h200, table_elem_size=2)
    assert not cfg["DENSE"] and cfg["ONE_TOKEN_SEQS"]
    variants = [{**cfg, "NUM_SPLITS": 1}, {**cfg, "NUM_SPLITS": 2}, {**cfg, "NUM_SPLITS": 1, "ONE_TOKEN_SEQS": False}]
    assert len({tk.compile_key(v) for v in variants}) == len(variants)


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@pytest.mark.parametrize("on_cuda", [False, True])
def test_every_config_is_one_triton_can_compile_and_the_tiles_fit_in_shared_memory(h200, on_cuda):
    """Over decode, short and long batches, head dims 16-256, GQA groups 1-8, both dtypes' sizes and both modes:
    power-of-two tiles of at least 16 (tl.dot's smallest side), a warp count of a power of two up to 8, a stage at
    least, a token's query heads in one tile, a decode's or short prefill's sequence in one tile (up to head_dim 128),
    and Q with the pipelined K and V tiles within the shared-memory budget."""
    device = h200 if on_cuda else torch.device("cpu")
    for rows in (1, 4, 16, 17, 64, 65, tk.SHORT_PREFILL_ROWS, tk.SHORT_PREFILL_ROWS + 1, 1024, 8192):
        for head_dim in (16, 64, 128, 256):
            for group in (1, 4, 8):
                for elem_size in (2, 4):
                    for is_rotary in (False, True):
                        num_seqs = 2
                        cfg = tk.pick_config(rows * num_seqs // group or num_seqs, num_seqs, 8, group, head_dim,
                                             16384, is_rotary, device, elem_size=elem_size)  # fmt: skip
                        block_m, tile_n = cfg["BLOCK_M"] // cfg["Q_SPLIT"], cfg["TILE_N"]
                        assert is_pow2(block_m) and block_m >= 16 and is_pow2(tile_n) and tile_n >= 16, cfg
                        assert cfg["num_warps"] in (1, 2, 4, 8) and cfg["num_stages"] >= 1, cfg
                        assert cfg["BLOCK_M"] >= group, cfg
                        per_seq = tk.rows_per_sequence(rows * num_seqs // group or num_seqs, num_seqs, group)
                        if on_cuda and per_seq <= tk.SHORT_PREFILL_ROWS and head_dim <= 128:  # (256: 64-row tiles)
                            assert cfg["BLOCK_M"] >= per_seq, cfg
                        tiles = elem_size * head_dim * (cfg["BLOCK_M"] + 2 * cfg["num_stages"] * tile_n)
                        assert tiles <= tk.SHARED_MEMORY_BUDGET, cfg
