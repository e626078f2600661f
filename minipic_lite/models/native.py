"""The CPU's decode step in C: the matmul (a few rows times a weight matrix) and attention over the decode mirror.

A decode step reads every weight and every cached key and value once and does two flops with each, so it should run
at the rate the machine reads memory; torch's CPU kernels do not at one row (`docs/CPU.md`,
"The CPU's decode matmul in C" and "The CPU's decode attention in C", for the measures).

- The matmul: the textbook loop. For each weight row, one dot product per input row, the compiler vectorizing the
  sum (`omp simd`), the weight rows shared among torch's OpenMP threads. Sums in float32; a bf16 output is rounded
  to nearest even, as torch rounds.
- Attention: one query token per sequence against its mirror slot's keys (decode_mirror.py), G query heads per kv
  head. The keys are cut into chunks of 256 (the work items of torch's threads); in each, the scores 16 keys at a
  time (their dot products summed across vector lanes by one tree of shuffles), the softmax's exponentials as a
  polynomial, the weighted sum of values; then the chunks are merged by their maxima (flash-decoding's merge).

The C compiler builds both once per machine (`cc -O3 -march=native -fopenmp`) into the cache
(MINIPIC_CACHE_DIR/native, keyed by the source, the compiler and the CPU), and ctypes loads it.

`load()` is None where that cannot work: not Linux, no C compiler, a failed build, an OpenMP runtime in torch other
than GNU's (ours would start a second thread pool beside torch's), or `MINIPIC_NATIVE=0`. Decode steps then keep
oneDNN (packed_linear.py), whose start-up probe also decides, per row count, whether the loop is faster at all,
and the mirror attends through SDPA.
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

GEMV_SOURCE = r"""
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
ATTENTION_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 256  /* keys a work item reads */
#define W 16       /* lanes of a vector: keys whose scores are summed at once, and floats of a row read at once */
#define MAX_G 16
#define MAX_D 256
typedef float vf __attribute__((vector_size(4 * W)));
typedef int32_t vi __attribute__((vector_size(4 * W)));
typedef uint16_t vh __attribute__((vector_size(2 * W)));
#if defined(__clang__)
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (vi){__VA_ARGS__})
#endif

