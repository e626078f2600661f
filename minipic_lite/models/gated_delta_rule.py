"""The gated delta rule of Gated DeltaNet layers: a plain recurrent reference and a chunked torch path.

Per head, with a state S of [k_dim, v_dim], decay g_t (log space, <= 0) and learning rate β_t, token t does

    S ← exp(g_t) · S
    S ← S + β_t · k_t (v_t − Sᵀk_t)ᵀ          (the delta rule: move S's answer for k_t towards v_t)
    o_t = Sᵀ q_t

q and k are L2-normalised and q is scaled by k_dim^-1/2 first (`prepare_qk`). All math is float32, and the
state stays float32 whatever the model dtype.

Chunked form (what `chunk_gated_delta_rule` computes, CHUNK_SIZE tokens at a time). Within a chunk, with
c_t = Σ_{j≤t} g_j and Γ_t = exp(c_t) relative to the chunk's start state S_0, the new values U solve a unit
lower-triangular system (the WY representation):

    (I + A) U = diag(β) (V − diag(Γ) K S_0),      A[t, j] = β_t exp(c_t − c_j) k_tᵀk_j  for j < t
    O = diag(Γ) Q S_0 + (Q Kᵀ ⊙ exp(c_t − c_j) ⊙ [j ≤ t]) U
    S_C = Γ_C S_0 + Kᵀ diag(exp(c_C − c_j)) U

Chunks restart at every call, so two runs that cut a sequence at the same places compute the same floats:
that is what makes a resumed prefill bit-identical to an uninterrupted one whose engine chunks ended there.
On CUDA, `fla`'s kernels (flash-linear-attention) are used when installed (models/qwen3_5.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64
L2_NORM_EPS = 1e-6  # as fla and transformers


def l2norm(x: torch.Tensor, eps: float = L2_NORM_EPS) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def prepare_qk(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32, L2-normalised q and k; q scaled by k_dim^-1/2."""
    q, k = l2norm(q.float()), l2norm(k.float())
    return q * q.shape[-1] ** -0.5, k


def recurrent_gated_delta_rule_ref(q, k, v, g, beta, state):
    """The plain loop. q, k: [T, H, Dk]; v: [T, H, Dv]; g, beta: [T, H]; state: [H, Dk, Dv] (not modified).

    q and k must already be prepared (`prepare_qk`). Returns (o [T, H, Dv] float32, final state).
    """
    state = state.float().clone()
    out = []
    for t in range(q.shape[0]):
        state = state * g[t].float().exp()[:, None, None]  # (H, Dk, Dv)
        kv_mem = torch.einsum("hk,hkv->hv", k[t], state)  # (H, Dv)
        delta = (v[t].float() - kv_mem) * beta[t].float()[:, None]  # (H, Dv)
        state = state + k[t][:, :, None] * delta[:, None, :]
        out.append(torch.einsum("hk,hkv->hv", q[t], state))
    return torch.stack(out), state


def recurrent_step(q, k, v, g, beta, state):
    """One token for each of S sequences at once (decode). q, k: [S, H, Dk]; v: [S, H, Dv]; g, beta: [S, H];
    state: [S, H, Dk, Dv] float32 (not modified). Returns (o [S, H, Dv], new state)."""
    state = state * g.float().exp()[..., None, None]
    kv_mem = torch.einsum("shk,shkv->shv", k, state)
    delta = (v.float() - kv_mem) * beta.float()[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return torch.einsum("shk,shkv->shv", q, state), state


def chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size: int = CHUNK_SIZE):
    """Same contract as `recurrent_gated_delta_rule_ref`, CHUNK_SIZE tokens per matrix step."""
    num_tokens = q.shape[0]
    pad = (-num_tokens) % chunk_size
    # NOTE: padded tokens have k = 0 and g = 0: they leave the state as it is.
    q, k, v = (F.pad(x.float(), (0, 0, 0, 0, 0, pad)).transpose(0, 1) for x in (q, k, v))  # (H, T', D)
    g, beta = (F.pad(x.float(), (0, 0, 0, pad)).transpose(0, 1) for x in (g, beta))  # (H, T')
    num_heads, padded = q.shape[:2]
    shape = (num_heads, padded // chunk_size, chunk_size)
    q, k, v = (x.reshape(*shape, x.shape[-1]) for x in (q, k, v))  # (H, N, C, D)
    c, beta = g.reshape(shape).cumsum(-1), beta.reshape(shape)  # (H, N, C)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    # exp(c_t − c_j) on and below the diagonal, 0 above (masked before exp: above it the exponent is > 0)
    decay = torch.where(causal, c[..., :, None] - c[..., None, :], -torch.inf).exp()  # (H, N, C, C)
    k_beta = k * beta[..., None]
    strict = (k_beta @ k.transpose(-1, -2)) * decay
    eye = torch.eye(chunk_size, device=q.device)
    wy = torch.linalg.solve_triangular(eye + strict.tril(-1), eye.expand_as(strict), upper=False, unitriangular=True)
    u_v = wy @ (v * beta[..., None])  # (H, N, C, Dv): the V part of U
    u_s = wy @ (k_beta * c.exp()[..., None])  # (H, N, C, Dk): U's dependence on S_0
    qk = (q @ k.transpose(-1, -2)) * decay  # (H, N, C, C)
    state = state.float()
    out = torch.empty_like(u_v)
    for n in range(shape[1]):
        u = u_v[:, n] - u_s[:, n] @ state  # (H, C, Dv)
        out[:, n] = (q[:, n] * c[:, n, :, None].exp()) @ state + qk[:, n] @ u
        last = c[:, n, -1:]  # (H, 1)
        state = state * last.exp()[..., None] + (k[:, n] * (last - c[:, n]).exp()[..., None]).transpose(-1, -2) @ u
    out = out.reshape(num_heads, padded, -1)[:, :num_tokens].transpose(0, 1)  # (T, H, Dv)
    return out, state
