"""The Qwen3.5 hybrid (text part): Gated DeltaNet layers with recurrent state, and gated full attention.

Layers follow `cfg.layer_types` (3 linear : 1 full in the released models). Full-attention layers work like
llama.py's: flattened tokens, K/V written unrotated to the paged cache, `rope_paged_attention` reads them,
here with partial rotary (the first `rotary_dim` dims of a head; the op rotates only those) and an output
gate. Linear-attention layers keep, per running request, a conv window (the last kernel−1 inputs) and a
recurrent state [v_heads, k_dim, v_dim] (float32) in state slots that the runner owns and the step names
(`StepMetadata.recurrent`); a chunk continues the request's state from where its previous chunk left it.

    hidden ──norm──┬─ linear_attn (conv → gated delta rule → gated RMSNorm) ─┐        (3 of every 4 layers)
                   └─ self_attn (q·gate, qk-norm, partial RoPE, paged op) ────┴─ + ──norm── MLP ── +

Qwen3.5's RMSNorm scales by (1 + weight) (weights are stored centred on 0); the gated norm inside the
linear layers by weight. Weights load from `Qwen3_5ForCausalLM.save_pretrained` (`model.layers...`) and from
the released multimodal layout (`model.language_model.layers...`; the vision tower and MTP head are skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.nn import functional as F

from minipic_lite.config import ModelConfig, cdiv
from minipic_lite.models import gated_delta_rule as gdr
from minipic_lite.models.llama import MLP, CausalLM, Kernels, PagedAttention, RMSNorm, compile_kernel
from minipic_lite.models.step import RecurrentStep, StepMetadata, host_tensor


def rms_norm_1p(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's RMSNorm: float32 statistics, scaled by (1 + weight), rounded once to x's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).to(x.dtype)


def Norm1p(dim: int, eps: float, fn=rms_norm_1p) -> RMSNorm:  # noqa: N802 (a constructor)
    return RMSNorm(dim, eps, fn, init=0.0)


def gated_rms_norm(out: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The linear layers' output norm: RMSNorm of the delta rule's output (float32 statistics, rounded to z's dtype,
    scaled by weight), gated by silu(z), rounded once more to z's dtype. out [..., Dv] (any float dtype), z alike."""
    h = out.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return ((weight * h.to(z.dtype)).float() * F.silu(z.float())).to(z.dtype)


FLA_CHUNK_SIZE = 64  # tokens per chunk in fla's chunked delta rule (its default)


def fla_chunk_indices(query_lens: list[int], chunk_size: int = FLA_CHUNK_SIZE) -> list[tuple[int, int]]:
    """(sequence, chunk) of every chunk of a varlen batch, in order: fla's `chunk_indices`. Given to fla once per
    step, from the host's query lengths; otherwise each linear layer's call derives them from the device's
    `cu_seqlens` (fla 0.6.0 reads their sum back to the host to size them)."""
    return [(seq, chunk) for seq, n in enumerate(query_lens) for chunk in range(cdiv(n, chunk_size))]


def conv_rows(query_lens: list[int], width: int) -> tuple[list[int], list[int], list[int]]:
    """A varlen step's rows in the conv buffer, where each sequence's window (its last `width` inputs) sits just
    before its tokens: (token rows [T], window rows [S·width], last rows [S·width]: the rows that are each
    sequence's window after the step).

        query_lens [3, 1], width 2:  rows 0 1 | 2 3 4 | 5 6 | 7      tokens [2, 3, 4, 7]
                                          w0    seq 0   w1   seq 1   windows [0, 1, 5, 6]   last [3, 4, 6, 7]
    """
    tokens, windows, last, start = [], [], [], 0
    for n in query_lens:
        windows += range(start, start + width)
        tokens += range(start + width, start + width + n)
        last += range(start + n, start + n + width)
        start += width + n
    return tokens, windows, last


