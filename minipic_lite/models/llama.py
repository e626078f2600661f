"""The Llama family (Llama, SmolLM2, Mistral, Qwen2, Qwen3) written for the paged KV cache.

Tokens of all requests in a step are flattened into one batch `[num_tokens, ...]`; the per-step
`StepMetadata` (models/step.py) says where each token's K/V goes (slot_mapping) and what each query may read.
Weights are read from safetensors with q/k/v and gate/up fused into one matmul each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.nn import functional as F

from minipic_lite.config import ModelConfig
from minipic_lite.models.step import StepMetadata
from ops import apply_rope, rope_paged_attention
from ops.launcher import pdl_requested


def rope_table(cfg: ModelConfig, device=None) -> torch.Tensor:
    """[max_position, rotary_dim] cos|sin rows, computed in float32 the way transformers computes them.

    NOTE: float32 angles (not float64) on purpose: the engine must match the HF oracle on logits (the tests'
    FP32_LOGITS_ATOL, 2e-4).
    """
    dim = cfg.rope_dim
    # NOTE: on the CPU even under `torch.device("meta")` (build_model): an op on meta tensors imported torch._dynamo
    # (0.9 s of a CPU start that never compiles)
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    angles = torch.arange(cfg.max_position, dtype=torch.float32, device="cpu")[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)


# -- the pure, shape-generic pieces that torch.compile fuses (one kernel each instead of 4-10) -------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: statistics in float32, scaled in the input dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """(x + delta, rms_norm(x + delta)): the residual add fused with the next norm."""
    x = x + delta
    return x, rms_norm(x, weight, eps)


def eager_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` for eager steps (the CPU's): its float32 statistics in one `F.rms_norm` call, in four dispatched ops
    where the explicit form takes eight; on the CPU the same bits (tests/test_model_kernels.py)."""
    return weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


def eager_add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    x = x + delta
    return x, eager_rms_norm(x, weight, eps)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def write_kv(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, kv_rows: torch.Tensor) -> None:
    """This step's keys and values, k and v [T, KVH, D], into their slots of one layer's caches, kv_rows
    [2, blocks * B, KVH, D] (a view: keys, then values); before attention reads the cache (DESIGN §2). Compiled,
    Inductor writes both in place with one scatter: one kernel (two index copies took two at decode on the H200)."""
    # NOTE: the caches come in as the view that is written, not as kv_layer [2, blocks, B, ...] viewed here:
    # Inductor writes a mutated input in place, but a view it takes of one is written through a copy of the layer
    kv_rows.index_copy_(1, slot_mapping, torch.stack([k, v]))


def rope_and_write_kv(q, k, v, positions, cos_sin, slot_mapping, kv_rows, rotate_keys: bool) -> torch.Tensor:
    """q [T, H, D] rotated at `positions`; k [T, KVH, D] (rotated first when `rotate_keys`: the vanilla mode) and v
    written with `write_kv`. One compiled function, so that Inductor launches the rotation and the write as one kernel
    (its combo kernels, CUDA: ROPE_WRITE_OPTIONS): on the H200 1.55 µs a layer at batch-1 decode against 1.41 + 1.39
    for the two kernels before (next32-d3f8e7a). In the vanilla mode the write waits on the keys' rotation: two."""
    # NOTE: k's rotation is not returned: a second reader would make Inductor write it out and the write wait on it
    write_kv(apply_rope(k, positions, cos_sin) if rotate_keys else k, v, slot_mapping, kv_rows)
    return apply_rope(q, positions, cos_sin)


ROPE_WRITE_OPTIONS = {"combo_kernels": True}  # horizontal fusion of independent kernels (Triton only)


@dataclass(frozen=True)
class Kernels:
    """The elementwise functions the model calls: eager, or compiled by torch.compile (dynamic shapes)."""

    rms_norm: object = eager_rms_norm
    add_rms_norm: object = eager_add_rms_norm
    silu_and_mul: object = silu_and_mul
    rope_and_write_kv: object = rope_and_write_kv

    @classmethod
    def compiled(cls) -> Kernels:
        return cls(
            compile_kernel(rms_norm),
            compile_kernel(add_rms_norm),
            compile_kernel(silu_and_mul),
            compile_kernel(rope_and_write_kv, options=ROPE_WRITE_OPTIONS),
        )


RECOMPILE_LIMIT = 64  # compiled entries per function, across every engine of the process


