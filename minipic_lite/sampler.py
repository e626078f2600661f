"""Sampling on the device with no host sync: allowed tokens, logit bias, bad words, min_tokens, penalties, greedy,
temperature, top-k, top-p, min-p and per-request seeds, in HF's order (the allowed set, the bias, the bad words and
the stop tokens blocked and the penalties on the raw logits, then temperature, top-k, top-p, min-p).

Sampling from softmax(l) is argmax(softmax(l) / E) with E ~ Exponential(1) (the "exponential race" form of
the Gumbel-max trick): one elementwise op and an argmax, no multinomial and no `.item()`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minipic_lite.sampling_params import SamplingParams

ARGMAX_GROUP = 256  # logits per group in `argmax_rows`' first pass (at most; a power of two dividing the vocab)
MIN_ARGMAX_GROUP = 32  # ... below this the vocab is read in one pass, as torch.argmax does
# NOTE: rows of float32 logprobs `token_logprobs` takes at once on the CPU: 21 of SmolLM2's 49k vocabulary. 4,096 rows
# took 0.78 s in 256-row passes, 0.27-0.35 s in tiles of 8-32 rows, on 2 Intel Xeon cores
CPU_TILE_BYTES = 4 << 20
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


def apply_penalties(
    logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    output_counts: torch.Tensor,
    repetition: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
) -> torch.Tensor:
    """vLLM's penalties. logits [N, V] float32; prompt_mask [N, V] bool (the prompt's tokens); output_counts [N, V]
    float32 (how often each token is in the output so far); the penalties [N].

    The repetition penalty divides the logit of every token seen (prompt or output) where positive and multiplies
    it where negative (HF's `RepetitionPenaltyLogitsProcessor`); then, over the output alone, OpenAI's
    `logit - frequency * count - presence * (count > 0)`. A row of neutral penalties (1, 0, 0) is left as it is."""
    seen = prompt_mask | (output_counts > 0)
    rep = repetition[:, None]
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    return logits - frequency[:, None] * output_counts - presence[:, None] * (output_counts > 0)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) each row's tokens less likely than min_p [N] times its most likely one (HF's `MinPLogitsWarper`
    with one token kept at least: the most likely always passes). logits [N, V] float32, temperature applied."""
    probs = logits.softmax(dim=-1)
    drop = probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(drop, float("-inf"))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's sampled token and its k likeliest, as float32 [N, 2 + 2k]: the sampled token's logprob and rank,
    then the k top ids, then their logprobs (one tensor: one copy to the host). logits [N, V], the model's own (vLLM's
    raw logprobs); the rank counts the tokens at least as likely (vLLM's: 1 for the argmax).

    On the CPU the rows go a few at a time (`CPU_TILE_BYTES` of logprobs), so that the three passes over them (the
    log-softmax, the rank's count, the top k) read a core's cache instead of memory."""
    rows = len(logits)
    if logits.device.type == "cpu":
        rows = max(1, CPU_TILE_BYTES // (4 * logits.shape[-1]))
    if rows < len(logits):
        tiles = zip(logits.split(rows), tokens.split(rows), strict=True)
        return torch.cat([_token_logprobs(x, t, k) for x, t in tiles])
    return _token_logprobs(logits, tokens, k)


def _token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    logprobs = logits.float().log_softmax(dim=-1)  # (N, V)
    chosen = logprobs.gather(1, tokens[:, None])  # (N, 1)
    # NOTE: counted as bytes into int32: a bool sum (int64) took 0.75 s a 4,096 rows of SmolLM2's vocabulary on 2 CPU
    # cores, this 0.42 s
    rank = (logprobs >= chosen).view(torch.uint8).sum(dim=-1, keepdim=True, dtype=torch.int32).float()  # (N, 1)
    top_logprobs, top_ids = logprobs.topk(k, dim=-1)  # (N, k) each
    return torch.cat([chosen, rank, top_ids.float(), top_logprobs], dim=-1)


@dataclass(slots=True)
class Penalties:
    """The tokens each row has seen, as device tensors; `output_counts` grows on the device as the row samples (a
    burst's later steps and a continuation see their own tokens with no host sync)."""

    prompt_mask: torch.Tensor  # (N, V) bool
    output_counts: torch.Tensor  # (N, V) float32
    repetition: torch.Tensor  # (N,)
    presence: torch.Tensor  # (N,)
    frequency: torch.Tensor  # (N,)

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        histories: list[tuple[list[int], int]],
        vocab: int,
        device,
        prompt_mask: torch.Tensor | None = None,
    ):
        """histories: each row's token ids and how many of them are its prompt. The penalized rows' tokens go to the
        device as (row, token) pairs in one copy and are scattered there: host work by tokens, not by rows x vocab.
        `prompt_mask` (N, V) bool: the prompts' tokens where the caller keeps them (`Sampler`: a request's row is
        built once), else built here from `histories` too."""
        pairs = ([], [], [], [])  # prompt rows, prompt tokens, output rows, output tokens
        for row, (p, (token_ids, num_prompt)) in enumerate(zip(params, histories, strict=True)):
            if p.has_penalties:  # NOTE: a neutral row's tokens change nothing: they are not counted
                if prompt_mask is None:
                    pairs[0].extend([row] * num_prompt)
                    pairs[1].extend(token_ids[:num_prompt])
                pairs[2].extend([row] * (len(token_ids) - num_prompt))
                pairs[3].extend(token_ids[num_prompt:])
        flat = _to_device([x for part in pairs for x in part], torch.long, device)
        prompt_rows, prompt_ids, output_rows, output_ids = flat.split([len(part) for part in pairs])
        if prompt_mask is None:
            prompt_mask = torch.zeros(len(params), vocab, dtype=torch.bool, device=device)
            prompt_mask[prompt_rows, prompt_ids] = True
        output_counts = torch.zeros(len(params), vocab, dtype=torch.float32, device=device)
        output_counts.index_put_((output_rows, output_ids), torch.ones_like(output_ids, dtype=torch.float32),
                                 accumulate=True)  # fmt: skip
        return cls(
            prompt_mask,
            output_counts,
            _to_device([p.repetition_penalty for p in params], torch.float32, device),
            _to_device([p.presence_penalty for p in params], torch.float32, device),
            _to_device([p.frequency_penalty for p in params], torch.float32, device),
        )

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return apply_penalties(
            logits, self.prompt_mask, self.output_counts, self.repetition, self.presence, self.frequency
        )

    def count(self, tokens: torch.Tensor) -> None:
        """Add the tokens just sampled [N] to the rows' output counts (on the device)."""
        self.output_counts.scatter_add_(1, tokens[:, None], torch.ones_like(self.output_counts[:, :1]))


@dataclass(slots=True)
class TokenRules:
    """Each row's `allowed_token_ids` (every other token's logit -inf) and `logit_bias` (added to its tokens'
    logits), as device tensors built once per step or burst."""

    allowed: torch.Tensor | None  # (N, V) bool, True everywhere in rows without a set; None: no row has one
    rows: torch.Tensor  # (P,) long: the (row, token, bias) triples of the rows' logit biases
    tokens: torch.Tensor  # (P,) long
    biases: torch.Tensor  # (P,) float32

    @classmethod
    def build(cls, params: list[SamplingParams], vocab: int, device):
        rows, tokens, biases, allowed_rows, allowed_ids = [], [], [], [], []
        for row, p in enumerate(params):
            for token, bias in p.logit_bias or ():
                rows.append(row)
                tokens.append(token)
                biases.append(bias)
            if p.allowed_token_ids is not None:
                allowed_rows += [row] * len(p.allowed_token_ids)
                allowed_ids += p.allowed_token_ids
        flat = _to_device(rows + tokens + allowed_rows + allowed_ids, torch.long, device)
        rows_t, tokens_t, allowed_rows_t, allowed_ids_t = flat.split([len(rows), len(tokens), len(allowed_rows),
                                                                      len(allowed_ids)])  # fmt: skip
        allowed = None
        if allowed_ids:
            anything = _to_device([p.allowed_token_ids is None for p in params], torch.bool, device)  # rows without one
            allowed = anything[:, None].repeat(1, vocab)
            allowed[allowed_rows_t, allowed_ids_t] = True
        return cls(allowed, rows_t, tokens_t, _to_device(biases, torch.float32, device))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [N, V] with each row's rules applied: a new float32 tensor (a graph's output buffer stays)."""
        logits = logits.float()
        if self.allowed is not None:
            logits = logits.masked_fill(~self.allowed, -math.inf)
        return logits.index_put((self.rows, self.tokens), self.biases, accumulate=True)


@dataclass(slots=True)
class BadWords:
    """Each row's bad words (`SamplingParams.bad_words_token_ids`) as (row, word) pairs on the device: a word's last
    token gets a logit of -inf where the row's output ends with the word's tokens before it. `recent` holds each row's
    last W output tokens and takes each sample on the device (a burst's later steps need no host sync).

        word " the cat" = [279, 2644]:  prefix [-1, ..., -1, 279] (-1: any), last 2644
        recent (W = 3):  [-2, -2, 279]  (-2: before the output's start, matching no token)  ->  2644 blocked
    """

    rows: torch.Tensor  # (P,) long
    prefixes: torch.Tensor  # (P, W) long: each word's tokens before its last, right-aligned, -1 where none
    last: torch.Tensor  # (P,) long: each word's last token
    recent: torch.Tensor  # (N, W) long: each row's last W output tokens, -2 before its first

    @classmethod
    def build(cls, params: list[SamplingParams], histories: list[tuple[list[int], int]], device):
        """histories: each row's token ids and how many of them are its prompt (vLLM matches the output alone).
        One copy to the device."""
        pairs = [(row, word) for row, p in enumerate(params) for word in p.bad_words_token_ids or ()]
        width = max(len(word) for _, word in pairs) - 1
        prefixes = [[-1] * (width - len(word) + 1) + list(word[:-1]) for _, word in pairs]
        recent = [([-2] * width + token_ids[num_prompt:])[len(token_ids) - num_prompt :]
                  for token_ids, num_prompt in histories]  # fmt: skip
        flat = _to_device([row for row, _ in pairs] + [word[-1] for _, word in pairs]
                          + [t for prefix in prefixes for t in prefix] + [t for r in recent for t in r],
                          torch.long, device)  # fmt: skip
        rows, last, prefixes_t, recent_t = flat.split([len(pairs), len(pairs), len(pairs) * width, len(params) * width])
        return cls(rows, prefixes_t.view(len(pairs), width), last, recent_t.view(len(params), width))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [N, V] float32 with each word whose prefix the output ends with blocked (a new tensor)."""
        hit = ((self.recent[self.rows] == self.prefixes) | (self.prefixes == -1)).all(dim=-1)  # (P,)
        blocked = torch.where(hit, -math.inf, 0.0)
        return logits.index_put((self.rows, self.last), blocked, accumulate=True)  # NOTE: a token blocked twice

    def advance(self, tokens: torch.Tensor) -> None:
        """Take the tokens just sampled [N] into each row's recent tokens (on the device)."""
        if self.recent.shape[1]:
            self.recent.copy_(torch.cat([self.recent[:, 1:], tokens[:, None]], dim=1))


@dataclass(slots=True)
class MinTokens:
    """Rows that may not stop yet (`SamplingParams.min_tokens`): their stop tokens (end-of-sequence unless
    `ignore_eos`, and `stop_token_ids`) get a logit of -inf while `remaining` > 0, which counts down on the device at
    each sample (a burst's later steps and a continuation need no host sync)."""

    rows: torch.Tensor  # (P,) long: the (row, stop token) pairs of the rows that may not stop yet
    tokens: torch.Tensor  # (P,) long
    remaining: torch.Tensor  # (N,) long: tokens each row has still to sample before it may stop

    @classmethod
    def build(cls, params: list[SamplingParams], num_outputs: list[int], eos_token_ids: Sequence[int], device):
        """num_outputs: the tokens each row has sampled so far. One copy to the device."""
        rows, tokens = [], []
        for row, (p, num_output) in enumerate(zip(params, num_outputs, strict=True)):
            if p.min_tokens > num_output:
                stops = dict.fromkeys((*(() if p.ignore_eos else eos_token_ids), *p.stop_token_ids))
                rows += [row] * len(stops)
                tokens += stops
        remaining = [p.min_tokens - num_output for p, num_output in zip(params, num_outputs, strict=True)]
        flat = _to_device(rows + tokens + remaining, torch.long, device)
        return cls(*flat.split([len(rows), len(tokens), len(remaining)]))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [N, V] with the stop tokens of the rows that may not stop yet at -inf (a new tensor: a graph's
        output buffer stays as it is); one sample more for every row."""
        blocked = torch.where(self.remaining[self.rows] > 0, -math.inf, logits[self.rows, self.tokens])
        self.remaining.sub_(1)
        return logits.index_put((self.rows, self.tokens), blocked)


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
    min_p: torch.Tensor | None = None  # (N,), None: no row cuts
    penalties: Penalties | None = None  # None: no row has a penalty
    min_tokens: MinTokens | None = None  # None: every row may stop
    token_rules: TokenRules | None = None  # None: no row has a logit bias or an allowed set
    bad_words: BadWords | None = None  # None: no row has bad words
    num_logprobs: int | None = None  # the most top logprobs a row asks for; None: no row asks


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype)
    # NOTE: a plain copy from pageable memory would wait for the GPU: inside a burst that drains the queue.
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


def warp(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The logits a batch of sampled rows draws from (float32 [N, V]): temperature, then top-k and top-p, then
    min-p, as HF's warpers run (`LogitsProcessorList` of Temperature, TopK, TopP, MinP)."""
    logits = logits.float() / batch.temperature[:, None]
    if batch.top_k is not None:
        logits = apply_top_k_top_p(logits, batch.top_k, batch.top_p)
    if batch.min_p is not None:
        logits = apply_min_p(logits, batch.min_p)
    return logits


class Sampler:
    def __init__(self, device: torch.device):
        self.device = device
        self.generators: dict[str, torch.Generator] = {}
        self.prompt_masks: dict[str, torch.Tensor] = {}  # (V,) bool: a penalized request's prompt tokens

    def forget(self, request_id: str) -> None:
        self.generators.pop(request_id, None)
        self.prompt_masks.pop(request_id, None)

    def _prompt_mask(self, batch: SamplingBatch, histories: list[tuple[list[int], int]], vocab: int) -> torch.Tensor:
        """(N, V) bool: the penalized rows' prompt tokens, each request's row built at its first step and kept (its
        prompt never changes), so a long prompt's tokens go to the device once, not at every step."""
        rows, zeros = [], None
        for request_id, p, (token_ids, num_prompt) in zip(batch.request_ids, batch.params, histories, strict=True):
            row = self.prompt_masks.get(request_id)
            if row is None and p.has_penalties:
                row = torch.zeros(vocab, dtype=torch.bool, device=self.device)
                row[_to_device(token_ids[:num_prompt], torch.long, self.device)] = True
                self.prompt_masks[request_id] = row
            elif row is None:  # NOTE: a neutral row's tokens change nothing
                row = zeros = torch.zeros(vocab, dtype=torch.bool, device=self.device) if zeros is None else zeros
            rows.append(row)
        return torch.stack(rows)

    def prepare(
        self,
        request_ids: list[str],
        params: list[SamplingParams],
        histories: list[tuple[list[int], int]] | None = None,
        vocab: int | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> SamplingBatch:
        """The batch's parameters on the device. `histories` (each row's token ids and its prompt's length) and
        `vocab` are read where a row has a penalty, bad words or `min_tokens`, `eos_token_ids` where it has
        `min_tokens`."""
        batch = SamplingBatch(request_ids, params, all(p.is_greedy for p in params))
        if any(p.has_token_rules for p in params):
            if vocab is None:
                raise ValueError("a logit bias or an allowed set needs the vocabulary's size")
            batch.token_rules = TokenRules.build(params, vocab, self.device)
        if any(p.bad_words_token_ids for p in params):
            if histories is None:
                raise ValueError("bad words need each row's token ids")
            batch.bad_words = BadWords.build(params, histories, self.device)
        if any(p.min_tokens for p in params):
            if histories is None:
                raise ValueError("min_tokens needs each row's token ids")
            num_outputs = [len(token_ids) - num_prompt for token_ids, num_prompt in histories]
            if any(p.min_tokens > n for p, n in zip(params, num_outputs, strict=True)):
                batch.min_tokens = MinTokens.build(params, num_outputs, eos_token_ids, self.device)
        asked = [p.logprobs for p in params if p.logprobs is not None]
        batch.num_logprobs = max(asked) if asked else None
        if any(p.has_penalties for p in params):
            if histories is None or vocab is None:
                raise ValueError("a penalty needs each row's token ids and the vocabulary's size")
            prompt_mask = self._prompt_mask(batch, histories, vocab)
            batch.penalties = Penalties.build(params, histories, vocab, self.device, prompt_mask)
        if batch.is_all_greedy:
            return batch
        dev = self.device
        batch.temperature = _to_device([1.0 if p.is_greedy else p.temperature for p in params], torch.float32, dev)
        batch.is_greedy = _to_device([p.is_greedy for p in params], torch.bool, dev)
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            batch.top_k = _to_device([min(p.top_k, TOP_K_CAP) for p in params], torch.long, dev)
            batch.top_p = _to_device([p.top_p for p in params], torch.float32, dev)
        if any(p.min_p > 0 for p in params):
            batch.min_p = _to_device([p.min_p for p in params], torch.float32, dev)
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
        if batch.token_rules is not None:
            logits = batch.token_rules(logits)
            greedy_tokens = None  # NOTE: the graph's argmax was of the logits before the rules
        if batch.bad_words is not None:
            logits = batch.bad_words(logits.float())
            greedy_tokens = None  # NOTE: the graph's argmax was of the logits before the words were blocked
        if batch.min_tokens is not None:
            logits = batch.min_tokens(logits)
            greedy_tokens = None  # NOTE: the graph's argmax was of the logits before the stop tokens were blocked
        if batch.penalties is not None:
            logits = batch.penalties(logits.float())
            greedy_tokens = None  # NOTE: the graph's argmax was of the logits before the penalties
        if greedy_tokens is None:
            greedy_tokens = argmax_rows(logits)
        tokens = greedy_tokens if batch.is_all_greedy else self._sample(logits, batch, greedy_tokens)
        if batch.penalties is not None:
            batch.penalties.count(tokens)
        if batch.bad_words is not None:
            batch.bad_words.advance(tokens)
        return tokens

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch, greedy_tokens: torch.Tensor) -> torch.Tensor:
        probs = warp(logits, batch).softmax(dim=-1)
        sampled = argmax_rows(probs / self._noise(probs.shape, batch))
        return torch.where(batch.is_greedy, greedy_tokens, sampled)