def causal_conv_taps(buf: torch.Tensor, first_rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu of the depthwise causal conv, one output per row of `first_rows`: out[i] = silu(Σ_j buf[first_rows[i]
    + j] · weight[:, j]) over the K taps, in float32 at least, rounded once to buf's dtype. buf [rows, C], weight
    [C, K]. Compiled (torch.compile), the taps, the sum and the silu fuse into one kernel."""
    dtype = torch.promote_types(buf.dtype, torch.float32)
    acc = buf[first_rows].to(dtype) * weight[:, 0].to(dtype)
    for j in range(1, weight.shape[1]):
        acc = acc + buf[first_rows + j].to(dtype) * weight[:, j].to(dtype)
    return F.silu(acc).to(buf.dtype)


@dataclass(frozen=True)
class HybridKernels:
    """The hybrid's own elementwise functions: eager, or each compiled by torch.compile (dynamic shapes) into one
    fused kernel, as llama.Kernels does for the shared ones (unfused, each norm is a handful of elementwise kernels
    over the hidden states)."""

    rms_norm_1p: object = rms_norm_1p
    gated_rms_norm: object = gated_rms_norm
    causal_conv_taps: object = causal_conv_taps

    @classmethod
    def compiled(cls) -> HybridKernels:
        return cls(*(compile_kernel(fn) for fn in (rms_norm_1p, gated_rms_norm, causal_conv_taps)))


@dataclass(slots=True)
class ConvRows:
    """conv_rows on the device, plus each token's first tap row (token row − width): built once per step."""

    tokens: torch.Tensor
    windows: torch.Tensor
    last: torch.Tensor
    first: torch.Tensor

    @classmethod
    def build(cls, query_lens: list[int], width: int, device: torch.device) -> ConvRows:
        tokens, windows, last = conv_rows(query_lens, width)
        first = [t - width for t in tokens]
        return cls(*(host_tensor(r, torch.long).to(device, non_blocking=True) for r in (tokens, windows, last, first)))


def _fla_kernels(device: torch.device):
    """fla's chunked and fused-recurrent kernels on CUDA, or None (another device, or fla not installed)."""
    if device.type != "cuda":
        return None
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


class GatedAttention(PagedAttention):
    """Full attention with q/k RMSNorm, partial rotary and a sigmoid output gate (per head and dim)."""

    def __init__(self, cfg: ModelConfig, position_free: bool, kernels: Kernels, hybrid: HybridKernels, index: int):
        super().__init__(cfg, position_free, kernels, index)
        # NOTE: q_proj's rows are [q | gate] per head: (heads, 2·head_dim)
        self.qkv_proj = nn.Linear(cfg.hidden_size, 2 * self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = Norm1p(self.head_dim, cfg.rms_norm_eps, hybrid.rms_norm_1p)
        self.k_norm = Norm1p(self.head_dim, cfg.rms_norm_eps, hybrid.rms_norm_1p)

    def forward(self, x, meta: StepMetadata, kv_layer: torch.Tensor, cos_sin) -> torch.Tensor:
        """kv_layer: this layer's K and V caches, [2, blocks, B, KVH, D]."""
        num_tokens = x.shape[0]
        q_gate, k, v = self.qkv_proj(x).split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, gate = q_gate.view(num_tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)  # (T, H, D) each
        k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim))  # (T, KVH, D)
        out = self.attend(self.q_norm(q), k, v.view_as(k), meta, kv_layer, cos_sin)  # (T, H, D)
        out = out.reshape(num_tokens, self.q_size) * torch.sigmoid(gate.reshape(num_tokens, self.q_size))
        return self.o_proj(out)