def compile_kernel(fn, backend="inductor", options: dict | None = None, dynamic: bool | None = None):
    """`fn` compiled by torch.compile as one graph, its shapes dynamic where they change: the first call compiles
    for its exact shapes, and a call with another token count recompiles with only the sizes that changed left
    symbolic (torch.compile's automatic dynamic shapes). The model's own sizes (hidden, heads, head_dim) stay
    constants, so Inductor can reduce over the hidden size in one pass and vectorize its loads.
    `MINIPIC_COMPILE_DYNAMIC=all` makes every size symbolic from the first call (the behaviour before).
    Dynamo keeps its compiled entries per function, for every engine of the process: engines of other dtypes, head
    sizes or rotary dims in one process (a notebook, the test suite) each add entries, and past the default limit
    of 8 a fullgraph function fails hard. `options`: Inductor settings for this function; `dynamic=False`: every
    shape exact (a new shape compiles again)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    if dynamic is None and os.environ.get("MINIPIC_COMPILE_DYNAMIC") == "all":
        dynamic = True
    from torch._inductor import config as inductor_config

    pdl = pdl_requested() and hasattr(inductor_config.triton, "enable_pdl")
    if backend == "inductor" and pdl:
        # NOTE: Inductor's kernels launched as programmatic dependents (Hopper and later; Inductor leaves it out on
        # other devices), as the op's read and merge are (ops/triton_kernel.py, `use_pdl`)
        options = {"triton.enable_pdl": True, **(options or {})}
    return torch.compile(fn, dynamic=dynamic, fullgraph=True, backend=backend, options=options)


class RMSNorm(nn.Module):
    """Holds the weight and eps; the layers call `Kernels.rms_norm` / `add_rms_norm` with them. Another family's
    norm passes its own `fn` and initial weight (Qwen3.5 scales by 1 + weight: models/qwen3_5.py)."""

    def __init__(self, dim: int, eps: float, fn=rms_norm, init: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), init))
        self.eps = eps
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.weight, self.eps)


def paged_attention(q, meta: StepMetadata, k_cache, v_cache, cos_sin, scale: float) -> torch.Tensor:
    """The op over the paged cache; `cos_sin` None: the keys are stored rotated (the vanilla mode)."""
    return rope_paged_attention(
        q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.positions, meta.kv_lens,
        meta.visible_start, cos_sin, scale, check=False, num_decode_seqs=meta.num_decode_seqs,
    )  # (T, H, D)  # fmt: skip


class PagedAttention(nn.Module):
    """What every family's attention layer shares: the step's RoPE, its K/V written to the paged cache before
    attention reads it (DESIGN §2), and attention over the cache through the op, or at a CPU decode step over the
    decode mirror (decode_mirror.py). The subclass adds its projections and norms."""

    def __init__(self, cfg: ModelConfig, position_free: bool, kernels: Kernels, layer_idx: int):
        super().__init__()
        self.kernels = kernels
        self.layer_idx = layer_idx  # among the attention layers: its K/V in the paged cache and the mirror
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.position_free = position_free
        self.scale = self.head_dim**-0.5

    def attend(self, q, k, v, meta: StepMetadata, kv_layer: torch.Tensor, cos_sin) -> torch.Tensor:
        """q [T, H, D], k and v [T, KVH, D] (unrotated), kv_layer [2, blocks, B, KVH, D] -> [T, H, D]."""
        if meta.decode_mirror is not None:
            return self._attend_mirror(q, k, v, meta, kv_layer)
        # NOTE: the vanilla baseline stores keys rotated; position-free keys are rotated by the op at read time
        q = self.kernels.rope_and_write_kv(
            q, k, v, meta.positions, cos_sin, meta.slot_mapping, kv_layer.flatten(1, 2), not self.position_free
        )
        k_cache, v_cache = kv_layer.unbind(0)  # (blocks, B, KVH, D) each
        return paged_attention(q, meta, k_cache, v_cache, cos_sin if self.position_free else None, self.scale)

    def _attend_mirror(self, q, k, v, meta: StepMetadata, kv_layer: torch.Tensor) -> torch.Tensor:
        """q and k rotated with the step's tables, built once for every layer; the paged cache written (keys rotated
        in the vanilla mode, as `rope_and_write_kv` does); then attention over the mirror."""
        mirror = meta.decode_mirror
        k_rotated = mirror.rotate(k)  # (T, KVH, D) float32
        write_kv(k if self.position_free else k_rotated.to(k.dtype), v, meta.slot_mapping, kv_layer.flatten(1, 2))
        q = mirror.rotate(q).to(q.dtype)  # NOTE: rounded as apply_rope rounds it
        return mirror.attend(self.layer_idx, q, k_rotated, v, self.scale)  # (T, H, D)


class Attention(PagedAttention):
    def __init__(self, cfg: ModelConfig, position_free: bool, kernels: Kernels, layer_idx: int):
        super().__init__(cfg, position_free, kernels, layer_idx)
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x, meta: StepMetadata, kv_layer: torch.Tensor, cos_sin) -> torch.Tensor:
        """kv_layer: this layer's K and V caches, [2, blocks, B, KVH, D]."""
        num_tokens = x.shape[0]
        q, kv = self.qkv_proj(x).split([self.q_size, 2 * self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # (T, H, D)
        kv = kv.view(num_tokens, 2, self.num_kv_heads, self.head_dim)  # (T, 2, KVH, D): keys, then values
        k, v = kv.unbind(1)  # (T, KVH, D) each
        if self.q_norm is not None:
            q = self.kernels.rms_norm(q, self.q_norm.weight, self.q_norm.eps)
            k = self.kernels.rms_norm(k, self.k_norm.weight, self.k_norm.eps)
        out = self.attend(q, k, v, meta, kv_layer, cos_sin)  # (T, H, D)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, kernels: Kernels):
        super().__init__()
        self.kernels = kernels
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.kernels.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, position_free: bool, kernels: Kernels, layer_idx: int):
        super().__init__()
        self.kernels = kernels
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, position_free, kernels, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, kernels)

    def forward(self, x, normed, meta, kv_layer, cos_sin):
        """x: the residual stream; normed: input_layernorm(x). Returns (x + attn + mlp, the pre-MLP stream)."""
        norm = self.post_attention_layernorm
        attn = self.self_attn(normed, meta, kv_layer, cos_sin)
        x, h = self.kernels.add_rms_norm(x, attn, norm.weight, norm.eps)
        return x, self.mlp(h)


