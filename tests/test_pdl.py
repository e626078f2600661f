"""Programmatic dependent launch (MINIPIC_PDL): the op's two kernels compiled for Hopper (sm_90a) here, no GPU.

A kernel launched with PDL may start while the kernel before it in the stream is still running, so it must wait
(`griddepcontrol.wait`) before it touches any memory: the step's metadata itself may come from that kernel. And it
may let the next kernel start early only after its wait, so that whatever starts early finds every kernel before
this one finished. Both orders are read in the PTX; the GPU tests run the engine with PDL on (`MINIPIC_PDL=all`).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# NOTE: compiled in a fresh process: under the test suite's TRITON_INTERPRET=1 the kernels are interpreted functions
PROBE = """
import json, sys
sys.path[:0] = [{root!r}, {bench!r}]
import ptxas_stats
out = {{}}
for use_pdl in (False, True):
    read = ptxas_stats.compile_read(16, 32, 4, 2, None, TABLE_AHEAD=True, USE_PDL=use_pdl)
    merge = ptxas_stats.compile_merge(use_pdl)
    out[str(use_pdl)] = {{"read": read.asm["ptx"], "merge": merge.asm["ptx"]}}
print(json.dumps(out))
"""
MEMORY_OP = re.compile(r"\b(ld|st|atom|red|cp\.async)\.global")


@pytest.fixture(scope="module")
def ptx():
    env = dict(os.environ, TRITON_INTERPRET="0")
    code = PROBE.format(root=str(ROOT), bench=str(ROOT / "bench"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def body(ptx_text: str) -> str:
    return ptx_text[ptx_text.index(".entry") :]


@pytest.mark.parametrize("kernel", ["read", "merge"])
def test_pdl_waits_before_any_memory_access_and_releases_after(ptx, kernel):
    code = body(ptx["True"][kernel])
    wait, release = code.find("griddepcontrol.wait"), code.find("griddepcontrol.launch_dependents")
    first_access = MEMORY_OP.search(code)
    assert wait != -1 and release != -1, "the PDL build has no grid dependency control"
    assert first_access is not None and wait < first_access.start(), (
        f"{kernel}: {first_access.group(0)} before griddepcontrol.wait"
    )
    assert wait < release, f"{kernel}: the next kernel is released before this one waited"


@pytest.mark.parametrize("kernel", ["read", "merge"])
def test_without_pdl_the_kernels_have_no_grid_dependency_control(ptx, kernel):
    assert "griddepcontrol" not in ptx["False"][kernel]


def test_pdl_launch_options_only_on_a_cuda_device():
    from ops import triton_kernel

    assert triton_kernel._pdl_options(torch.device("cpu")) == {}
