"""Prompt logprobs (`SamplingParams.prompt_logprobs`, vLLM's): how likely the model found each prompt token given the
ones before it, with the k likeliest tokens there, the way a perplexity or an eval harness's loglikelihood reads them.

Token i's entry comes from the logits at position i - 1, so every prompt position but the last must be computed: a
request asking for them reads nothing from the prefix cache (nor a hybrid's checkpoints; what it computes is
published as usual). The positions of a step's chunks map to rows of the model's hidden states:

    step's hidden rows:  [ req A: positions 0..63 | req B: 200..263 | ... ]     (A asks, B does not)
    A's targets:           tokens 1..64  -> A's entries 1..64 (entry 0, the first token's, is None)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from minipic_lite.chunks import SchedulerOutput
from minipic_lite.request import Request
from minipic_lite.sampler import token_logprobs

# NOTE: the logits turned from hidden rows at once, at most: 256 rows of a 152k vocabulary, 800 of SmolLM2's 49k (a
# 2,048-token step's 2,047 rows of logits took 0.55 s on 2 Intel Xeon cores in 256-row matmuls, 0.46 s in 1,024-row
# ones)
LOGITS_PASS_BYTES = 160 << 20


@dataclass
class PromptScoring:
    """A step's prompt positions whose next prompt token is scored, by request."""

    requests: list[tuple[Request, list[int]]]  # each request asking and the prompt positions it gets entries for
    hidden_rows: list[int]  # the rows of the step's hidden states that score them, in the same order
    targets: list[int]  # the prompt token each row scores
    k: int  # the most top tokens a request asks for
    rows: torch.Tensor | None = None  # (len(targets), 2 + 2k) float32 on the host, `sampler.token_logprobs`' rows


def plan_scoring(out: SchedulerOutput) -> PromptScoring | None:
    """The scoring of the step's chunks of requests asking for prompt logprobs; None where none asks."""
    requests, hidden_rows, targets, k, offset = [], [], [], 0, 0
    for s in out.scheduled:
        req, num_prompt = s.seq, s.seq.num_prompt_tokens
        asked = req.sampling_params.prompt_logprobs
        if asked is not None:
            positions = []
            for start, end in s.query_ranges:
                # NOTE: hidden row offset + j - start scores token j + 1 (a preempted request's outputs need none)
                last = min(end, num_prompt - 1)
                positions += range(start + 1, last + 1)
                hidden_rows += range(offset, offset + max(0, last - start))
                offset += end - start
            if positions:
                requests.append((req, positions))
                targets += (req.token_ids[p] for p in positions)
                k = max(k, asked)
        else:
            offset += s.num_query_tokens
    return PromptScoring(requests, hidden_rows, targets, k) if requests else None


def score(
    scoring: PromptScoring, hidden: torch.Tensor, compute_logits: Callable[[torch.Tensor], torch.Tensor], vocab: int
):
    """Fill `scoring.rows` from the step's hidden states, `LOGITS_PASS_BYTES` of float32 logits at a time (copied to
    the host: a host sync, once per step of a request asking)."""
    device = hidden.device
    index = torch.tensor(scoring.hidden_rows, dtype=torch.long, device=device)
    targets = torch.tensor(scoring.targets, dtype=torch.long, device=device)
    parts, rows_per_pass = [], max(1, LOGITS_PASS_BYTES // (4 * vocab))
    for start in range(0, len(index), rows_per_pass):
        rows = slice(start, start + rows_per_pass)
        parts.append(token_logprobs(compute_logits(hidden[index[rows]]), targets[rows], scoring.k))
    scoring.rows = torch.cat(parts).cpu()
