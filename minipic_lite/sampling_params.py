"""How one request is sampled and when it stops (vLLM's names; its defaults but `max_tokens`: 64, not 16)."""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, replace


class RequestOutputKind(enum.IntEnum):
    """What a streamed output holds (vLLM's): everything so far, what is new since the last output, or nothing until
    the final one. `generate()` returns final outputs whatever the kind."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled and when it stops; every field is checked here (a bad one is a ValueError or
    TypeError naming it).

    Args:
        max_tokens: new tokens at most (default 64; vLLM's is 16). A request also stops at the model's context.
        temperature: 0 (or below vLLM's 1e-5) is greedy (default 1.0).
        top_k: keep the k most likely tokens; 0 or vLLM's -1: no cut (default 0).
        top_p: nucleus sampling, in (0, 1] (default 1.0: no cut).
        min_p: drop tokens less likely than min_p times the most likely one, in [0, 1] (default 0: no cut).
        repetition_penalty: > 0; a token already in the prompt or the output has its logit divided by it where
            positive, multiplied where negative (HF's and vLLM's rule; default 1.0: none; > 1 discourages repeats).
        presence_penalty: subtracted from the logit of every token already in the output, in [-2, 2] (default 0).
        frequency_penalty: subtracted from a token's logit once per time it is already in the output, in [-2, 2]
            (default 0). The three penalties apply to greedy rows too, before temperature (vLLM's order).
        logit_bias: {token id: bias in [-100, 100]} added to those tokens' logits before anything else (OpenAI's and
            vLLM's; -100 all but bans a token, 100 all but forces it); kept as sorted (id, bias) pairs.
        allowed_token_ids: only these tokens may be drawn (vLLM's); None (default): any.
        seed: a per-request seed (a 64-bit integer) for reproducible sampling; None: torch's global generator.
        logprobs: None (default): none; k in [0, 20]: each output token's log-probability, its rank and the k most
            likely tokens' (vLLM's raw logprobs: the model's distribution, before penalties and temperature).
        prompt_logprobs: None (default): none; k in [0, 20]: each prompt token's log-probability given the ones
            before it, its rank and the k most likely tokens there (vLLM's; the first token has none). The request
            then computes its whole prompt: it reads nothing from the prefix cache.
        min_tokens: new tokens before the request may stop (default 0): until then its end-of-sequence and stop
            tokens cannot be sampled and stop strings are not looked for (vLLM's; HF's `min_new_tokens`).
        stop: strings to stop before (one string is one stop); the stop is not part of the text.
        include_stop_str_in_output: end the text with the stop string it stopped at (default False).
        stop_token_ids: token ids to stop at, besides the model's end-of-sequence.
        ignore_eos: generate `max_tokens` whatever the model says (default False).
        skip_special_tokens: leave special tokens out of the text (default True).
        detokenize: False gives token ids only (text stays ""), e.g. for a model without a tokenizer.
        n: how many completions of the prompt to sample (default 1), each on its own (vLLM's parallel sampling: with
            a seed, completion i draws with seed + i); they share the prompt's cached blocks.
        truncate_prompt_tokens: None (default): a prompt must fit the context; k >= 1: keep the prompt's last k
            tokens (vLLM's left truncation); -1: as many as fit (the model's context less one token to generate).
        bad_words: words that may not be generated (vLLM's): each word, and the word after a space, as the
            tokenizer spells them; a word's last token is blocked where the output ends with its tokens before it.
        bad_words_token_ids: token sequences blocked as `bad_words`' are (each a non-empty sequence of token ids);
            the engine adds the words' own, spelled by the model's tokenizer.
        output_kind: a stream's outputs (`stream()`, `AsyncLLM.generate`): `RequestOutputKind.CUMULATIVE` (default)
            the text, tokens and logprobs so far; `DELTA` only what is new since the output before (the prompt's
            logprobs in the first); `FINAL_ONLY` the final output alone.
    """

    max_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k cut (-1, vLLM's older spelling, is taken as 0)
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    min_tokens: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)
    include_stop_str_in_output: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True  # False: token ids only (text stays ""), e.g. for models without a tokenizer
    n: int = 1  # NOTE: last, not first as in vLLM, so that a positional max_tokens keeps its place
    truncate_prompt_tokens: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    bad_words: tuple[str, ...] | None = None
    bad_words_token_ids: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self):
        for name in ("ignore_eos", "skip_special_tokens", "detokenize", "include_stop_str_in_output"):
            object.__setattr__(self, name, _switch(name, getattr(self, name)))
        stop = () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else self.stop  # None: none
        object.__setattr__(self, "stop", _sequence("stop", stop))
        stop_ids = () if self.stop_token_ids is None else self.stop_token_ids
        object.__setattr__(self, "stop_token_ids", _sequence("stop_token_ids", stop_ids))
        object.__setattr__(self, "max_tokens", _integer("max_tokens", self.max_tokens, "an integer >= 1"))
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        for name in NUMBER_FIELDS:  # NOTE: a string from a form would fail below with a message naming none
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        top_k = _integer("top_k", self.top_k, "an integer >= 0 (0 or -1 disables it)")
        if top_k < -1:
            raise ValueError(f"top_k must be an integer >= 0 (0 or -1 disables it), got {top_k!r}")
        object.__setattr__(self, "top_k", max(top_k, 0))  # NOTE: vLLM code passes -1 for "no cut"; the sampler reads 0
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not 0.0 < self.repetition_penalty < math.inf:
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)!r}")
        if self.logit_bias is not None:
            object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if self.allowed_token_ids is not None:
            allowed = tuple(
                _token_id("allowed_token_ids", t) for t in _sequence("allowed_token_ids", self.allowed_token_ids)
            )
            if not allowed:
                raise ValueError("allowed_token_ids must name at least one token (None: any)")
            object.__setattr__(self, "allowed_token_ids", allowed)
        object.__setattr__(self, "min_tokens", _integer("min_tokens", self.min_tokens, "an integer >= 0"))
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        object.__setattr__(self, "n", _integer("n", self.n, "an integer >= 1"))
        if self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if self.seed is not None:
            object.__setattr__(self, "seed", _integer("seed", self.seed, "an int or None"))
            if not SEED_MIN <= self.seed <= SEED_MAX:  # NOTE: past these torch.Generator fails inside the step
                raise ValueError(f"seed must lie in [-2**63, 2**64 - 1] (a 64-bit seed), got {self.seed!r}")
            if self.seed + self.n - 1 > SEED_MAX:  # completion i draws with seed + i
                raise ValueError(f"seed + n - 1 must be at most 2**64 - 1 (completion i draws with seed + i), "
                                 f"got seed {self.seed!r} and n {self.n!r}")  # fmt: skip
        if not isinstance(self.output_kind, RequestOutputKind):
            kinds = ", ".join(kind.name for kind in RequestOutputKind)
            raise TypeError(f"output_kind must be a RequestOutputKind ({kinds}), got {self.output_kind!r}")
        if self.bad_words is not None:
            words = _sequence("bad_words", (self.bad_words,) if isinstance(self.bad_words, str) else self.bad_words)
            if not words or any(not isinstance(w, str) or not w.strip() for w in words):
                raise ValueError(f"bad_words must be non-empty words (or None), got {self.bad_words!r}")
            object.__setattr__(self, "bad_words", words)
        if self.bad_words_token_ids is not None:
            sequences = tuple(
                tuple(_token_id("bad_words_token_ids", t) for t in _sequence("bad_words_token_ids", seq))
                for seq in _sequence("bad_words_token_ids", self.bad_words_token_ids)
            )
            if any(not seq for seq in sequences):
                raise ValueError("bad_words_token_ids must hold non-empty sequences of token ids")
            object.__setattr__(self, "bad_words_token_ids", sequences)
        if self.truncate_prompt_tokens is not None:
            keep = _integer("truncate_prompt_tokens", self.truncate_prompt_tokens, "an int or None")
            if keep < 1 and keep != -1:
                raise ValueError(f"truncate_prompt_tokens must be None, -1 or an integer >= 1, got {keep!r}")
            object.__setattr__(self, "truncate_prompt_tokens", keep)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, value := _integer(name, value, "an int or None"))
                if not 0 <= value <= MAX_LOGPROBS:
                    raise ValueError(f"{name} must be None or in [0, {MAX_LOGPROBS}], got {value!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True")
        if any(isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def is_greedy(self) -> bool:
        """Temperature 0, or so near it that dividing by it would overflow: the argmax (vLLM's eps)."""
        return self.temperature < GREEDY_TEMPERATURE

    def child(self, index: int) -> SamplingParams:
        """The params of completion `index` of n (vLLM's parallel sampling): one completion, with seed + index where
        a seed is set. The first alone scores the prompt (`prompt_logprobs`): the others may then read it cached."""
        seed = None if self.seed is None else self.seed + index
        return replace(self, n=1, seed=seed, prompt_logprobs=self.prompt_logprobs if index == 0 else None)

    @property
    def has_token_rules(self) -> bool:
        """A logit bias or an allowed set: the sampler edits those rows' logits first."""
        return self.logit_bias is not None or self.allowed_token_ids is not None

    @property
    def has_penalties(self) -> bool:
        """A repetition, presence or frequency penalty: the sampler then counts the tokens each row has seen."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


NUMBER_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes
MAX_LOGPROBS = 20  # vLLM's default max_logprobs
# NOTE: vLLM's _SAMPLING_EPS: below it a row takes the argmax (near 0 logits / temperature overflow float32: at 1e-38
# every logit was inf, the softmax NaN, and token 0 was drawn for every seed)
GREEDY_TEMPERATURE = 1e-5


def _sequence(name: str, value) -> tuple:
    """`value`'s items as a tuple (any iterable but a mapping or text: a dict's keys or a string's characters would
    pass for its items); anything else is a TypeError naming `name`."""
    if isinstance(value, Mapping | str | bytes):
        raise TypeError(f"{name} must be a sequence (or None), got {type(value).__name__}")
    try:
        return tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be a sequence (or None), got {type(value).__name__}") from None


def _token_id(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise TypeError(f"{name} must hold non-negative int token ids, got {value!r}")
    return int(value)


def _logit_bias(value) -> tuple[tuple[int, float], ...]:
    """{token id: bias} (or (id, bias) pairs) as sorted pairs, each bias a finite number in [-100, 100]."""
    items = value.items() if isinstance(value, Mapping) else _sequence("logit_bias", value)
    pairs = {}
    for item in items:
        try:
            token, bias = item
        except (TypeError, ValueError):
            raise TypeError(f"logit_bias must map token ids to biases, got {value!r}") from None
        if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not -100 <= bias <= 100:
            raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {bias!r} for token {token!r}")
        pairs[_token_id("logit_bias", token)] = float(bias)
    return tuple(sorted(pairs.items()))


def _switch(name: str, value) -> bool:
    """`value` as a bool (numpy's too); anything else is a TypeError naming `name` (`"false"` would be truthy)."""
    kind = type(value)
    is_numpy_bool = kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool")  # numpy 2 names it bool
    if not isinstance(value, bool) and not is_numpy_bool:
        raise TypeError(f"{name} must be a bool, got {kind.__name__}")
    return bool(value)


def _integer(name: str, value, expected: str) -> int:
    """`value` as a Python int (numpy's integers too); a bool, a float or a string is a TypeError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
    return int(value)
