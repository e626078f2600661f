"""The CPU's decode matmul in C: a few rows times a weight matrix, at the memory's read rate.

A decode step multiplies one row per sequence by every weight matrix of the model: it reads every weight once and
does two flops with it, so it should run at the rate the machine reads memory. oneDNN does not at one row: on 2 cores
of an AMD EPYC (AVX512-BF16), SmolLM2's 120 layer projections one after another in bfloat16 took 11.1-11.5 ms
(19 GB/s) where only reading the same matrices in the same order took 7.0 (30 GB/s); the loop below took 7.2-8.0 ms
(27-30 GB/s), and in float32 9.7 ms (44 GB/s) against oneDNN's 19.4 (README, "The CPU's decode matmul").

The loop is the textbook one: for each weight row, one dot product per input row, the compiler vectorizing the sum
(`omp simd`), the weight rows shared among torch's OpenMP threads. Sums in float32; a bf16 output is rounded to
nearest even, as torch rounds. The C compiler builds it once per machine (`cc -O3 -march=native -fopenmp`) into the
cache (MINIPIC_CACHE_DIR/native, keyed by the source, the compiler and the CPU), and ctypes loads it.

`load()` is None where that cannot work: not Linux, no C compiler, a failed build, an OpenMP runtime in torch other
than GNU's (ours would start a second thread pool beside torch's), or `MINIPIC_NATIVE_GEMV=0`. Decode steps then keep
oneDNN (packed_linear.py), whose start-up probe also decides, per row count, whether this loop is faster at all.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from minipic_lite.models.loader import cache_root

logger = logging.getLogger(__name__)

SOURCE = r"""
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

static inline uint16_t f32_to_bf16(float f) {  /* round to nearest even, as torch does; a NaN stays a NaN */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f32_to_f32(float f) { return f; }

/* y[m, n] = x[m, k] @ w[n, k]^T, all of type T: read through LOAD, written through STORE, summed in float32 */
#define GEMV(NAME, T, LOAD, STORE)                                                                          \
    void NAME(const T* x, const T* w, T* y, int64_t m, int64_t n, int64_t k, int threads) {                 \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                  \
        for (int64_t r = 0; r < n; ++r) {                                                                  \
            const T* row = w + r * k;                                                                      \
            for (int64_t i = 0; i < m; ++i) {                                                              \
                const T* xi = x + i * k;                                                                   \
                float acc = 0.0f;                                                                          \
                _Pragma("omp simd reduction(+:acc)")                                                       \
                for (int64_t j = 0; j < k; ++j) acc += LOAD(row[j]) * LOAD(xi[j]);                         \
                y[i * n + r] = STORE(acc);                                                                 \
            }                                                                                              \
        }                                                                                                  \
    }

GEMV(gemv_bf16, uint16_t, bf16_to_f32, f32_to_bf16)
GEMV(gemv_f32, float, f32_to_f32, f32_to_f32)
"""
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
DTYPES = (torch.float32, torch.bfloat16)
ENV_SWITCH = "MINIPIC_NATIVE_GEMV"  # "0": never load it


def supports(weight: torch.Tensor) -> bool:
    """Whether the loop can multiply by `weight`: a contiguous float32 or bfloat16 matrix on the CPU."""
    return weight.device.type == "cpu" and weight.dtype in DTYPES and weight.dim() == 2 and weight.is_contiguous()


def native_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) through the C loop: x [..., in] in weight's dtype, weight [out, in] (`supports`).
    Call only where `load()` is not None."""
    # NOTE: ~7 us of Python and torch around a call that takes ~2 (ctypes) for a small matrix, 121 calls a step:
    # the engine's 2-D input skips the reshapes, and the loop reads x in its own dtype (no cast)
    lib = load()
    rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    rows = rows.to(weight.dtype).contiguous()  # (m, in): no copy when it already is
    (m, k), n = rows.shape, weight.shape[0]
    out = torch.empty(m, n, dtype=weight.dtype)
    fn = lib.gemv_bf16 if weight.dtype == torch.bfloat16 else lib.gemv_f32
    fn(rows.data_ptr(), weight.data_ptr(), out.data_ptr(), m, n, k, torch.get_num_threads())
    if bias is not None:
        out += bias
    return out if x.dim() == 2 else out.view(*x.shape[:-1], n)


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled loop (built on first use, then read from the cache), or None where it cannot run here."""
    reason = _unavailable()
    if reason is None:
        try:
            lib = ctypes.CDLL(str(_build()))
        except (OSError, subprocess.SubprocessError) as e:
            message = " ".join(str(e).split())[:300] or type(e).__name__  # the compiler's errors on one line
            reason = f"its build failed ({message})"
        else:
            for fn in (lib.gemv_bf16, lib.gemv_f32):
                fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
                fn.restype = None
            return lib
    logger.info("the native CPU matmul is off: %s; decode steps use oneDNN", reason)
    return None


def _unavailable() -> str | None:
    """Why the loop cannot run here, or None."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"{ENV_SWITCH}=0"
    if platform.system() != "Linux":
        return f"it is built for Linux only (this is {platform.system()})"
    if _compiler() is None:
        return "no C compiler (cc or gcc) on PATH"
    if not _torch_uses_gnu_openmp():
        return "torch's OpenMP runtime is not GNU's libgomp (a second thread pool would fight it)"
    return None


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _torch_uses_gnu_openmp() -> bool:
    """torch loaded libgomp: then the library's own libgomp.so.1 resolves to that copy (one thread pool)."""
    return "libgomp" in Path("/proc/self/maps").read_text()


def _build() -> Path:
    """The library's path in the cache, compiled there first when missing (atomically: written aside, renamed)."""
    compiler = _compiler()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([SOURCE, compiler, version, *FLAGS, _cpu_signature()]).encode()).hexdigest()[:16]
    path = cache_root() / "native" / f"gemv-{key}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        src, lib = Path(tmp) / "gemv.c", Path(tmp) / path.name
        src.write_text(SOURCE)
        command = [compiler, *FLAGS, str(src), "-o", str(lib)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise OSError(f"{compiler} exited with {result.returncode}: {result.stderr.strip()[-500:]}")
        lib.replace(path)
    return path


def _cpu_signature() -> str:
    """What -march=native compiled for: the CPU's model and feature flags (a cache shared by machines keeps one
    library per kind of CPU)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    lines = [line for line in info.splitlines() if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return platform.machine() + "\n" + "\n".join(sorted(set(lines)))