class GatedDeltaNet(nn.Module):
    """Causal depthwise conv (kernel K) → gated delta rule → RMSNorm gated by silu(z) → out_proj."""

    def __init__(self, cfg: ModelConfig, linear_idx: int, hybrid: HybridKernels):
        super().__init__()
        lin = cfg.linear
        self.hybrid = hybrid
        self.linear_idx = linear_idx  # index among the linear layers: the state's first dim
        self.num_k_heads, self.num_v_heads = lin.num_k_heads, lin.num_v_heads
        self.k_dim, self.v_dim = lin.k_head_dim, lin.v_head_dim
        self.key_size, self.value_size = lin.num_k_heads * lin.k_head_dim, lin.num_v_heads * lin.v_head_dim
        self.conv_dim = lin.conv_dim
        # NOTE: in_proj fuses transformers' in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (one matmul)
        self.in_proj = nn.Linear(cfg.hidden_size, self.conv_dim + self.value_size + 2 * lin.num_v_heads, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, 1, lin.conv_kernel))  # (C, 1, K)
        self.dt_bias = nn.Parameter(torch.ones(lin.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(lin.num_v_heads))
        self.norm_weight = nn.Parameter(torch.ones(lin.v_head_dim))
        self.eps = cfg.rms_norm_eps
        self.out_proj = nn.Linear(self.value_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        rec = meta.recurrent
        mixed, z, b, a = self.in_proj(x).split(
            [self.conv_dim, self.value_size, self.num_v_heads, self.num_v_heads], dim=-1
        )  # (T, C), (T, Hv·Dv), (T, Hv), (T, Hv)
        conv_state = rec.conv[self.linear_idx]  # (slots, C, K−1), updated in place
        ssm_state = rec.ssm[self.linear_idx]  # (slots, Hv, Dk, Dv) float32, updated in place
        mixed = self._conv(mixed, conv_state, rec)  # (T, C)
        q, k, v = mixed.split([self.key_size, self.key_size, self.value_size], dim=-1)
        num_tokens = x.shape[0]
        q = q.reshape(num_tokens, self.num_k_heads, self.k_dim)
        k = k.reshape(num_tokens, self.num_k_heads, self.k_dim)
        v = v.reshape(num_tokens, self.num_v_heads, self.v_dim)
        beta = b.sigmoid()  # (T, Hv)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # (T, Hv), log decay <= 0
        out = self._delta_rule(q, k, v, g, beta, ssm_state, rec)  # (T, Hv, Dv) float32, or the model dtype (fla)
        z = z.reshape(num_tokens, self.num_v_heads, self.v_dim)
        h = self.hybrid.gated_rms_norm(out, z, self.norm_weight, self.eps)
        return self.out_proj(h.reshape(num_tokens, self.value_size))

    def _conv(self, mixed: torch.Tensor, conv_state: torch.Tensor, rec: RecurrentStep) -> torch.Tensor:
        """Each sequence's window of its last K−1 inputs, then this chunk's inputs; the window moves on."""
        weight = self.conv_weight  # (C, 1, K)
        if rec.is_decode:
            window = torch.cat([conv_state[rec.slots], mixed[:, :, None]], dim=-1)  # (S, C, K)
            conv_state[rec.slots] = window[:, :, 1:]
            return F.silu((window * weight[:, 0]).sum(-1))  # (S, C)
        # NOTE: one buffer for the whole step, each sequence's window before its tokens (conv_rows), so one kernel
        # computes every output: no per-sequence launches, no (C, T) transposes
        width, num_seqs = conv_state.shape[-1], len(rec.query_lens)
        if rec.conv_rows is None:  # once per step, for every linear layer
            rec.conv_rows = ConvRows.build(rec.query_lens, width, mixed.device)
        rows = rec.conv_rows
        buf = mixed.new_empty(mixed.shape[0] + num_seqs * width, self.conv_dim)
        buf.index_copy_(0, rows.windows, conv_state[rec.slots].transpose(1, 2).reshape(-1, self.conv_dim))
        buf.index_copy_(0, rows.tokens, mixed)
        conv_state[rec.slots] = buf[rows.last].view(num_seqs, width, self.conv_dim).transpose(1, 2)
        return self.hybrid.causal_conv_taps(buf, rows.first, weight[:, 0])

    def _delta_rule(self, q, k, v, g, beta, ssm_state: torch.Tensor, rec: RecurrentStep) -> torch.Tensor:
        if rec.fla is not None:
            return self._fla(q, k, v, g, beta, ssm_state, rec)
        if self.num_v_heads != self.num_k_heads:  # each q/k head serves consecutive value heads
            q = q.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=1)
            k = k.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=1)
        q, k = gdr.prepare_qk(q, k)
        if rec.is_decode:
            out, ssm_state[rec.slots] = gdr.recurrent_step(q, k, v, g, beta, ssm_state[rec.slots])
            return out
        outs, start = [], 0
        for slot, n in zip(rec.slot_ids, rec.query_lens, strict=True):
            part = slice(start, start + n)
            out, ssm_state[slot] = gdr.chunk_gated_delta_rule(q[part], k[part], v[part], g[part], beta[part],
                                                              ssm_state[slot])  # fmt: skip
            outs.append(out)
            start += n
        return torch.cat(outs)

    def _fla(self, q, k, v, g, beta, ssm_state, rec: RecurrentStep) -> torch.Tensor:
        """CUDA with fla installed: one varlen launch for all sequences, as transformers calls it: q, k, v in
        the model's dtype, q and k L2-normalised in the kernel, value heads sharing q/k heads (GVA) in the
        kernel; the state stays float32."""
        chunk, fused = rec.fla
        # NOTE: by keyword: fla's fused-recurrent kernel takes per-key and per-value decays between g and beta
        common = dict(g=g[None], beta=beta[None], scale=self.k_dim**-0.5, initial_state=ssm_state[rec.slots],
                      output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=rec.cu_seqlens)  # fmt: skip
        if rec.is_decode:
            out, final = fused(q[None], k[None], v[None], **common)
        else:
            if rec.fla_chunks is None:  # once per step, for every linear layer
                chunks = torch.tensor(fla_chunk_indices(rec.query_lens), dtype=torch.long)
                rec.fla_chunks = chunks.to(q.device, non_blocking=True)
            # NOTE: under inference mode fla splits long sequences across the SMs ("intra-card context parallel")
            # and reads the sequence bounds on the host: given here, else each layer copies them back (a sync)
            out, final = chunk(q[None], k[None], v[None], chunk_indices=rec.fla_chunks,
                               cu_seqlens_cpu=rec.cu_seqlens_cpu, **common)  # fmt: skip
        ssm_state[rec.slots] = final.float()
        return out[0]  # NOTE: the norm after it reads it in float32


class HybridLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_type: str, index: int, position_free: bool, kernels: Kernels,
                 hybrid: HybridKernels):  # fmt: skip
        super().__init__()
        self.layer_type = layer_type
        self.index = index  # among the layers of its type
        self.input_layernorm = Norm1p(cfg.hidden_size, cfg.rms_norm_eps, hybrid.rms_norm_1p)
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, index, hybrid)
        else:
            self.self_attn = GatedAttention(cfg, position_free, kernels, hybrid, index)
        self.post_attention_layernorm = Norm1p(cfg.hidden_size, cfg.rms_norm_eps, hybrid.rms_norm_1p)
        self.mlp = MLP(cfg, kernels)

    def forward(self, x, meta: StepMetadata, kv_cache: torch.Tensor, cos_sin) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            h = self.linear_attn(h, meta)
        else:
            h = self.self_attn(h, meta, kv_cache[:, self.index], cos_sin)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3_5ForCausalLM(CausalLM):
    """The hybrid's text model over the paged cache (full-attention layers) and state slots (linear layers)."""

    is_hybrid = True

    def __init__(self, cfg: ModelConfig, position_free: bool = True, compile: bool = False):  # noqa: A002
        super().__init__(cfg, compile)
        counts = {"linear_attention": 0, "full_attention": 0}
        hybrid = HybridKernels.compiled() if compile else HybridKernels()
        layers = []
        for layer_type in cfg.layer_types:
            layers.append(HybridLayer(cfg, layer_type, counts[layer_type], position_free, self.kernels, hybrid))
            counts[layer_type] += 1
        self.layers = nn.ModuleList(layers)
        self.num_linear_layers = counts["linear_attention"]
        self.norm = Norm1p(cfg.hidden_size, cfg.rms_norm_eps, hybrid.rms_norm_1p)
        self._add_head()

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Per slot: the conv window [linear_layers, conv_dim, K−1], the recurrent state [linear_layers, Hv, Dk, Dv]."""
        lin = self.cfg.linear
        conv = (self.num_linear_layers, lin.conv_dim, lin.conv_kernel - 1)
        return conv, (self.num_linear_layers, lin.num_v_heads, lin.k_head_dim, lin.v_head_dim)

    def forward(self, input_ids, meta: StepMetadata, kv_cache: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> hidden states [T, hidden]; kv_cache [2, attention layers, blocks, B, KVH, D]."""
        self._follow_step(meta)
        if meta.recurrent is None:  # a forward with no slots (the warm-up that sizes the cache): zero states
            meta.recurrent = RecurrentStep.scratch(self.state_shapes(), meta, self.embed_tokens.weight.dtype)
        if meta.recurrent.fla is None:
            meta.recurrent.fla = _fla_kernels(meta.positions.device)
        x = self.embed_tokens(input_ids)  # (T, hidden)
        for layer in self.layers:
            x = layer(x, meta, kv_cache, self.cos_sin)
        return self.norm(x)

    @torch.no_grad()
    def init_dummy_weights(self, seed: int = 0, std: float = 0.02) -> None:
        """Random weights of the shape (benchmarks): norms at their identity, decays in the released range."""
        gen = torch.Generator(self.embed_tokens.weight.device).manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith(("norm.weight", "_norm.weight")):
                param.zero_()  # (1 + w) norms: identity at 0
            elif name.endswith("norm_weight") or name.endswith("dt_bias"):
                param.fill_(1.0)
            elif name.endswith("A_log"):
                param.uniform_(0.01, 16, generator=gen).log_()
            else:
                param.normal_(0.0, std, generator=gen)

    @torch.no_grad()
    def load_weights(self, model_dir: Path) -> None:
        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors weights in {model_dir} (pickle checkpoints are not loaded)")
        params = dict(self.named_parameters())
        pending: dict[str, dict[int, torch.Tensor]] = {}
        loaded: set[str] = set()
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    target, part = _target_name(name)
                    if target not in params:
                        continue  # the vision tower, the MTP head, rotary buffers
                    tensor = f.get_tensor(name)
                    if part is None:
                        params[target].copy_(tensor.view(params[target].shape))
                    else:
                        pending.setdefault(target, {})[part] = tensor
                    loaded.add(target)
        for target, parts in pending.items():
            params[target].copy_(torch.cat([parts[i] for i in sorted(parts)], dim=0))
        missing = sorted(set(params) - loaded)
        if missing:
            more = " ..." if len(missing) > 5 else ""
            raise ValueError(f"{model_dir} lacks weights for: {', '.join(missing[:5])}{more}")


