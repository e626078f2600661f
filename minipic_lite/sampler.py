"""Sampling on the device with no host sync: greedy, temperature, top-k, top-p and per-request seeds.

Sampling from softmax(l) is argmax(softmax(l) / E) with E ~ Exponential(1) (the "exponential race" form of
the Gumbel-max trick): one elementwise op and an argmax, no multinomial and no `.item()`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minipic_lite.sampling_params import SamplingParams

ARGMAX_GROUP = 256  # logits per group in `argmax_rows`' first pass (at most; a power of two dividing the vocab)
MIN_ARGMAX_GROUP = 32  # ... below this the vocab is read in one pass, as torch.argmax does
TOP_K_CAP = 2**31 - 1  # top_k past any vocabulary cuts nothing: larger ones are capped to fit a long


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [N, V] -> [N]: torch.argmax over the last dim (the first index of the maximum; NaN counts as the
    maximum), in two passes. torch reduces each row in one thread block, so one row of a 128k vocabulary took 27 µs
    on the H200 at batch 1; here the first pass takes the max of each group of ARGMAX_GROUP logits across the GPU,
    the second the first group holding the row's max, and its index within that group says the rest."""
    num_rows, vocab = logits.shape
    width = min(vocab & -vocab, ARGMAX_GROUP)  # the largest power of two dividing the vocab, capped
    if width < MIN_ARGMAX_GROUP:
        return logits.argmax(dim=-1)
    group_max, index_in_group = logits.reshape(num_rows, vocab // width, width).max(dim=-1)  # (N, G) each
    group = group_max.argmax(dim=-1, keepdim=True)  # (N, 1): the first group that holds the maximum
    return (group * width + index_in_group.gather(-1, group)).squeeze(-1)  # (N,)


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


@dataclass(slots=True)
class SamplingBatch:
    """Per-row sampling parameters as device tensors, built once per step or burst (no host sync)."""

    request_ids: list[str]
    params: list[SamplingParams]
    is_all_greedy: bool
    temperature: torch.Tensor | None = None  # (N,)
    top_k: torch.Tensor | None = None  # (N,), None: no row cuts
    top_p: torch.Tensor | None = None  # (N,)
    is_greedy: torch.Tensor | None = None  # (N,) bool


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype)
    # NOTE: a plain copy from pageable memory would wait for the GPU: inside a burst that drains the queue.
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


class Sampler:
    def __init__(self, device: torch.device):
        self.device = device
        self.generators: dict[int, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

    def prepare(self, request_ids: list[str], params: list[SamplingParams]) -> SamplingBatch:
        batch = SamplingBatch(request_ids, params, all(p.is_greedy for p in params))
        if batch.is_all_greedy:
            return batch
        dev = self.device
        batch.temperature = _to_device([1.0 if p.is_greedy else p.temperature for p in params], torch.float32, dev)
        batch.is_greedy = _to_device([p.is_greedy for p in params], torch.bool, dev)
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            batch.top_k = _to_device([min(p.top_k, TOP_K_CAP) for p in params], torch.long, dev)
            batch.top_p = _to_device([p.top_p for p in params], torch.float32, dev)
        return batch

    def _noise(self, shape, batch: SamplingBatch) -> torch.Tensor:
        noise = torch.empty(shape, device=self.device).exponential_()  # (N, V)
        for row, (request_id, p) in enumerate(zip(batch.request_ids, batch.params, strict=True)):
            if p.seed is not None and not p.is_greedy:
                gen = self.generators.get(request_id)
                if gen is None:
                    gen = self.generators[request_id] = torch.Generator(self.device).manual_seed(p.seed)
                noise[row].exponential_(generator=gen)
        return noise

    def __call__(
        self, logits: torch.Tensor, batch: SamplingBatch, greedy_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """logits [N, V] (any float dtype; sampling runs in float32) -> token ids [N] (on the device).
        `greedy_tokens` [N]: their argmax where the caller has it (a CUDA graph computes it with the logits)."""
        if greedy_tokens is None:
            greedy_tokens = argmax_rows(logits)
        if batch.is_all_greedy:
            return greedy_tokens
        logits = logits.float() / batch.temperature[:, None]
        if batch.top_k is not None:
            logits = apply_top_k_top_p(logits, batch.top_k, batch.top_p)
        probs = logits.softmax(dim=-1)
        sampled = argmax_rows(probs / self._noise(probs.shape, batch))
        return torch.where(batch.is_greedy, greedy_tokens, sampled)
