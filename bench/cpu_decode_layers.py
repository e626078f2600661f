"""Where a CPU batch-1 decode step's time goes: SmolLM2's 30 layers at one token, timed piece by piece, in one run.

The engine's batch-1 bf16 step reads ~269 MB of weights, ~9 ms at the machine's read bandwidth, and took ~25 ms on
oneDNN's matmuls, ~20 on the native C loop (`cpu_engine.py`). This bench times, on the engine's own model:

- `eager`: the layers as the engine's batch-1 decode step runs them (its eager norms, RoPE tables, SiLU-and-mul, its
  probe's matmul route for one row), with attention over a fixed fp32 mirror of `--keys` keys a layer, as the CPU
  decode mirror attends;
- `compiled`: the same math with each layer's pieces before and after attention compiled by Inductor (two compiled
  functions a layer, shared by every layer; F.linear inside), the lever a dispatch-bound step would want;
- `plain`: `compiled`'s functions run eagerly (its math with F.linear, uncompiled);
- the 120 layer projections alone and the LM head alone, on each matmul route (the native C loop, oneDNN's packed
  weights, F.linear), beside the same weights only read, in the same order (`read`: a max over each matrix's bytes,
  the least work that touches them all): the floor a one-row matmul can reach here; attention alone.

A prototype's measure, not the engine: nothing here changes what the engine runs.

    python bench/cpu_decode_layers.py [--keys 256] [--repeats 30] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from provenance import git_sha  # bench/provenance.py, beside this file

import minipic_lite as mp
from minipic_lite.models.llama import eager_add_rms_norm, eager_rms_norm, silu_and_mul
from minipic_lite.models.packed_linear import ROUTES, route_for_rows
from ops.rope import RotationTables


def median_ms(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


class Layers:
    """The model's decode layers at one token, with a fixed attention mirror of `keys` keys a layer."""

    def __init__(self, model, keys: int):
        self.cfg, self.layers = model.cfg, model.layers
        cfg = self.cfg
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.rope = RotationTables.build(model.cos_sin[torch.tensor([keys - 1])], self.head_dim)
        shape = (1, self.kv_heads, keys, self.head_dim)  # (slots, KVH, keys, D) float32, as the mirror holds them
        self.k = [torch.randn(shape) for _ in self.layers]
        self.v = [torch.randn(shape) for _ in self.layers]
        norms = [layer.input_layernorm.weight for layer in self.layers[1:]] + [model.norm.weight]
        self.weights = []  # each layer's (qkv, o, post-attention norm, gate_up, down, the next layer's input norm)
        for layer, next_norm in zip(self.layers, norms, strict=True):
            a, mlp = layer.self_attn, layer.mlp
            norm = layer.post_attention_layernorm.weight
            projections = (a.qkv_proj.weight, a.o_proj.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight)
            self.weights.append((*projections[:2], norm, *projections[2:], next_norm))

    def attend(self, i: int, q, k_rotated, v) -> torch.Tensor:
        """q [1, H, D] bf16, k_rotated [1, KVH, D] fp32, v [1, KVH, D] -> [1, H * D] bf16 (the mirror's math)."""
        self.k[i][0, :, -1] = k_rotated[0]
        self.v[i][0, :, -1] = v[0].float()
        group = self.heads // self.kv_heads
        queries = q.float().view(1, self.kv_heads, group, self.head_dim)  # (S, KVH, G, D)
        out = F.scaled_dot_product_attention(queries, self.k[i], self.v[i], scale=self.head_dim**-0.5)
        return out.reshape(1, self.heads * self.head_dim).to(q.dtype)

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        eps, rope = self.cfg.rms_norm_eps, self.rope
        normed = eager_rms_norm(x, self.layers[0].input_layernorm.weight, eps)
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            q, kv = a.qkv_proj(normed).split([a.q_size, 2 * a.kv_size], dim=-1)
            k, v = kv.view(1, 2, self.kv_heads, self.head_dim).unbind(1)
            q = rope.rotate(q.view(1, self.heads, self.head_dim)).to(q.dtype)
            attn = a.o_proj(self.attend(i, q, rope.rotate(k), v))
            x, h = eager_add_rms_norm(x, attn, layer.post_attention_layernorm.weight, eps)
            x, normed = eager_add_rms_norm(x, layer.mlp.down_proj(silu_and_mul(layer.mlp.gate_up_proj(h))),
                                           self.weights[i][5], eps)  # fmt: skip
        return normed

    def regions(self, before, after):
        """The layers with `before` / `after` attention as given (compiled or not)."""

        def run(x: torch.Tensor) -> torch.Tensor:
            eps, rope = self.cfg.rms_norm_eps, self.rope
            normed = eager_rms_norm(x, self.layers[0].input_layernorm.weight, eps)
            for i, (w_qkv, w_o, w_norm, w_gate_up, w_down, w_next) in enumerate(self.weights):
                q, k, v = before(normed, w_qkv, rope.cos_full, rope.sin_signed, rope.swap, self.heads, self.kv_heads)
                x, normed = after(x, self.attend(i, q, k, v), w_o, w_norm, w_gate_up, w_down, w_next, eps)
            return normed

        return run


