"""The public API: a thin `LLM` with vLLM's `generate()`, a streaming iterator, and module-level `generate()`."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minipic_lite.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CUDA_SCHEDULER_STEPS,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_MEMORY_UTILIZATION,
    SMOLLM2_CONTROL_TOKENS,
    CacheConfig,
    ControlTokens,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
)
from minipic_lite.engine import LLMEngine
from minipic_lite.models.loader import load_tokenizer, resolve_model_dir
from minipic_lite.outputs import RequestOutput
from minipic_lite.prompts import Prompt, PromptComposer
from minipic_lite.sampling_params import SamplingParams

# A prompt is text, token ids, a chat (a list of {"role", "content"} messages) or a composed span `Prompt`.
PromptType = str | Sequence[int] | Sequence[dict] | Prompt


def _is_chat(x) -> bool:
    return isinstance(x, list | tuple) and bool(x) and all(isinstance(m, dict) for m in x)


def _is_token_ids(x) -> bool:
    return isinstance(x, list | tuple) and bool(x) and all(isinstance(t, int) for t in x)


def _is_single(x) -> bool:
    return isinstance(x, str | Prompt) or _is_chat(x) or _is_token_ids(x)


def normalize_prompts(prompts) -> list:
    """One prompt or a list of prompts -> a list of prompts."""
    if _is_single(prompts):
        return [prompts]
    if isinstance(prompts, list | tuple):
        return list(prompts)
    raise TypeError(
        f"prompts must be text, token ids, chat messages, a Prompt or a list of these, got {type(prompts).__name__}"
    )


def default_scheduler_steps(device: str) -> int:
    """Bursts pay off where the host would leave a fast device idle between steps (the GPU)."""
    return DEFAULT_CUDA_SCHEDULER_STEPS if device.startswith("cuda") else 1


def default_control_tokens(tokenizer) -> ControlTokens:
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in SMOLLM2_CONTROL_TOKENS.items()}
    if any(i is None or i == tokenizer.unk_token_id for i in ids.values()):
        return ControlTokens()
    return ControlTokens(ssep_id=ids["ssep"], pdep_id=ids["pdep"], pad_id=ids["pad"])


class LLM:
    """An engine over one model.

    Args:
        model: None for the embedded SmolLM2-135M-Instruct, a .gguf path, or a local Hugging Face directory.
        device: "cuda" or "cpu" (default: cuda when available).
        dtype: "float32", "bfloat16" or "float16" (default: bfloat16 on CUDA, float32 on the CPU).
        block_size: tokens per KV block.
        position_free: store keys unrotated and rotate them inside attention (MiniPIC); False is the
            vanilla rotated-key cache.
        num_blocks: KV blocks; None sizes the cache from free memory.
        num_scheduler_steps: decode steps run back to back between two scheduler visits when every request
            decodes and none waits (one host sync per burst); None: 8 on CUDA, 1 on the CPU.
        control_tokens: the span markers (SSEP, PDEP, pad) of the model's vocabulary; None takes SmolLM2's
            `<repo_name>`, `<reponame>`, `<file_sep>` where the vocabulary has them (see minipic_lite/spans.py).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        device: str | None = None,
        dtype: str | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        position_free: bool = True,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_model_len: int | None = None,
        num_blocks: int | None = None,
        memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = False,
        control_tokens: ControlTokens | None = None,
        load_format: str = "auto",
        num_scheduler_steps: int | None = None,
    ):
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
        if load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for, but torch sees no CUDA device")
        model_dir = resolve_model_dir(model)
        model_config = ModelConfig.from_dir(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        config = EngineConfig(
            model_dir=model_dir,
            model=model_config,
            cache=CacheConfig(
                block_size,
                num_blocks,
                memory_utilization,
                position_free=position_free,
                enable_prefix_caching=enable_prefix_caching,
            ),
            scheduler=SchedulerConfig(
                max_num_seqs,
                max_num_batched_tokens,
                max_model_len or model_config.max_position,
                default_scheduler_steps(device) if num_scheduler_steps is None else num_scheduler_steps,
            ),
            control=control_tokens or (default_control_tokens(self.tokenizer) if self.tokenizer else ControlTokens()),
            device=device,
            dtype=dtype,
            enforce_eager=enforce_eager,
            load_format=load_format,
        )
        self.engine = LLMEngine(config, self.tokenizer)
        self._lock = threading.Lock()  # one thread steps the engine at a time (the UI streams from threads)
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
            return self.tokenizer.encode(prompt, add_special_tokens=False), prompt
        if _is_chat(prompt):
            text = self.tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
            return self.tokenizer.encode(text, add_special_tokens=False), text
        if isinstance(prompt, list | tuple):
            return list(prompt), None
        raise TypeError(f"a prompt must be text, token ids, chat messages or a Prompt, got {type(prompt).__name__}")

    def _check_composed_for_us(self, prompt: Prompt) -> None:
        cfg = self.config
        if prompt.block_size != cfg.cache.block_size or prompt.control != cfg.control:
            raise ValueError(
                f"the prompt was composed for block_size {prompt.block_size} and {prompt.control}; this engine "
                f"has block_size {cfg.cache.block_size} and {cfg.control}: compose it with llm.composer"
            )

    def _add_all(self, prompts: list, params: list[SamplingParams], stream: bool = False) -> list[int]:
        encoded = []
        for i, prompt in enumerate(prompts):
            is_composed = isinstance(prompt, Prompt)
            require_spans = is_composed and prompt.has_markers
            try:
                token_ids, text = self.encode(prompt)
                self.engine.validate(token_ids, params[i], require_spans)
            except (ValueError, TypeError) as e:
                raise type(e)(f"prompt {i}: {e}") from None
            encoded.append((token_ids, text, require_spans, prompt.labels if is_composed else ()))
        return [
            self.engine.add_request(ids, p, text, stream=stream, require_spans=spans, span_labels=labels)
            for (ids, text, spans, labels), p in zip(encoded, params, strict=True)
        ]

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the prompts' order.

        All prompts are validated before any is queued: a bad one raises (naming its index) and nothing runs.
        """
        prompts = normalize_prompts(prompts)
        params = sampling_params if sampling_params is not None else SamplingParams()
        params = list(params) if isinstance(params, list | tuple) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        with self._lock:
            ids = self._add_all(prompts, params)
            done: dict[int, RequestOutput] = {}
            bar = tqdm(total=len(ids), desc="generate", disable=not use_tqdm, unit="req")
            while len(done) < len(ids):
                for output in self.engine.step():
                    if output.finished:
                        done[output.request_id] = output
                        bar.update(1)
            bar.close()
        return [done[i] for i in ids]

    def stream(self, prompt: PromptType, sampling_params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Yield the request's output after every new token (text so far); the last one has finished=True.

        Other requests queued on this engine keep running in the same steps.
        """
        params = sampling_params or SamplingParams()
        with self._lock:
            (request_id,) = self._add_all([prompt], [params], stream=True)
        finished = False
        try:
            while not finished:
                with self._lock:
                    outputs = self.engine.step()
                for output in outputs:
                    if output.request_id == request_id:
                        finished = output.finished
                        yield output
        finally:
            if not finished:  # the consumer stopped early: free the request's blocks
                with self._lock:
                    self.engine.abort(request_id)

    def stats(self) -> dict:
        return self.engine.cache_stats()


_default_llm: LLM | None = None


def get_default_llm() -> LLM:
    global _default_llm
    if _default_llm is None:
        _default_llm = LLM()
    return _default_llm


def generate(
    prompts,
    sampling_params: SamplingParams | None = None,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    use_tqdm: bool = False,
    **kwargs,
):
    """Generate with the default embedded model (built on first use).

    `minipic_lite.generate("Hello", max_tokens=32).text`: one prompt gives one `RequestOutput`, a list of
    prompts a list. Pass `sampling_params`, or SamplingParams fields as keywords (default: greedy).
    """
    if sampling_params is None:
        fields = {"max_tokens": max_tokens, "temperature": 0.0 if temperature is None else temperature}
        sampling_params = SamplingParams(**{k: v for k, v in fields.items() if v is not None}, **kwargs)
    single = _is_single(prompts)
    outputs = get_default_llm().generate(prompts, sampling_params, use_tqdm=use_tqdm)
    return outputs[0] if single else outputs
