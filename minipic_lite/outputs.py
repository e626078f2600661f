"""What a request gives back (vLLM's shape)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """A request's timings: `time.perf_counter()` seconds (`ttft`, `total_time`: seconds from its arrival, which is
    the call that made it: the prompt's encoding and checks are in them)."""

    arrival_time: float
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        """Time to first token, seconds."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def total_time(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass(frozen=True, slots=True)
class Logprob:
    """A token's log-probability under the model (vLLM's shape): its rank among the vocabulary (1: the likeliest),
    its text alone (None without a tokenizer or with `detokenize=False`)."""

    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One completion of a request (vLLM's CompletionOutput): completion `index` of `SamplingParams.n`."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One request's output so far (vLLM's RequestOutput): `outputs` holds its completions (`SamplingParams.n`, 1
    by default), and the first one's fields are flattened in (`text`, `token_ids`, ...: everything generated yet);
    `finished` is True on the last output, once every completion has finished."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    num_cached_tokens: int
    finished: bool
    finish_reason: str | None  # "stop" (EOS, stop token or stop string), "length", "abort"
    metrics: RequestMetrics
    stop_reason: str | int | None = None  # the stop string or token that ended it
    cache_report: Sequence = field(default_factory=list)  # a cache_report.CacheReport once admitted
    state_report: object = None  # hybrid models: a cache_report.StateReport
    # SamplingParams.logprobs set: a dict per output token, the sampled token's entry first, then the top ones
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None  # the sum of the sampled tokens' logprobs
    outputs: list[CompletionOutput] = field(default_factory=list)  # empty: the flattened fields' one completion
    # SamplingParams.prompt_logprobs set: a dict per prompt token (None for the first), its own entry first
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    def __post_init__(self):
        if not self.outputs:
            self.outputs = [
                CompletionOutput(0, self.text, self.token_ids, self.cumulative_logprob, self.logprobs,
                                 self.finish_reason, self.stop_reason)
            ]  # fmt: skip