class CausalLM(nn.Module):
    """What every model family shares: the token embedding, the elementwise kernels, the CPU matmul route, and
    (added after the family's layers, `_add_head`) the LM head and the RoPE table."""

    def __init__(self, cfg: ModelConfig, compile: bool):  # noqa: A002
        super().__init__()
        self.cfg = cfg
        self.kernels = Kernels.compiled() if compile else Kernels()
        # NOTE: no random draw (the weights are loaded, or drawn by init_dummy_weights): on the meta device, as
        # build_model builds, nn.Embedding's draw imported torch._dynamo
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size)
        )
        self.matmul_route = None  # set by packed_linear.pack_linears on the CPU

    def _add_head(self) -> None:
        # NOTE: registered after the layers, as transformers orders them (init_dummy_weights draws in this order)
        self.lm_head = nn.Linear(self.cfg.hidden_size, self.cfg.vocab_size, bias=False)
        self.tie_weights()
        self.register_buffer("cos_sin", rope_table(self.cfg), persistent=False)

    def tie_weights(self) -> None:
        """Share the embedding with the LM head where the config says so (again after `to_empty`, which unties)."""
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def _follow_step(self, meta: StepMetadata) -> None:
        if self.matmul_route is not None:
            self.matmul_route.kind = meta.cpu_matmul  # the step contract picks the matmul route

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, vocab) in the model's dtype: greedy decoding takes their argmax as they are (a float32 copy of a
        64-row bf16 step's logits cost 22 µs of its 6.5 ms on the H200); the sampler upcasts where it samples."""
        return self.lm_head(hidden)


class LlamaForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig, position_free: bool = True, compile: bool = False):  # noqa: A002
        super().__init__(cfg, compile)
        self.layers = nn.ModuleList(DecoderLayer(cfg, position_free, self.kernels, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self._add_head()

    def forward(self, input_ids, meta: StepMetadata, kv_cache: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> hidden states [T, hidden]; kv_cache [2, layers, blocks, B, KVH, D]."""
        self._follow_step(meta)
        x = self.embed_tokens(input_ids)  # (T, hidden)
        first = self.layers[0].input_layernorm
        normed = self.kernels.rms_norm(x, first.weight, first.eps)
        for i, layer in enumerate(self.layers):
            x, mlp_out = layer(x, normed, meta, kv_cache[:, i], self.cos_sin)
            norm = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            x, normed = self.kernels.add_rms_norm(x, mlp_out, norm.weight, norm.eps)
        return normed

    @torch.no_grad()
    def init_dummy_weights(self, seed: int = 0, std: float = 0.02) -> None:
        """Random weights (vLLM's load_format="dummy"): benchmarks of model shapes we do not ship."""
        gen = torch.Generator(self.embed_tokens.weight.device).manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=gen)

    @torch.no_grad()
    def load_weights(self, model_dir: Path) -> None:
        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors weights in {model_dir} (pickle checkpoints are not loaded)")
        fused = {"q_proj": 0, "k_proj": 1, "v_proj": 2, "gate_proj": 0, "up_proj": 1}
        pending: dict[str, dict[int, torch.Tensor]] = {}
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    target, part = _target_name(name, fused)
                    if target not in params:
                        continue
                    tensor = f.get_tensor(name)
                    if part is None:
                        params[target].copy_(tensor)
                    else:
                        pending.setdefault(target, {})[part] = tensor
                    loaded.add(target)
        for target, parts in pending.items():
            params[target].copy_(torch.cat([parts[i] for i in sorted(parts)], dim=0))
        # NOTE: the model was built on the meta device: a weight the files lack would be uninitialized memory.
        missing = sorted(set(params) - loaded)
        if missing:
            more = " ..." if len(missing) > 5 else ""
            raise ValueError(f"{model_dir} lacks weights for: {', '.join(missing[:5])}{more}")


def _target_name(name: str, fused: dict[str, int]) -> tuple[str, int | None]:
    name = name.removeprefix("model.")
    for proj, part in fused.items():
        if f".{proj}." in name:
            merged = "qkv_proj" if proj in ("q_proj", "k_proj", "v_proj") else "gate_up_proj"
            return name.replace(proj, merged), part
    return name, None