static inline vf load(const float* p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float* p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf splat(float x) { return (vf){0} + x; }

/* W floats of a key or value row from element i of a float32 or a bfloat16 (its upper 16 bits) mirror */
static inline vf load_kv(const void* base, int64_t i, const int bf16) {
    if (!bf16) return load((const float*)base + i);
    vh h;
    memcpy(&h, (const uint16_t*)base + i, sizeof h);
    return (vf)(__builtin_convertvector(h, vi) << 16);
}

/* The lane sums of 16 vectors in one: a tree of shuffles and 15 vector adds (16 separate sums take 4 each: 64).
   Each level adds the lower and upper halves of each group of lanes, two vectors into one, so lane i of the result
   holds the sum of p[bit-reversed i]. */
static const int BIT_REVERSED[W] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
static inline vf lane_sums(const vf p[W]) {
    vf r8[8], r4[4], r2[2];
    for (int i = 0; i < 8; ++i)
        r8[i] = SHUFFLE(p[2 * i], p[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
              + SHUFFLE(p[2 * i], p[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; ++i)
        r4[i] = SHUFFLE(r8[2 * i], r8[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
              + SHUFFLE(r8[2 * i], r8[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int i = 0; i < 2; ++i)
        r2[i] = SHUFFLE(r4[2 * i], r4[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
              + SHUFFLE(r4[2 * i], r4[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    return SHUFFLE(r2[0], r2[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
         + SHUFFLE(r2[0], r2[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

/* 2^x for x <= 0 (a score minus its row's maximum): 2^floor(x) built in the exponent bits times a degree-6
   polynomial of the fraction (relative error 1.0e-7 in float32, 1.9e-9 in exact arithmetic); ~0 below -126, NaN
   stays NaN */
static inline vf exp2_neg(vf x) {
    vi low = x < splat(-126.0f);  /* a true lane is all ones */
    x = (vf)(((vi)x & ~low) | ((vi)splat(-126.0f) & low));
    vi t = __builtin_convertvector(x, vi);  /* toward zero */
    vi n = t + (vi)(x < __builtin_convertvector(t, vf));  /* floor */
    vf f = x - __builtin_convertvector(n, vf);
    vf p = splat(2.16907938e-4f);  /* fit to 2^f on [0, 1) at Chebyshev nodes, weighted toward minimax */
    p = p * f + 1.24430272e-3f;
    p = p * f + 9.67847835e-3f;
    p = p * f + 5.54835200e-2f;
    p = p * f + 2.40229800e-1f;
    p = p * f + 6.93147004e-1f;
    p = p * f + 1.0f;
    return p * (vf)((n + 127) << 23);
}

/* G queries qh [G, D] (scaled by scale_log2e) against len <= CHUNK keys and values ([len, D] rows from element
   `row` of k and v): the chunk's unnormalized softmax, base 2: its maxima m [G], sums l [G] and weighted values
   acc [G, D] */
static inline __attribute__((always_inline)) void attend_chunk(
    const float* qh, const void* k, const void* v, int64_t row, const int bf16, int64_t len, int64_t G,
    const int64_t D, float scale_log2e, float* m, float* l, float* acc) {
    const int64_t C = D / W;
    float s[MAX_G][CHUNK + W];
    for (int64_t g = 0; g < G; ++g) {  /* -- scores, 16 keys at a time -- */
        vf q[MAX_D / W];
        for (int64_t c = 0; c < C; ++c) q[c] = load(qh + g * D + c * W) * scale_log2e;
        for (int64_t j0 = 0; j0 < len; j0 += W) {
            vf p[W];
            for (int64_t jj = 0; jj < W; ++jj) {
                int64_t kj = row + (j0 + jj < len ? j0 + jj : len - 1) * D;  /* past len: the last key again */
                vf a = q[0] * load_kv(k, kj, bf16);
                for (int64_t c = 1; c < C; ++c) a += q[c] * load_kv(k, kj + c * W, bf16);
                p[BIT_REVERSED[jj]] = a;
            }
            store(&s[g][j0], lane_sums(p));
        }
    }
    for (int64_t g = 0; g < G; ++g) {  /* -- softmax -- */
        float mx = -INFINITY, total = 0.0f;
        for (int64_t j = 0; j < len; ++j) mx = s[g][j] > mx ? s[g][j] : mx;
        vf sum = {0};
        int64_t j = 0;
        for (; j + W <= len; j += W) { vf e = exp2_neg(load(&s[g][j]) - mx); store(&s[g][j], e); sum += e; }
        for (; j < len; ++j) { s[g][j] = exp2_neg(splat(s[g][j] - mx))[0]; total += s[g][j]; }
        for (int i = 0; i < W; ++i) total += sum[i];
        m[g] = mx; l[g] = total;
    }
    for (int64_t g = 0; g < G; ++g) {  /* -- weighted values -- */
        vf a[MAX_D / W];
        for (int64_t c = 0; c < C; ++c) a[c] = (vf){0};
        for (int64_t j = 0; j < len; ++j) {
            vf p = splat(s[g][j]);
            for (int64_t c = 0; c < C; ++c) a[c] += p * load_kv(v, row + j * D + c * W, bf16);
        }
        for (int64_t c = 0; c < C; ++c) store(acc + g * D + c * W, a[c]);
    }
}

/* Decode attention over contiguous per-slot keys: query i (G heads of each of kvh kv heads, q and out [n, kvh, G, D],
   float32) sees keys first[i]..last[i] of slot slots[i]; key j of slot s, kv head h is the row at element
   s * stride_slot + h * stride_head + j * D of k (values alike), float32 or, with bf16, bfloat16;
   D % 16 == 0, D <= 256, G <= 16. Returns 0, or 1 where its scratch could not be allocated (nothing written) */
int decode_attention(const float* q, const void* k, const void* v, float* out, const int64_t* slots,
                      const int64_t* first, const int64_t* last, int64_t n, int64_t kvh, int64_t G, int64_t D,
                      int64_t stride_slot, int64_t stride_head, int bf16, float scale, int threads) {
    const float scale_log2e = scale * 1.4426950408889634f;
    int64_t chunks = 1;  /* -- work items: (query, kv head, chunk of keys) -- */
    for (int64_t i = 0; i < n; ++i) {
        int64_t c = (last[i] - first[i] + CHUNK) / CHUNK;
        chunks = c > chunks ? c : chunks;
    }
    int64_t items = n * kvh * chunks;
    float* part_m = malloc(sizeof(float) * items * G);
    float* part_l = malloc(sizeof(float) * items * G);
    float* part_o = malloc(sizeof(float) * items * G * D);
    if (!part_m || !part_l || !part_o) {
        free(part_m);
        free(part_l);
        free(part_o);
        return 1;
    }
    #pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int64_t it = 0; it < items; ++it) {
        int64_t i = it / (kvh * chunks), h = (it / chunks) % kvh, c = it % chunks;
        int64_t j0 = first[i] + c * CHUNK, j1 = j0 + CHUNK - 1 < last[i] ? j0 + CHUNK - 1 : last[i];
        float *m = part_m + it * G, *l = part_l + it * G, *acc = part_o + it * G * D;
        if (j0 > j1) {  /* a shorter query's chunk past its keys: weighs ~2^-126 x 0 in the merge */
            for (int64_t g = 0; g < G; ++g) { m[g] = -INFINITY; l[g] = 0.0f; }
            memset(acc, 0, sizeof(float) * G * D);
            continue;
        }
        const float* qh = q + (i * kvh + h) * G * D;
        int64_t row = slots[i] * stride_slot + h * stride_head + j0 * D, len = j1 - j0 + 1;
        /* NOTE: the mirror's type and D as constants where D is common, so that each call compiles to its own
           loops, those over a row's vectors unrolled into registers */
#define ATTEND(BF16, DIM) attend_chunk(qh, k, v, row, BF16, len, G, DIM, scale_log2e, m, l, acc)
        if (bf16) {
            if (D == 64) ATTEND(1, 64); else if (D == 128) ATTEND(1, 128); else ATTEND(1, D);
        } else {
            if (D == 64) ATTEND(0, 64); else if (D == 128) ATTEND(0, 128); else ATTEND(0, D);
        }
    }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < n * kvh * G; ++r) {  /* -- merge the chunks by their maxima -- */
        int64_t ih = r / G, g = r % G;
        float mx = -INFINITY, total = 0.0f, o[MAX_D] = {0};
        for (int64_t c = 0; c < chunks; ++c) {
            float mc = part_m[(ih * chunks + c) * G + g];
            mx = mc > mx ? mc : mx;
        }
        for (int64_t c = 0; c < chunks; ++c) {
            int64_t it = ih * chunks + c;
            float w = exp2_neg(splat(part_m[it * G + g] - mx))[0];
            total += w * part_l[it * G + g];
            for (int64_t e = 0; e < D; ++e) o[e] += w * part_o[(it * G + g) * D + e];
        }
        for (int64_t e = 0; e < D; ++e) out[r * D + e] = o[e] / total;
    }
    free(part_m);
    free(part_l);
    free(part_o);
    return 0;
}
"""
SOURCE = GEMV_SOURCE + ATTENTION_SOURCE
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
DTYPES = (torch.float32, torch.bfloat16)
ENV_SWITCH = "MINIPIC_NATIVE"  # "0": never load it


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


def supports_attention(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether the attention kernel takes these heads: whole 16-float vectors a row, at most 256 dims, at most 16
    query heads a kv head."""
    group = num_heads // num_kv_heads
    return head_dim % 16 == 0 and head_dim <= 256 and group <= 16


def decode_attention(
    q: torch.Tensor,  # [n, kv_heads, G, D] float32, contiguous
    k: torch.Tensor,  # [slots, kv_heads, capacity, D] float32 or bfloat16, contiguous (a layer of the decode mirror)
    v: torch.Tensor,  # [slots, kv_heads, capacity, D]
    slots: torch.Tensor,  # [n] int64: query i reads slot slots[i] ...
    first: torch.Tensor,  # [n] int64: ... keys first[i] ...
    last: torch.Tensor,  # [n] int64: ... to last[i], inclusive
    scale: float,
) -> torch.Tensor:
    """softmax(q k^T * scale) v over each query's keys -> [n, kv_heads, G, D] float32, through the C kernel
    (`supports_attention`). Call only where `load()` is not None."""
    n, num_kv_heads, group, head_dim = q.shape
    out = torch.empty_like(q)
    assert k.dtype == v.dtype and k.dtype in DTYPES and q.dtype == torch.float32
    failed = load().decode_attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), slots.data_ptr(), first.data_ptr(),
        last.data_ptr(), n, num_kv_heads, group, head_dim, k.stride(0), k.stride(1), k.dtype == torch.bfloat16,
        scale, torch.get_num_threads(),
    )  # fmt: skip
    if failed:
        raise MemoryError(f"decode attention: no memory for the partial sums of {n} queries x {num_kv_heads} kv heads")
    return out


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernels (built on first use, then read from the cache), or None where they cannot run here."""
    reason = _unavailable()
    if reason is None:
        try:
            lib = ctypes.CDLL(str(_build()))
        except subprocess.TimeoutExpired as e:  # NOTE: its text starts with the whole command, past the cut below
            doing = "to print its version" if "--version" in e.cmd else "compiling the kernels"
            reason = f"its build failed ({Path(e.cmd[0]).name} took over {e.timeout:g} s {doing})"
        except (OSError, subprocess.SubprocessError) as e:
            message = " ".join(str(e).split())[:300] or type(e).__name__  # the compiler's errors on one line
            reason = f"its build failed ({message})"
        else:
            for fn in (lib.gemv_bf16, lib.gemv_f32):
                fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
                fn.restype = None
            ptr, i64 = ctypes.c_void_p, ctypes.c_int64
            lib.decode_attention.argtypes = [ptr] * 7 + [i64] * 6 + [ctypes.c_int, ctypes.c_float, ctypes.c_int]
            lib.decode_attention.restype = ctypes.c_int
            return lib
    # NOTE: nothing configures logging, so only a warning reaches stderr: a machine that cannot run the kernels
    # decodes slower and should say why; MINIPIC_NATIVE=0 is the user's own choice and stays at INFO.
    log = logger.info if reason == f"{ENV_SWITCH}=0" else logger.warning
    log("the native CPU kernels are off: %s; decode steps use oneDNN and SDPA", reason)
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
    return libgomp_path() is not None


def libgomp_path() -> str | None:
    """The path of the libgomp this process loaded (torch's, where it runs on GNU's OpenMP), or None (none, or not
    Linux)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    return next((line.split()[-1] for line in maps if "/libgomp" in line), None)


def _build() -> Path:
    """The library's path in the cache, compiled there first when missing (atomically: written aside, renamed)."""
    compiler = _compiler()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    flags = compiler_flags(version)
    key = hashlib.sha256("\0".join([SOURCE, compiler, version, *flags, cpu_signature()]).encode()).hexdigest()[:16]
    path = cache_root() / "native" / f"kernels-{key}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        src, lib = Path(tmp) / "kernels.c", Path(tmp) / path.name
        src.write_text(SOURCE)
        command = [compiler, *flags, str(src), "-o", str(lib)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise OSError(f"{compiler} exited with {result.returncode}: {result.stderr.strip()[-500:]}")
        lib.replace(path)
    return path


def compiler_flags(version: str) -> tuple[str, ...]:
    """FLAGS for the compiler whose `--version` printed `version`: Clang's `-fopenmp` links LLVM's OpenMP runtime,
    a second thread pool beside torch's libgomp (and often not installed), so it is told to take libgomp."""
    return tuple("-fopenmp=libgomp" if flag == "-fopenmp" and "clang" in version else flag for flag in FLAGS)


def cpu_signature() -> str:
    """What -march=native compiled for: the CPU's model and feature flags (a cache shared by machines keeps one
    library per kind of CPU)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    lines = [line for line in info.splitlines() if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return platform.machine() + "\n" + "\n".join(sorted(set(lines)))
