"""The public API: a thin `LLM` with vLLM's `generate()`, a streaming iterator, and module-level `generate()`.

Every call talks to one background loop that owns the engine (engine_loop.py): `generate()` and `stream()`
may run from many threads at once, each reading only its own requests' outputs.
"""

from __future__ import annotations

import functools
import queue
import re
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minipic_lite.config import (
    CHAT_TURN_START_TOKEN,
    LOOP_EXIT_WAIT_S,
    SMOLLM2_CONTROL_TOKENS,
    ControlTokens,
    EngineConfig,
    ModelConfig,
)
from minipic_lite.engine import LLMEngine, RequestIdInUse
from minipic_lite.engine_loop import EngineLoop
from minipic_lite.models.loader import load_tokenizer, resolve_model_dir
from minipic_lite.models.registry import model_class
from minipic_lite.outputs import RequestOutput
from minipic_lite.prompts import Prompt, PromptComposer, check_unicode, encode_text, first_marker, is_token_id
from minipic_lite.request import ParentRequest, Request
from minipic_lite.sampling_params import SamplingParams

# A prompt is text, token ids, a chat (a list of {"role", "content"} messages) or a composed span `Prompt`.
PromptType = str | Sequence[int] | Sequence[dict] | Prompt


def _is_chat(x) -> bool:
    return isinstance(x, list | tuple) and bool(x) and all(isinstance(m, dict) for m in x)


def _check_messages(messages) -> None:
    """Chat messages as transformers' templates read them: each a dict with a "role" and a "content" string."""
    for j, m in enumerate(messages):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f'message {j} must have a "role" and a "content" string, got {m!r}')
        check_unicode(m["content"], f"message {j}'s content")


def _is_token_ids(x) -> bool:
    """A non-empty list or tuple of integers of any kind (numpy's, torch's: what `as_token_ids` takes), no bool."""
    return isinstance(x, list | tuple) and bool(x) and all(is_token_id(t) for t in x)


def _is_single(x) -> bool:
    return isinstance(x, str | Prompt) or _is_chat(x) or _is_token_ids(x)


def check_one_prompt(prompt, method: str) -> None:
    """A streaming `method` takes one prompt: a list of prompts (vLLM's generate() habit) is a TypeError saying so,
    not token ids that are no integers."""
    if not _is_single(prompt) and isinstance(prompt, list | tuple) and prompt and all(map(_is_single, prompt)):
        count = f"{len(prompt)} prompt{'s' * (len(prompt) > 1)}"
        raise TypeError(f"{method} takes one prompt, got a list of {count}: LLM.generate() takes a batch")


def normalize_prompts(prompts) -> list:
    """One prompt or a list of prompts -> a list of prompts."""
    if _is_single(prompts):
        return [prompts]
    if isinstance(prompts, list | tuple):
        # NOTE: no prompt is a bare token id: a list that starts with one is one prompt's ids, some not integers (the
        # check names the first)
        return [prompts] if prompts and is_token_id(prompts[0]) else list(prompts)
    raise TypeError(
        f"prompts must be text, token ids, chat messages, a Prompt or a list of these, got {type(prompts).__name__}"
    )


def default_control_tokens(tokenizer) -> ControlTokens:
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in SMOLLM2_CONTROL_TOKENS.items()}
    if any(i is None or i == tokenizer.unk_token_id for i in ids.values()):
        return ControlTokens()
    return ControlTokens(ssep_id=ids["ssep"], pdep_id=ids["pdep"], pad_id=ids["pad"])


def chat_turn_start_id(tokenizer) -> int | None:
    """The id of the chat template's turn-start token (CHAT_TURN_START_TOKEN), or None: no tokenizer, or not in it."""
    if tokenizer is None:
        return None
    token_id = tokenizer.convert_tokens_to_ids(CHAT_TURN_START_TOKEN)
    return None if token_id is None or token_id == tokenizer.unk_token_id else token_id