def before_attention(normed, w_qkv, cos_full, sin_signed, swap, heads: int, kv_heads: int):
    head_dim = cos_full.shape[-1]
    q, k, v = F.linear(normed, w_qkv).split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(1, heads, head_dim).float(), k.view(1, kv_heads, head_dim).float()
    q = (q * cos_full + q.index_select(-1, swap) * sin_signed).to(normed.dtype)
    return q, k * cos_full + k.index_select(-1, swap) * sin_signed, v.view(1, kv_heads, head_dim)


def after_attention(x, attn, w_o, w_norm, w_gate_up, w_down, w_next, eps: float):
    def norm(h, w):
        h32 = h.float()
        return w * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)

    x = x + F.linear(attn, w_o)
    gate, up = F.linear(norm(x, w_norm), w_gate_up).chunk(2, dim=-1)
    x = x + F.linear(F.silu(gate) * up, w_down)
    return x, norm(x, w_next)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    llm = mp.LLM(dtype=args.dtype)
    model = llm.engine.runner.model
    layers = Layers(model, args.keys)
    x = torch.randn(1, model.cfg.hidden_size, dtype=getattr(torch, args.dtype))
    route = model.matmul_route
    compiled = layers.regions(torch.compile(before_attention, fullgraph=True, dynamic=False),
                              torch.compile(after_attention, fullgraph=True, dynamic=False))  # fmt: skip
    plain = layers.regions(before_attention, after_attention)
    inter = model.cfg.intermediate_size

    def projections() -> None:
        for layer in model.layers:
            a, mlp = layer.self_attn, layer.mlp
            a.qkv_proj(x), a.o_proj(x), mlp.down_proj(mlp.gate_up_proj(x)[:, :inter].contiguous())

    def attention() -> None:
        q = torch.zeros(1, layers.heads, layers.head_dim, dtype=x.dtype)
        k, v = torch.zeros(1, layers.kv_heads, layers.head_dim), torch.zeros(1, layers.kv_heads, layers.head_dim)
        for i in range(len(model.layers)):
            layers.attend(i, q, k, v)

    def read(weights) -> None:
        for w in weights:
            w.view(torch.int32).amax()  # NOTE: int32 lanes: the cheapest full pass over the bytes (bf16 sums convert)

    projection_weights = [w for ws in layers.weights for w in (ws[0], ws[1], ws[3], ws[4])]
    results = {"decode_routes": llm.engine.runner.decode_routes}
    with torch.inference_mode():
        route.kind = route_for_rows(results["decode_routes"], 1)  # the engine's batch-1 decode route on this machine
        start = time.perf_counter()
        compiled(x)
        results["compile_s"] = time.perf_counter() - start
        results["max_abs_diff_compiled_vs_plain"] = (compiled(x).float() - plain(x).float()).abs().max().item()
        for name, fn in (("eager", layers.eager), ("plain", plain), ("compiled", compiled)):
            results[f"{name}_ms"] = [median_ms(lambda fn=fn: fn(x), args.repeats) for _ in range(2)]
        for kind in ROUTES:
            route.kind = kind  # NOTE: a route the layers lack (the loop off, the packed copies dropped) runs F.linear
            results[f"projections_{kind}_ms"] = median_ms(projections, args.repeats)
            results[f"lm_head_{kind}_ms"] = median_ms(lambda: model.compute_logits(x), args.repeats)
        results["projections_read_ms"] = median_ms(lambda: read(projection_weights), args.repeats)
        results["lm_head_read_ms"] = median_ms(lambda: read([model.lm_head.weight]), args.repeats)
        results["projections_mb"] = sum(w.numel() * w.element_size() for w in projection_weights) / 1e6
        results["attention_ms"] = median_ms(attention, args.repeats)
    llm.close()
    sha = git_sha()
    report = dict(bench="cpu_decode_layers", git_sha=sha, dtype=args.dtype, keys=args.keys,
                  torch_threads=torch.get_num_threads(), **results)  # fmt: skip
    print(json.dumps(report, indent=1))
    out = args.out or Path(__file__).parent / "results" / f"cpu_decode_layers_{sha}_{args.dtype}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