# transformers' name -> (our fused parameter, its part in the concatenation)
_FUSED = {
    "self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", 0),
    "self_attn.k_proj.weight": ("self_attn.qkv_proj.weight", 1),
    "self_attn.v_proj.weight": ("self_attn.qkv_proj.weight", 2),
    "self_attn.q_proj.bias": ("self_attn.qkv_proj.bias", 0),
    "self_attn.k_proj.bias": ("self_attn.qkv_proj.bias", 1),
    "self_attn.v_proj.bias": ("self_attn.qkv_proj.bias", 2),
    "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", 0),
    "mlp.up_proj.weight": ("mlp.gate_up_proj.weight", 1),
    "linear_attn.in_proj_qkv.weight": ("linear_attn.in_proj.weight", 0),
    "linear_attn.in_proj_z.weight": ("linear_attn.in_proj.weight", 1),
    "linear_attn.in_proj_b.weight": ("linear_attn.in_proj.weight", 2),
    "linear_attn.in_proj_a.weight": ("linear_attn.in_proj.weight", 3),
}
_RENAMED = {
    "linear_attn.conv1d.weight": "linear_attn.conv_weight",
    "linear_attn.norm.weight": "linear_attn.norm_weight",
}


def _target_name(name: str) -> tuple[str, int | None]:
    name = name.removeprefix("model.language_model.").removeprefix("model.")
    for suffix, (target, part) in _FUSED.items():
        if name.endswith(suffix):
            return name[: -len(suffix)] + target, part
    for suffix, target in _RENAMED.items():
        if name.endswith(suffix):
            return name[: -len(suffix)] + target, None
    return name, None