class LLM:
    """An engine over one model, served by a background loop that many callers share.

    Args:
        model: None for the embedded SmolLM2-135M-Instruct, a .gguf path, or a local Hugging Face directory.
        device: "cpu", "cuda" or "cuda:N" (default: cuda when torch sees a GPU).
        dtype: "float32", "bfloat16" or "float16", or that torch dtype; None or "auto": bfloat16 on CUDA, float32 on
            the CPU ("half" and "float" as vLLM reads them).
        control_tokens: the span markers (SSEP, PDEP, pad) of the model's vocabulary; None takes SmolLM2's
            `<repo_name>`, `<reponame>`, `<file_sep>` where the vocabulary has them (see minipic_lite/spans.py).
        **options: engine knobs, named and defaulted in `EngineConfig.from_options` (config.py; an unknown one is a
            TypeError naming it). The cache: block_size, num_blocks, memory_utilization, cpu_kv_cache_gib,
            position_free (False: the vanilla rotated-key cache), enable_prefix_caching, rerotate_spans (with
            position_free=False: the copy-rerotate baseline), host_cache_gib (a host tier for evicted blocks),
            cpu_decode_mirror. The scheduler: max_num_seqs, max_num_batched_tokens, max_model_len (None: the
            model's), num_scheduler_steps (decode steps per scheduler visit when every request decodes and none
            waits; None: 8 on CUDA, 1 on the CPU), async_scheduling (queue the next decode burst before reading
            the last one's tokens; None: on for CUDA, off for the CPU), span_policy ("inline", "isps" or
            "barrier"), span_ahead_tokens. The model: enforce_eager, load_format. Hybrids' recurrent-state
            checkpoints: checkpoint_policy, checkpoints_per_entry, checkpoint_prior, checkpoint_turn_start_id
            (default: the tokenizer's `<|im_start|>`; None: the checkpoint prior ignores chat turns),
            state_cache_gib, state_eviction. The README's "Use it from Python" says what each does.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        control_tokens: ControlTokens | None = None,
        **options,
    ):
        device = checked_device(device)
        model_dir = resolve_model_dir(model)
        model_class(ModelConfig.model_type(model_dir))  # an unsupported family fails here, before its fields are read
        model_config = ModelConfig.from_dir(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        control = control_tokens or (default_control_tokens(self.tokenizer) if self.tokenizer else ControlTokens())
        options.setdefault("checkpoint_turn_start_id", chat_turn_start_id(self.tokenizer))
        config = EngineConfig.from_options(model_dir, model_config, device, control, dtype, **options)
        # NOTE: the build callable must not hold `self`: the loop thread would keep this LLM alive forever
        self._loop = EngineLoop(functools.partial(LLMEngine, config, self.tokenizer))
        self.engine = self._loop.engine
        # NOTE: the loop thread holds the engine, not this object
        weakref.finalize(self, self._loop.close, LOOP_EXIT_WAIT_S)
        self._composer: PromptComposer | None = None

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def composer(self) -> PromptComposer:
        """Builds span prompts and PIC recipes for this engine (minipic_lite/prompts.py)."""
        if self._composer is None:
            self._composer = PromptComposer.for_llm(self)
        return self._composer

    def encode(self, prompt: PromptType) -> tuple[list[int], str | None]:
        """Token ids (and the text, where there is one) of one prompt; chats get the chat template."""
        if isinstance(prompt, Prompt):
            self._check_composed_for_us(prompt)
            return list(prompt.token_ids), prompt.text
        if self.tokenizer is None and (isinstance(prompt, str) or _is_chat(prompt)):
            raise ValueError(f"{self.config.model_dir} has no tokenizer: pass prompts as token ids")
        if isinstance(prompt, str):
            return self._text_tokens(prompt), prompt
        if _is_chat(prompt):
            text = self._chat_text(prompt)
            return self._text_tokens(text), text
        if isinstance(prompt, list | tuple):
            return list(prompt), None
        raise TypeError(f"a prompt must be text, token ids, chat messages or a Prompt, got {type(prompt).__name__}")

    def _chat_text(self, messages, add_generation_prompt: bool = True, **template_kwargs) -> str:
        """A conversation through the model's chat template, as text."""
        _check_messages(messages)
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
        )

    def _text_tokens(self, text: str) -> list[int]:
        """Text's token ids; a span marker's text in it is refused where markers take effect (the composer alone
        places them, as it refuses them in a piece): typed or retrieved text would silently open a span, or fail
        with advice on padding."""
        token_ids = encode_text(self.tokenizer, text)
        cache = self.config.cache
        found = None
        if cache.position_free or cache.rerotate_spans:
            found = first_marker(self.tokenizer, token_ids, self.config.control)
        if found:
            index, marker, kind = found
            raise ValueError(
                f"the prompt's text holds {marker!r}, this model's {kind.name} span marker (token {index}): a text or "
                "chat prompt places no span markers. Compose span prompts with llm.composer, or pass token ids"
            )
        return token_ids

    def _check_composed_for_us(self, prompt: Prompt) -> None:
        cfg = self.config
        if prompt.block_size != cfg.cache.block_size or prompt.control != cfg.control:
            raise ValueError(
                f"the prompt was composed for block_size {prompt.block_size} and {prompt.control}; this engine "
                f"has block_size {cfg.cache.block_size} and {cfg.control}: compose it with llm.composer"
            )

    def make_requests(
        self, prompts: list, params: list[SamplingParams], stream: bool = False, request_id: str | None = None
    ) -> list[Request | ParentRequest]:
        """Encode and validate every prompt (in the caller's thread) before any is queued. They all arrive as this
        call starts: their TTFT holds the encoding and the checks."""
        arrival_time, requests = time.perf_counter(), []
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            # NOTE: a composed prompt asks for span semantics (its markers, where it has any, are an error where they
            # cannot take effect) and goes to the engine whole: it gives its ids as it checked and packed them
            is_composed = isinstance(prompt, Prompt)
            spans = {"require_spans": True, "span_labels": prompt.labels} if is_composed else {}
            try:
                if is_composed:
                    self._check_composed_for_us(prompt)
                token_ids, text = (prompt, prompt.text) if is_composed else self.encode(prompt)
                req = self.engine.make_request(
                    token_ids, p, text, stream=stream, request_id=request_id, arrival_time=arrival_time, **spans
                )
            except (ValueError, TypeError) as e:
                raise type(e)(f"prompt {i}: {e}") from None
            requests.append(req)
        return requests

    def submit(self, requests: list[Request | ParentRequest], sink) -> None:
        """Queue validated requests on the engine loop; `sink(output)` gets each of their outputs."""
        self._loop.submit(requests, sink)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the prompts' order.

        `prompts`: one prompt (text, token ids, chat messages or a composed `Prompt`) or a list of them.
        `sampling_params`: one for all, or one per prompt; None is `SamplingParams()` (64 tokens at temperature 1.0).
        `use_tqdm`: a progress bar on stderr. All prompts are validated before any is queued: a bad one raises (naming
        its index) and nothing runs. Other callers' requests keep running in the same steps.
        """
        prompts = normalize_prompts(prompts)
        params = sampling_params if sampling_params is not None else SamplingParams()
        params = list(params) if isinstance(params, list | tuple) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        # NOTE: the bar before the requests, or none: after the submit the caller only waits. Built between the two
        # (tqdm took 35-170 us even disabled, on the CPU machine), it held the GIL while the loop thread woke to the
        # request, after the requests' arrival times (their TTFT's start) were taken.
        bar = tqdm(total=len(prompts), desc="generate", unit="req") if use_tqdm else None
        requests: list[Request | ParentRequest] = []
        done: dict[str, RequestOutput] = {}
        refused: set[str] = set()  # ids the engine refused: in flight as another caller's requests
        prompt_tokens = new_tokens = 0  # of the finished requests, for the bar's rates
        try:
            requests = self.make_requests(prompts, params)
            outputs: queue.SimpleQueue = queue.SimpleQueue()
            self.submit(requests, outputs.put)
            while len(done) < len(requests):
                item = outputs.get()
                if isinstance(item, RequestIdInUse):
                    refused.add(item.request_id)
                output = _raise_if_error(item)
                done[output.request_id] = output  # NOTE: only finished outputs come to a non-streaming sink
                prompt_tokens += len(output.prompt_token_ids)
                new_tokens += sum(len(completion.token_ids) for completion in output.outputs)
                if bar is not None:
                    rates = token_rates(prompt_tokens, new_tokens, bar.format_dict["elapsed"])
                    bar.set_postfix_str(rates, refresh=False)
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            # NOTE: interrupted (e.g. Ctrl-C) or failed: free what is still running, but not another caller's request
            # (`only`: a refusal may not have come back yet)
            for req in requests:
                if req.request_id not in done and req.request_id not in refused:
                    self._loop.abort(req.request_id, only=req)
        return [done[req.request_id] for req in requests]

    def chat(
        self,
        messages: list[dict] | Sequence[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """vLLM's `LLM.chat`: one conversation (a list of {"role", "content"} messages) or a list of them, each through
        the model's chat template, then `generate()`. `add_generation_prompt` opens the assistant's turn (the
        default); `continue_final_message` continues the last message instead (a reply's start put in its mouth);
        `chat_template_kwargs` go to the template (e.g. `{"enable_thinking": False}` for Qwen3's)."""
        if self.tokenizer is None:
            raise ValueError(f"{self.config.model_dir} has no tokenizer: chat() needs its chat template")
        conversations = [messages] if _is_chat(messages) else list(messages)
        kwargs = dict(chat_template_kwargs or {}, continue_final_message=continue_final_message)
        texts = []
        for i, conversation in enumerate(conversations):
            if not _is_chat(conversation):
                raise TypeError(f"conversation {i}: chat() takes lists of message dicts, got {conversation!r:.80}")
            try:
                texts.append(self._chat_text(conversation, add_generation_prompt, **kwargs))
            except ValueError as e:
                raise ValueError(f"conversation {i}: {e}") from None
        return self.generate(texts, sampling_params, use_tqdm)

    def get_tokenizer(self):
        """The model's tokenizer (transformers'), or None for a model without one (vLLM's `LLM.get_tokenizer`)."""
        return self.tokenizer

    def stream(
        self, prompt: PromptType, sampling_params: SamplingParams | None = None, request_id: str | None = None
    ) -> Iterator[RequestOutput]:
        """Yield the request's output (text so far) after every engine step that produced tokens (on CUDA a burst: up
        to `num_scheduler_steps` tokens); the last one has finished=True.

        One prompt (a batch is `generate()`'s); it is validated at once. Leaving the loop early (`break`, `close()`,
        a dropped iterator) aborts the request and frees its blocks. Other requests on this engine keep running in
        the same steps.
        """
        check_one_prompt(prompt, "stream()")
        (req,) = self.make_requests([prompt], [sampling_params or SamplingParams()], True, request_id)
        return self._stream(req)

    def _stream(self, req: Request) -> Iterator[RequestOutput]:
        outputs: queue.SimpleQueue = queue.SimpleQueue()
        self.submit([req], outputs.put)
        finished = False
        try:
            while not finished:
                item = outputs.get()
                finished = is_last(item)
                yield _raise_if_error(item)
        finally:
            # NOTE: the consumer stopped early: free the request's blocks. A stream left open at interpreter exit is
            # closed after the loop (weakref.finalize closed it, aborting its requests): nothing left to free
            if not finished and not self._loop.closed:
                self._loop.abort(req.request_id, only=req)

    def abort(self, request_id: str, wait: bool = True) -> None:
        """Cancel a request: its blocks are freed before this returns, and its caller gets a final output. With
        `wait=False` it returns at once and the abort runs when the engine's current step ends (a caller that must
        not block, e.g. a server's event loop)."""
        self._loop.abort(request_id, wait)

    @property
    def closed(self) -> bool:
        """`close()` was called (or the loop stopped on a fault): nothing more can be submitted."""
        return self._loop.closed

    def stats(self) -> dict:
        """The cache and scheduler counters: blocks used / free / cached, hit rates, running / waiting, preemptions, and
        each request with no token yet: queued, or prefilling with so many prompt tokens in the cache."""
        return self._loop.call(LLMEngine.cache_stats)

    def close(self) -> None:
        """Stop the engine loop (requests still running are aborted)."""
        self._loop.close()


def _raise_if_error(item):
    if isinstance(item, BaseException):
        raise item
    return item


def token_rates(prompt_tokens: int, new_tokens: int, seconds: float) -> str:
    """The progress bar's postfix, as vLLM's: the finished requests' prompt and generated tokens per second so far."""
    seconds = max(seconds, 1e-9)
    return f"prompt {prompt_tokens / seconds:,.0f} tok/s, generated {new_tokens / seconds:,.0f} tok/s"


def is_last(item) -> bool:
    """A sink's last item for its request: the finished output, or an error (the engine refused the request, whose id
    another caller's holds, or a step failed and aborted it): nothing is left to abort."""
    return isinstance(item, BaseException) or item.finished


_default_llm: LLM | None = None
_default_llm_lock = threading.Lock()  # NOTE: callers in many threads at first use build one engine, not one each


def get_default_llm() -> LLM:
    """The engine `minipic_lite.generate` uses: `LLM()` on the embedded model, built on the first call (and again
    after it was closed), then shared."""
    global _default_llm
    with _default_llm_lock:
        if _default_llm is None or _default_llm._loop.closed:
            _default_llm = LLM()
        return _default_llm


DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")


def checked_device(device) -> str:
    """`LLM(device=...)`: "cpu", "cuda", "cuda:N" or a torch.device of them; None: cuda when torch sees a GPU."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    name = str(device) if isinstance(device, torch.device) else device
    if not isinstance(name, str) or not DEVICE_PATTERN.fullmatch(name):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N' (None: cuda when torch sees a GPU), got {device!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} was asked for, but torch sees no CUDA device")
    return name


def generate(
    prompts,
    sampling_params: SamplingParams | None = None,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    use_tqdm: bool = False,
    **kwargs,
):
    """Generate with the default embedded model (`get_default_llm()`, built on first use).

    `minipic_lite.generate("Hello", max_tokens=32).text`: one prompt gives one `RequestOutput`, a list of
    prompts a list. Pass `sampling_params`, or SamplingParams fields as keywords (`top_p=0.9`, `stop=[...]`, ...;
    not both): unset fields take SamplingParams' defaults (64 new tokens) but temperature, which defaults to 0
    (greedy). `use_tqdm`: a progress bar (default off).
    """
    fields = {"max_tokens": max_tokens, "temperature": temperature, **kwargs}
    given = [k for k, v in fields.items() if v is not None]
    if sampling_params is not None and given:
        raise TypeError(f"pass sampling_params or SamplingParams fields as keywords, not both (got {', '.join(given)})")
    if sampling_params is None:
        fields["temperature"] = 0.0 if temperature is None else temperature
        sampling_params = SamplingParams(**{k: v for k, v in fields.items() if v is not None})
    single = _is_single(prompts)
    outputs = get_default_llm().generate(prompts, sampling_params, use_tqdm=use_tqdm)
    return outputs[0] if single else outputs
