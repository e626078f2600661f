"""Programmatic dependent launch (PDL) of the split read, its merge and the skinny matmul: when it is on, and that each
kernel waits for the kernel before it before reading anything (the sm_90a PTX, compiled here without a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from minipic_lite.models import llama
from ops import triton_kernel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def capabilities(monkeypatch):
    """Device 0 a Hopper, device 1 an Ampere; `_pdl_device`'s memo cleared before and after."""
    caps = {0: (9, 0), 1: (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: caps[index])
    triton_kernel._pdl_device.cache_clear()
    yield
    triton_kernel._pdl_device.cache_clear()


def fake_cuda_tensor(index: int):
    return SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=index))


def test_pdl_is_on_for_hopper_tensors_unless_minipic_pdl_is_0(capabilities, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("MINIPIC_PDL", raising=False)
    assert triton_kernel.use_pdl(fake_cuda_tensor(0))
    assert not triton_kernel.use_pdl(fake_cuda_tensor(1))  # before Hopper: no PDL
    assert not triton_kernel.use_pdl(torch.zeros(2))  # a CPU tensor
    triton_kernel._pdl_device.cache_clear()
    monkeypatch.setenv("MINIPIC_PDL", "0")
    assert not triton_kernel.use_pdl(fake_cuda_tensor(0))


def test_pdl_is_off_with_a_triton_that_lacks_gdc_wait(capabilities, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("MINIPIC_PDL", raising=False)
    monkeypatch.delattr(triton_kernel.tl.extra.cuda, "gdc_wait")
    assert not triton_kernel.use_pdl(fake_cuda_tensor(0))


def test_pdl_is_off_under_the_interpreter(capabilities, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_kernel.use_pdl(fake_cuda_tensor(0))


def test_inductors_kernels_take_pdl_unless_minipic_pdl_is_0(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw["options"]) or fn)
    monkeypatch.delenv("MINIPIC_PDL", raising=False)
    llama.compile_kernel(llama.rms_norm, options={"combo_kernels": True})
    monkeypatch.setenv("MINIPIC_PDL", "0")
    llama.compile_kernel(llama.rms_norm, options={"combo_kernels": True})
    llama.compile_kernel(llama.rms_norm)
    assert seen == [{"triton.enable_pdl": True, "combo_kernels": True}, {"combo_kernels": True}, None]


COMPILE = """
import json, sys
sys.path.insert(0, "bench")
import triton
from triton.compiler import ASTSource
from ptxas_stats import HOPPER, compile_read
from ops import skinny_matmul, triton_kernel

decode = dict(BLOCK_Q=1, TABLE_AHEAD=True, ONE_TOKEN_SEQS=True, BLOCK_SIZE=16, INT32_OFFSETS=True)
ptx = {}
for pdl in (False, True):
    ptx[f"read_{pdl}"] = compile_read(16, 32, 4, 2, None, PDL=pdl, **decode).asm["ptx"]
    merge = triton_kernel._reduce_splits_kernel
    names = merge.arg_names
    kinds = {"out_ptr": "*bf16", "partial_out_ptr": "*fp32", "partial_m_ptr": "*fp32", "partial_l_ptr": "*fp32"}
    constexprs = {"HEAD_DIM": 128, "MAX_SPLITS": 64, "PDL": pdl, "D_CHUNK": triton_kernel.LONG_MERGE_D_CHUNK}
    signature = {n: kinds.get(n, "constexpr" if n in constexprs else "i32") for n in names}
    source = ASTSource(fn=merge, signature=signature, constexprs={(names.index(n),): v for n, v in constexprs.items()})
    ptx[f"merge_{pdl}"] = triton.compile(source, target=HOPPER, options={"num_warps": 1}).asm["ptx"]
    skinny = skinny_matmul._skinny_matmul_kernel  # a split matmul: its counts and partials come after the wait too
    names = skinny.arg_names
    constexprs = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "SPLITS": 2, "NUM_STAGES": 4, "PDL": pdl}
    kinds = {"x_desc": "tensordesc<bf16[32,128]>", "w_desc": "tensordesc<bf16[64,128]>", "out_ptr": "*bf16",
             "part_ptr": "*fp32", "count_ptr": "*i32"}
    signature = {n: kinds.get(n, "constexpr" if n in constexprs else "i32") for n in names}
    source = ASTSource(fn=skinny, signature=signature, constexprs={(names.index(n),): v for n, v in constexprs.items()})
    ptx[f"skinny_{pdl}"] = triton.compile(source, target=HOPPER, options={"num_warps": 4}).asm["ptx"]
print(json.dumps(ptx))
"""


def test_each_pdl_kernel_waits_before_its_first_load():
    """With PDL a kernel may start while the one before it still runs: `griddepcontrol.wait` must come before every
    load of the kernel's data (its parameters excepted), and without PDL there is none."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", COMPILE], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    ptx = json.loads(run.stdout.splitlines()[-1])
    for kernel in ("read", "merge", "skinny"):
        plain, pdl = ptx[f"{kernel}_False"], ptx[f"{kernel}_True"]
        assert "griddepcontrol" not in plain
        wait = pdl.index("griddepcontrol.wait")
        loads = [i for op in ("ld.global", "cp.async", "ld.shared", "atom.") if (i := pdl.find(op)) >= 0]
        assert loads and wait < min(loads), kernel
        assert pdl.count("griddepcontrol.wait") == 1
