"""Edges of the model runner (model_runner.py) that the engine tests leave open, on a tiny random Llama (no
tokenizer): the CPU cache is sized to exactly what a run asks of it, with its scratch block beside it; a cache or a
host tier too small for one block is refused; the host tier may take 90% of the host's available memory and no
more; and copy-rerotate's batches are cut only where a copy reads what its own batch writes."""

import io

import pytest

import minipic_lite as mp
from minipic_lite import model_runner
from minipic_lite.config import GIB, cdiv
from minipic_lite.kv_cache_manager import Rerotate
from minipic_lite.model_runner import cpu_available_bytes, independent_batches
from tests.conftest import save_tiny_llama

# A block of the tiny Llama: K and V x 2 layers x 16 tokens x 2 kv heads x 8 dims x 4 bytes (float32).
BLOCK_BYTES = 2 * 2 * 16 * 2 * 8 * 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_runner"))


def runner_of(tiny_dir, max_model_len=128, **options):
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=max_model_len, **options)
    runner = llm.engine.runner
    llm.close()
    return runner


def test_the_cpu_cache_holds_one_full_request_plus_one_steps_budget_and_a_scratch_block(tiny_dir):
    runner = runner_of(tiny_dir, max_num_batched_tokens=64)
    assert runner.block_bytes == BLOCK_BYTES
    assert runner.num_blocks == cdiv(128 + 64, 16) == 12  # the one extra block asked for is the scratch block
    assert runner.kv_cache.shape[2] == 13 and runner.scratch_block == 12


def test_where_the_hosts_memory_binds_the_cpu_cache_takes_memory_utilization_of_it(tiny_dir, monkeypatch):
    """A host with 4 blocks' worth of available memory at memory_utilization=0.5: a budget of 2 blocks, one of them
    the scratch block (the run alone would ask for many more: a context of one block, 2,048 tokens a step)."""
    monkeypatch.setattr("minipic_lite.model_runner.cpu_available_bytes", lambda: 4 * BLOCK_BYTES)
    assert runner_of(tiny_dir, 16, memory_utilization=0.5).num_blocks == 1


def test_a_cpu_cache_cap_of_one_block_leaves_none_and_is_refused(tiny_dir):
    """A context of one block, so that the engine takes a cache of one."""
    assert runner_of(tiny_dir, 16, cpu_kv_cache_gib=2 * BLOCK_BYTES / GIB).num_blocks == 1  # and the scratch block
    with pytest.raises(ValueError, match="no memory is left for the KV cache on cpu"):
        runner_of(tiny_dir, 16, cpu_kv_cache_gib=BLOCK_BYTES / GIB)


def test_a_host_tier_holds_whole_blocks_and_one_at_least(tiny_dir):
    assert runner_of(tiny_dir, num_blocks=8, host_cache_gib=(2 * BLOCK_BYTES - 1) / GIB).num_host_blocks == 1
    with pytest.raises(ValueError, match=r"does not fit: it must hold at least one block \(4096 bytes\)"):
        runner_of(tiny_dir, num_blocks=8, host_cache_gib=(BLOCK_BYTES - 1) / GIB)


def test_a_host_tier_takes_at_most_90_percent_of_the_available_memory(tiny_dir, monkeypatch):
    monkeypatch.setattr("minipic_lite.model_runner.cpu_available_bytes", lambda: 1000 * BLOCK_BYTES)
    assert runner_of(tiny_dir, num_blocks=8, host_cache_gib=899 * BLOCK_BYTES / GIB).num_host_blocks == 899
    assert runner_of(tiny_dir, num_blocks=8, host_cache_gib=900 * BLOCK_BYTES / GIB).num_host_blocks == 900  # 90%
    with pytest.raises(ValueError, match="at most 90% of the host's available memory"):
        runner_of(tiny_dir, num_blocks=8, host_cache_gib=901 * BLOCK_BYTES / GIB)


def test_rerotate_batches_forget_what_an_earlier_batch_wrote():
    """A batch is cut where a copy reads a block its own batch writes: a block written by an earlier batch is
    already there, so reading it cuts nothing."""
    copies = [Rerotate(1, 6, 4), Rerotate(2, 7, 4), Rerotate(6, 8, 4), Rerotate(7, 9, 4)]
    assert independent_batches(copies) == [copies[:2], copies[2:]]


@pytest.mark.parametrize(
    ("meminfo", "expected"),
    [("MemTotal:       8000 kB\nMemFree:  100 kB\nMemAvailable:   3000 kB\n", 3000 * 1024),
     ("MemTotal:       8000 kB\nMemFree:  100 kB\n", 8000 * 1024)],
    ids=["available", "no_available_line"],
)  # fmt: skip
def test_the_available_memory_is_read_from_meminfo_in_bytes(meminfo, expected, monkeypatch):
    """/proc/meminfo counts in kB (1024 bytes): the host's available memory is its MemAvailable in bytes, or its
    MemTotal where the kernel names no MemAvailable."""
    monkeypatch.setattr(model_runner, "open", lambda path: io.StringIO(meminfo), raising=False)
    assert cpu_available_bytes() == expected


@pytest.mark.parametrize("mirror", [True, False])
def test_the_cpu_decode_mirror_is_built_only_when_asked(tiny_dir, mirror):
    """`cpu_decode_mirror=False` leaves the CPU engine without a decode mirror (its decode reads the paged cache)."""
    assert (runner_of(tiny_dir, cpu_decode_mirror=mirror).decode_mirror is not None) is mirror
