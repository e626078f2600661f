"""Sampling on the device with no host sync: greedy, temperature, top-k, top-p and per-request seeds.

Sampling from softmax(l) is argmax(softmax(l) / E) with E ~ Exponential(1) (the "exponential race" form of
the Gumbel-max trick): one elementwise op and an argmax, no multinomial and no `.item()`.
"""

from __future__ import annotations

import torch

from minipic_lite.sampling_params import SamplingParams


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) what falls outside each row's top-k and top-p nucleus. logits [N, V], top_k/top_p [N]."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (N, V)
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)  # (N,)
    ranks = torch.arange(vocab, device=logits.device)  # (V,)
    drop = ranks[None, :] >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # NOTE: keep a token while the mass *before* it is < top_p, so the top token always survives.
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class Sampler:
    def __init__(self, device: torch.device):
        self.device = device
        self.generators: dict[int, torch.Generator] = {}

    def forget(self, seq_id: int) -> None:
        self.generators.pop(seq_id, None)

    def _noise(self, shape, seq_ids: list[int], params: list[SamplingParams]) -> torch.Tensor:
        noise = torch.empty(shape, device=self.device).exponential_()  # (N, V)
        for row, (seq_id, p) in enumerate(zip(seq_ids, params, strict=True)):
            if p.seed is not None and not p.is_greedy:
                gen = self.generators.get(seq_id)
                if gen is None:
                    gen = self.generators[seq_id] = torch.Generator(self.device).manual_seed(p.seed)
                noise[row].exponential_(generator=gen)
        return noise

    def __call__(self, logits: torch.Tensor, seq_ids: list[int], params: list[SamplingParams]) -> torch.Tensor:
        """logits [N, V] float32 -> token ids [N] (on the device)."""
        greedy_tokens = logits.argmax(dim=-1)
        if all(p.is_greedy for p in params):
            return greedy_tokens
        temperature = torch.tensor([p.temperature or 1.0 for p in params], device=self.device)
        logits = logits / temperature[:, None]
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            top_k = torch.tensor([p.top_k for p in params], device=self.device)
            top_p = torch.tensor([p.top_p for p in params], device=self.device)
            logits = apply_top_k_top_p(logits, top_k, top_p)
        probs = logits.softmax(dim=-1)
        sampled = (probs / self._noise(probs.shape, seq_ids, params)).argmax(dim=-1)
        is_greedy = torch.tensor([p.is_greedy for p in params], device=self.device)
        return torch.where(is_greedy, greedy_tokens, sampled)
