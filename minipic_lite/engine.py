"""The step loop: validate and admit requests, schedule, run, detokenize, finish.

One step = `scheduler.schedule()` (host plan) -> `runner.execute()` (device: one step, or a burst of decode
steps) -> `scheduler.postprocess()`, which asks the stop checks here after every new token. Bad input is
rejected in `make_request`, before it reaches the scheduler, so a bad request never disturbs the others.

The engine is single-threaded: exactly one owner calls `add`, `abort` and `step` (the background loop in
engine_loop.py for `LLM` and `AsyncLLM`; a test or a benchmark that drives it directly).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import count

import numpy as np
import torch

from minipic_lite.cache_report import StateReport, build_cache_report
from minipic_lite.checkpoints.planner import CheckpointPlanner
from minipic_lite.chunks import SchedulerOutput
from minipic_lite.config import EngineConfig, cdiv
from minipic_lite.detokenizer import Detokenizer
from minipic_lite.hashing import pack_token_ids, root_hash
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.model_runner import InFlight, ModelRunner
from minipic_lite.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from minipic_lite.prompt_logprobs import PromptScoring
from minipic_lite.prompts import Prompt
from minipic_lite.request import ParentRequest, Request
from minipic_lite.sampling_params import RequestOutputKind, SamplingParams
from minipic_lite.scheduler import Scheduler
from minipic_lite.spans import SpanHashMemo, SpanLayout, span_layout
from minipic_lite.state_cache import StateCache
from minipic_lite.step_log import StepLog


def packed(token_ids: list[int] | Prompt) -> tuple[list[int], bytes | None]:
    """A prompt's ids as a new list of Python ints, and their bytes (`hashing.pack_token_ids`); a composed `Prompt`'s
    were made when it was."""
    return token_ids.packed() if isinstance(token_ids, Prompt) else pack_token_ids(token_ids)


@dataclass
class EngineStats:
    num_steps: int = 0
    num_prompt_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    num_aborted: int = 0
    num_hit_blocks: int = 0  # prompt blocks taken from the cache at admission (cache reports)
    num_computed_blocks: int = 0  # prompt blocks computed
    num_resumed_tokens: int = 0  # hybrids: prompt tokens skipped by loading a recurrent-state checkpoint
    num_continuations: int = 0  # bursts queued before the tokens of the one before them were read (async)
    total_step_time: float = 0.0  # seconds, summed over steps (a list would grow without bound)


def prompt_tokens_in_cache(req: Request) -> int:
    """The prompt tokens whose keys and values a request has in the cache: those its chunks have passed (computed,
    or cached blocks skipped), and the cached blocks past them that no other request still computes (a document
    cached anywhere in the prompt counts from its admission, not once a chunk reaches it)."""
    B, front = req.block_size, req.num_computed_tokens
    ahead = sum(1 for block in req.cached_block_ids - req.waiting_blocks if block * B >= front)
    return min(req.num_prompt_tokens, front + B * ahead)


def shown_text(text: str, stop: Sequence[str]) -> str:
    """What an unfinished request's output shows of its text so far, as vLLM: not the characters that may yet begin a
    stop string, nor an incomplete character at the end ('\ufffd', bytes the next token may complete). So a stream's
    text only grows, and never shows what the final text leaves out."""
    if stop:
        text = text[: max(0, len(text) + 1 - max(map(len, stop)))]
    return text.rstrip("\ufffd")


def find_stop(text: str, stop: Sequence[str], searched: int = 0) -> tuple[int, str] | None:
    """Where `text` first holds a stop string, and which: the first of `stop` (in its order) that `text` holds, at
    its first place. `text[:searched]` was searched before (and held none), so the search starts where a stop string
    could end past it."""
    start = max(0, searched + 1 - max(map(len, stop), default=0))
    for s in stop:
        i = text.find(s, start)
        if i >= 0:
            return i, s
    return None


def bad_word_ids(tokenizer, words: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """The token sequences that spell `words` (vLLM's `bad_words`): each word as it is and after a space (how it
    reads at a text's start and inside it), each spelling once."""
    spellings = (spelling for word in words for spelling in (word.lstrip(), " " + word.lstrip()))
    return tuple(dict.fromkeys(tuple(tokenizer.encode(s, add_special_tokens=False)) for s in spellings))


def logprob_entry(row: list[float], token: int, k: int, width: int, decode) -> dict[int, Logprob]:
    """One token's logprobs from a `sampler.token_logprobs` row of a batch whose widest k is `width`: the token's own
    entry first, then the k likeliest tokens' (a token among them keeps its own entry)."""
    entry = {token: Logprob(row[0], int(row[1]), decode(token))}
    ids, logprobs = row[2 : 2 + k], row[2 + width : 2 + width + k]
    for rank, (token_id, logprob) in enumerate(zip(map(int, ids), logprobs, strict=True), start=1):
        entry.setdefault(token_id, Logprob(logprob, rank, decode(token_id)))
    return entry


class RequestIdInUse(ValueError):
    """`add` refused a request whose id (or one of its completions' ids, `clash`) names one still in flight; that one
    runs on untouched."""

    def __init__(self, request_id: str, clash: str | None = None):
        if clash is None or clash == request_id:
            super().__init__(f"request id {request_id!r} is already in use")
        else:
            super().__init__(f"request id {request_id!r}: {clash!r}, the id of one of its n completions, is in use")
        self.request_id = request_id


class LLMEngine:
    def __init__(self, config: EngineConfig, tokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self.runner = ModelRunner(config)
        self._check_cache_fits_one_request()
        cache = config.cache
        num_host_blocks, states = self.runner.num_host_blocks, self._state_cache()
        self.kv = KVCacheManager(
            self.runner.num_blocks, cache.enable_prefix_caching, num_host_blocks, states, cache.rerotate_spans
        )
        self.scheduler = Scheduler(config.scheduler, self.kv)
        self.root = root_hash(config.hash_namespace)
        self.hash_memo = SpanHashMemo()  # span hashes by content: a cached span is not hashed again per prompt
        self.stats = EngineStats()
        self.step_log = StepLog()  # tokens of each kind per recent step (the web app's scheduler timeline)
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.parents: dict[str, ParentRequest] = {}  # unfinished requests of n > 1 completions by id
        # async scheduling (CUDA; not for hybrids, whose state slots are planned per step): the burst queued on
        # the device ahead of the host, whose tokens the next step reads
        self.is_async = config.scheduler.async_scheduling and not config.model.is_hybrid
        self.in_flight: InFlight | None = None
        self._ids = count()

    @property
    def pool(self):
        return self.kv.pool

    def _state_cache(self) -> StateCache | None:
        """Hybrid models: the books of the runner's state slots and checkpoints, and the checkpoint planner."""
        tensors, c = self.runner.state_tensors, self.config.cache
        if tensors is None:
            return None
        policy = c.checkpoint_policy if c.enable_prefix_caching else "none"  # NOTE: nothing to resume without it
        planner = CheckpointPlanner(policy, c.checkpoints_per_entry, c.block_size, c.checkpoint_prior,
                                    turn_start_id=c.checkpoint_turn_start_id)  # fmt: skip
        num_slots = self.config.scheduler.max_num_seqs
        return StateCache(num_slots, tensors.num_checkpoints, tensors.checkpoint_bytes, planner, c.state_eviction)

    def _check_cache_fits_one_request(self) -> None:
        need = cdiv(self.config.scheduler.max_model_len, self.config.cache.block_size)
        if self.runner.num_blocks < need:
            raise ValueError(
                f"the KV cache has {self.runner.num_blocks} blocks of {self.config.cache.block_size} tokens, "
                f"too few for one request of max_model_len={self.config.scheduler.max_model_len} tokens "
                f"({need} blocks): lower max_model_len or give the cache more memory"
            )

    # -- requests ----------------------------------------------------------------------------------------

    def validate(
        self, token_ids: list[int] | Prompt, params: SamplingParams, require_spans: bool = False
    ) -> SpanLayout:
        """Check one request; returns its span layout (spans.py). Raises ValueError / TypeError naming the fault."""
        return self._check(*packed(token_ids), params, require_spans)

    def _check(
        self, token_ids: list[int], data: bytes | None, params: SamplingParams, require_spans: bool
    ) -> SpanLayout:
        """`validate` of what `packed` made: Python ints, and the same packed (the request hashes its blocks from
        those bytes)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if not token_ids:
            raise ValueError("the prompt is empty")
        vocab = self.config.model.vocab_size
        # NOTE: one packing of the prompt: its range and its markers are read from those bytes in C, and the request
        # hashes them (8 x 2048 cached, bench/host_ttft.py on 2 CPU cores: 1.21-1.41 -> 0.77-0.87 ms)
        # NOTE: read as unsigned, a negative id is past every vocabulary: one pass over the ids finds both ends
        if data is None or np.frombuffer(data, dtype="<u8").max() >= vocab:
            bad = next(t for t in token_ids if not 0 <= t < vocab)
            raise ValueError(f"token id {bad!r} is outside the vocabulary [0, {vocab})")
        if params.stop_token_ids and max(params.stop_token_ids) >= vocab:  # it could never be sampled
            bad = next(t for t in params.stop_token_ids if t >= vocab)
            raise ValueError(f"stop token id {bad} is outside the vocabulary [0, {vocab}): it can never be generated")
        bad_word_tokens = [t for word in params.bad_words_token_ids or () for t in word]
        for name, ids in (("logit_bias", [t for t, _ in params.logit_bias or ()]),
                          ("allowed_token_ids", params.allowed_token_ids or ()),
                          ("bad_words_token_ids", bad_word_tokens)):  # fmt: skip
            if ids and max(ids) >= vocab:
                raise ValueError(f"{name} names token id {max(ids)}, outside the vocabulary [0, {vocab})")
        max_len = self.config.scheduler.max_model_len
        if len(token_ids) >= max_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens; the model's context is {max_len} "
                "(at least one token must be left to generate)"
            )
        cache = self.config.cache
        spans_apply = cache.position_free or cache.rerotate_spans
        layout = span_layout(token_ids, self.config.control, cache.block_size, spans_apply, require_spans, data)
        if layout.has_spans and self.config.model.is_hybrid:
            raise ValueError("span markers need attention-only models: a hybrid's recurrent state sees every token")
        if layout.has_spans and params.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs needs a prompt without span markers (its spans would be computed apart)")
        return layout

    def make_request(
        self,
        token_ids: list[int] | Prompt,
        params: SamplingParams,
        prompt: str | None = None,
        stream: bool = False,
        require_spans: bool = False,
        span_labels: tuple[str | None, ...] = (),
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> Request | ParentRequest:
        """A validated request, not queued yet (safe from any thread: it reads only the config); with
        `params.n` > 1 a `ParentRequest` of n requests, one per completion.

        Span markers in `token_ids` take effect in position-free mode (spans.py): the engine derives each
        token's visible_start and the block hashes from the tokens and the control tokens; a composed `Prompt` gives
        its ids as it checked and packed them when it was made (`packed`). `require_spans`
        (a composed span prompt) makes markers an error where they cannot take effect. `span_labels` name the
        segments in the cache report. `arrival_time` (`time.perf_counter()` seconds; None: as this call starts) is
        where its TTFT starts, so the TTFT holds the checks, as vLLM's holds its input processing.
        """
        arrival_time = time.perf_counter() if arrival_time is None else arrival_time
        stream = stream and params.output_kind != RequestOutputKind.FINAL_ONLY
        if params.bad_words is not None:  # NOTE: beside any token sequences given: both are blocked
            if self.tokenizer is None:
                raise ValueError("bad_words need the model's tokenizer: give bad_words_token_ids instead")
            spelled = (*(params.bad_words_token_ids or ()), *bad_word_ids(self.tokenizer, params.bad_words))
            params = replace(params, bad_words_token_ids=tuple(dict.fromkeys(spelled)))
        if params.truncate_prompt_tokens is not None:
            token_ids = self._truncated(token_ids, params.truncate_prompt_tokens, require_spans)
        token_ids, data = packed(token_ids)
        layout = self._check(token_ids, data, params, require_spans)
        if request_id is None:  # NOTE: past the ids a caller chose that are in flight ('0', '1', ... stay free of them)
            request_id = next(rid for rid in map(str, self._ids) if self._id_is_free(rid, params.n))

        def record(rid: str, ids: list[int], p: SamplingParams) -> Request:
            return Request(
                rid, ids, p, self.config.cache.block_size, self.root, layout, prompt, span_labels, stream,
                hash_memo=self.hash_memo, prompt_bytes=data, arrival_time=arrival_time,
            )  # fmt: skip

        if params.n == 1:
            return record(request_id, token_ids, params)
        children = [
            record(ParentRequest.child_id(request_id, i), list(token_ids), params.child(i)) for i in range(params.n)
        ]
        parent = ParentRequest(request_id, children, stream)
        for child in children:
            child.parent = parent
        return parent

    def _truncated(self, token_ids: list[int] | Prompt, keep: int, require_spans: bool) -> list[int] | Prompt:
        """The prompt's last `keep` tokens (-1: as many as leave one token to generate); a prompt with span markers
        where they take effect is refused a cut (its spans would lose their blocks' alignment)."""
        asked, keep = keep, self.config.scheduler.max_model_len - 1 if keep == -1 else keep
        if len(token_ids) <= keep:
            return token_ids
        cache, control = self.config.cache, self.config.control
        markers = {control.ssep_id, control.pdep_id} - {None} if cache.position_free or cache.rerotate_spans else set()
        if require_spans or isinstance(token_ids, Prompt) or not markers.isdisjoint(token_ids):
            raise ValueError(
                f"truncate_prompt_tokens={asked} would cut a prompt with span markers ({len(token_ids)} tokens): "
                "its spans would lose their alignment to the KV blocks; shorten its pieces instead"
            )
        return list(token_ids[-keep:])

    def _id_is_free(self, request_id: str, n: int) -> bool:
        """No request in flight holds `request_id`, nor (n > 1) one of its completions' ids."""
        # NOTE: lookups, not a union of the keys: the loop thread may add or drop ids meanwhile
        ids = [request_id] + ([ParentRequest.child_id(request_id, i) for i in range(n)] if n > 1 else [])
        return not any(rid in self.requests or rid in self.parents for rid in ids)

    def add(self, req: Request | ParentRequest) -> None:
        children = req.children if isinstance(req, ParentRequest) else [req]
        for rid in (req.request_id, *(child.request_id for child in children)):
            if rid in self.requests or rid in self.parents:
                raise RequestIdInUse(req.request_id, rid)
        if isinstance(req, ParentRequest):
            self.parents[req.request_id] = req
        for child in children:
            self.requests[child.request_id] = child
            self.scheduler.add(child)
            self.stats.num_prompt_tokens += child.num_prompt_tokens

    def add_request(self, token_ids: list[int], params: SamplingParams, **kwargs) -> str:
        """Validate and queue one request (a bad one raises here and nothing else is touched); its id."""
        req = self.make_request(token_ids, params, **kwargs)
        self.add(req)
        return req.request_id

    def abort(self, request_id: str, only: Request | ParentRequest | None = None) -> RequestOutput | None:
        """Finish a request now ("abort"), freeing its blocks; its final output, or None if it is not here (or, with
        `only`, is another request than that one). One of n completions' ids aborts them all."""
        req = self.parents.get(request_id) or self.requests.get(request_id)
        if isinstance(req, Request) and req.parent is not None:
            req = req.parent
        if req is None or (only is not None and req is not only):
            return None
        now = time.perf_counter()
        for child in req.children if isinstance(req, ParentRequest) else [req]:
            if not child.is_finished:
                self.scheduler.finish(child, "abort")
                self._retire(child, now)
        self._drop_finished_flight()
        self.stats.num_aborted += 1
        return self._output(req)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    # -- the loop ----------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One scheduler step. Returns an output for every finished request and every streaming one that got a token.

        With async scheduling a decode burst still on the device when a step ends is this step's work: the step
        queues the burst that continues it (`Scheduler.plan_continuation`) before it waits for its tokens, so the
        host's work on them (stops, outputs, the next plan) runs while the device computes the next burst:

            host:    plan 1 | plan 2 | wait 1 | tokens 1 | plan 3 | wait 2 | tokens 2 | ...
            device:  ....... burst 1 .......... burst 2 ................. burst 3 .......
        """
        start = time.perf_counter()
        flight, self.in_flight = self.in_flight, None
        if flight is None:
            out = self.scheduler.schedule()
            if not out.scheduled:
                return []
            flight = self.runner.launch(out)
            # NOTE: after the launch, while the device computes: host work that reads no sampled token
            self._report_admissions(out)
            self._copy_prompts(out)
        out = flight.out
        if self.is_async:
            nxt = self.scheduler.plan_continuation(out)
            if nxt is not None:
                self.in_flight = self.runner.launch_continuation(flight, nxt)
                self.stats.num_continuations += 1
        num_tokens_before = [len(s.seq) for s in out.scheduled]
        advanced = self.scheduler.postprocess(out, self.runner.wait(flight), self._stops)
        if flight.logprobs is not None:
            self._record_logprobs(out, flight.logprobs, num_tokens_before)
        if flight.prompt_scoring is not None:
            self._record_prompt_logprobs(flight.prompt_scoring)
        self._drop_finished_flight()
        now = time.perf_counter()
        self._count(out, advanced, sum(len(s.seq) for s in out.scheduled) - sum(num_tokens_before), now - start)
        self.step_log.record(out, now)
        outputs, parents = [], {}
        for req in advanced:
            if req.first_token_time is None:
                req.first_token_time = now
            if req.is_finished:
                self._retire(req, now)
            if req.parent is not None:  # NOTE: one output for its n completions, once they all are done or streamed
                parents[req.parent.request_id] = req.parent
            elif req.is_finished or req.stream:
                outputs.append(self._output(req))
        outputs += [self._output(parent) for parent in parents.values() if parent.is_finished or parent.stream]
        return outputs

    def _drop_finished_flight(self) -> None:
        """Forget the burst queued ahead once every request in it has finished: none of its tokens would be kept.
        The device still runs it, before anything queued later (one stream), so freed blocks are reused safely."""
        if self.in_flight is not None and all(s.seq.is_finished for s in self.in_flight.out.scheduled):
            self.in_flight = None

    def _count(self, out: SchedulerOutput, advanced: list[Request], num_new_tokens: int, elapsed: float) -> None:
        s = self.stats
        s.num_steps += out.num_steps
        s.num_computed_tokens += out.num_batched_tokens
        s.num_generated_tokens += num_new_tokens
        s.num_preemptions += len(out.preempted)
        s.total_step_time += elapsed
        for req in advanced:
            if req.num_output_tokens == 1:
                req.num_cached_prompt_tokens = req.num_cached_tokens
                s.num_cached_prompt_tokens += req.num_cached_tokens

    def _report_admissions(self, out: SchedulerOutput) -> None:
        """Build the cache report of each request whose first chunk this step is (admission or re-admission)."""
        for scheduled in out.scheduled:
            req = scheduled.seq
            # NOTE: a hybrid's first chunk starts past the checkpoint it resumed from
            if req.num_computed_tokens == req.num_resumed_tokens and not req.is_span_prefill:
                segments = req.layout.segments if req.layout is not None else ()
                req.cache_report = report = build_cache_report(req, self.pool, segments, req.span_labels)
                self.stats.num_hit_blocks += report.num_hit_blocks
                self.stats.num_computed_blocks += len(report) - report.num_hit_blocks
                self.stats.num_resumed_tokens += req.num_resumed_tokens

    def _copy_prompts(self, out: SchedulerOutput) -> None:
        """Make the prompt's copy that the first output of each request sampling its first token in `out` carries
        (`Request.prompt_token_ids`), before the token is known: 16.6k ids take ~0.04 ms on 2 CPU cores."""
        for scheduled in out.scheduled:
            if scheduled.do_sample and scheduled.seq.num_output_tokens == 0:
                scheduled.seq.copy_prompt()

    def _stops(self, req: Request) -> bool:
        """After each new token: finish the request if it stops here (the scheduler drops the rest of a burst)."""
        params, token = req.sampling_params, req.token_ids[-1]
        eos = () if params.ignore_eos else self.config.model.eos_token_ids
        may_stop = req.num_output_tokens > params.min_tokens  # NOTE: the sampler blocked its stop tokens before
        # NOTE: text is decoded only where it is needed (stop strings, streaming, the final output), and a token
        # at a time (detokenizer.py); a stop string is looked for only where the text changed (not in the text of
        # the first min_tokens tokens, as vLLM)
        text = self._text_so_far(req) if params.stop else ""
        if not may_stop:
            req.stop_search_start = len(text)
        hit = None
        if params.stop and text and may_stop:
            hit = find_stop(text, params.stop, max(req.detokenizer.num_kept, req.stop_search_start))
        if hit is not None:
            req.stop_text = text[: hit[0] + len(hit[1]) * params.include_stop_str_in_output]
            self._finish(req, "stop", hit[1])
        elif may_stop and (token in eos or token in params.stop_token_ids):
            self._finish(req, "stop", token)
        elif req.num_output_tokens >= params.max_tokens or len(req) >= self.config.scheduler.max_model_len:
            self._finish(req, "length", None)
        return req.is_finished

    def _record_logprobs(self, out: SchedulerOutput, rows: torch.Tensor, num_tokens_before: list[int]) -> None:
        """Keep the logprobs of each token a request took this step (a burst's tokens past a stop are dropped).
        rows: (num_sampling, num_steps, 2 + 2k) float32 on the host, `sampler.token_logprobs`' rows, step by step."""
        sampling = [(s.seq, n) for s, n in zip(out.scheduled, num_tokens_before, strict=True) if s.do_sample]
        for (req, before), steps in zip(sampling, rows.tolist(), strict=True):
            k = req.sampling_params.logprobs
            if k is None:
                continue
            decode = self._token_text if req.sampling_params.detokenize else lambda token: None
            width = (len(steps[0]) - 2) // 2  # the batch's k, at least this row's
            for step, token in zip(steps, req.token_ids[before:], strict=False):
                req.logprobs.append(logprob_entry(step, token, k, width, decode))
                req.cumulative_logprob += step[0]

    def _record_prompt_logprobs(self, scoring: PromptScoring) -> None:
        """Keep the prompt logprobs a step scored, each at its prompt token's place (a recomputed one again)."""
        rows = iter(scoring.rows.tolist())
        for req, positions in scoring.requests:
            k = req.sampling_params.prompt_logprobs
            decode = self._token_text if req.sampling_params.detokenize else lambda token: None
            if req.prompt_logprobs is None:
                req.prompt_logprobs = [None] * req.num_prompt_tokens
            for position, row in zip(positions, rows, strict=False):
                req.prompt_logprobs[position] = logprob_entry(row, req.token_ids[position], k, scoring.k, decode)

    def _token_text(self, token_id: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token_id])

    def _finish(self, req: Request, reason: str, stop_reason) -> None:
        req.stop_reason = stop_reason
        self.scheduler.finish(req, reason)

    def _decode(self, req: Request) -> str:
        """A finished request's text: one decode of its whole output."""
        params = req.sampling_params
        if not params.detokenize or self.tokenizer is None:
            return ""
        return self.tokenizer.decode(req.output_token_ids, skip_special_tokens=params.skip_special_tokens)

    def _text_so_far(self, req: Request) -> str:
        """A running request's text, less an incomplete character at the end: decoded from its last new tokens."""
        params = req.sampling_params
        if not params.detokenize or self.tokenizer is None:
            return ""
        if req.detokenizer is None:
            req.detokenizer = Detokenizer(self.tokenizer, params.skip_special_tokens, first=req.num_prompt_tokens)
        return req.detokenizer.update(req.token_ids)

    def _retire(self, req: Request, now: float) -> None:
        """A request has finished: forget it (and its parent, once all its completions have finished)."""
        req.finish_time = now
        self.requests.pop(req.request_id, None)
        self.runner.sampler.forget(req.request_id)
        if req.parent is not None and req.parent.is_finished:
            self.parents.pop(req.parent.request_id, None)

    def _completion(self, req: Request, index: int) -> CompletionOutput:
        if req.stop_text is not None:
            text = req.stop_text
        elif req.is_finished:
            text = self._decode(req)
        else:
            text = shown_text(self._text_so_far(req), req.sampling_params.stop)
        params = req.sampling_params
        token_ids, logprobs = req.output_token_ids, list(req.logprobs) if params.logprobs is not None else None
        if req.stream and params.output_kind == RequestOutputKind.DELTA:  # NOTE: a streamed text only grows
            text, token_ids = text[req.num_sent_chars :], token_ids[req.num_sent_tokens :]
            logprobs = None if logprobs is None else logprobs[req.num_sent_tokens :]
            req.num_sent_chars += len(text)
            req.num_sent_tokens += len(token_ids)
        cumulative = req.cumulative_logprob if logprobs is not None else None
        return CompletionOutput(index, text, token_ids, cumulative, logprobs, req.finish_reason, req.stop_reason)

    def _output(self, req: Request | ParentRequest) -> RequestOutput:
        """The caller's output of a request: its one completion, or a parent's n (the prompt's facts are the first
        child's; the timings span them all)."""
        children = req.children if isinstance(req, ParentRequest) else [req]
        completions = [self._completion(child, i) for i, child in enumerate(children)]
        first, done = children[0], completions[0]
        # NOTE: vLLM's num_cached_tokens, the prompt tokens found cached before its first token: a re-admission
        # after a preemption finds its own prompt's and answer's blocks cached too (that is no saving to report)
        cached = first.num_cached_tokens if first.num_cached_prompt_tokens is None else first.num_cached_prompt_tokens
        first_token_times = [child.first_token_time for child in children if child.first_token_time is not None]
        finished = req.is_finished
        metrics = RequestMetrics(
            first.arrival_time,
            min(first_token_times, default=None),
            max(child.finish_time for child in children) if finished else None,
            sum(child.num_preemptions for child in children),
        )
        return RequestOutput(
            request_id=req.request_id,
            prompt=first.prompt,
            prompt_token_ids=first.prompt_token_ids,
            text=done.text,
            token_ids=done.token_ids,
            num_cached_tokens=cached,
            finished=finished,
            finish_reason=done.finish_reason,
            metrics=metrics,
            stop_reason=done.stop_reason,
            cache_report=first.cache_report,
            state_report=self._state_report(first),
            logprobs=done.logprobs,
            cumulative_logprob=done.cumulative_logprob,
            outputs=completions,
            prompt_logprobs=self._prompt_logprobs(first),
        )

    @staticmethod
    def _prompt_logprobs(req: Request) -> list | None:
        """The prompt's logprobs where asked; a DELTA stream's first output alone carries them."""
        if req.sampling_params.prompt_logprobs is None or req.sent_prompt_logprobs:
            return None
        req.sent_prompt_logprobs = req.stream and req.sampling_params.output_kind == RequestOutputKind.DELTA
        return list(req.prompt_logprobs or [None] * req.num_prompt_tokens)

    def _state_report(self, req: Request) -> StateReport | None:
        states = self.kv.states
        if states is None:
            return None
        planned, saved = tuple(req.checkpoint_positions or ()), tuple(req.saved_checkpoints)
        resumed = req.num_resumed_tokens
        return StateReport(resumed, req.num_prompt_tokens - resumed, planned, saved, states.num_used_bytes)

    def cache_stats(self) -> dict:
        pool, s, host = self.pool, self.stats, self.kv.host
        num_admitted = s.num_hit_blocks + s.num_computed_blocks
        return {
            "num_blocks": pool.num_blocks,
            "num_free_blocks": pool.num_free_blocks,
            "num_used_blocks": pool.num_blocks - pool.num_free_blocks,
            "num_cached_blocks": pool.num_cached_blocks,
            "block_hit_rate": pool.num_hits / pool.num_lookups if pool.num_lookups else 0.0,
            "prompt_token_hit_rate": s.num_cached_prompt_tokens / s.num_prompt_tokens if s.num_prompt_tokens else 0.0,
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "num_preemptions": s.num_preemptions,
            "num_aborted": s.num_aborted,
            "mean_step_ms": 1e3 * s.total_step_time / s.num_steps if s.num_steps else 0.0,
            "num_hit_blocks": s.num_hit_blocks,
            "num_computed_blocks": s.num_computed_blocks,
            "prompt_block_hit_rate": s.num_hit_blocks / num_admitted if num_admitted else 0.0,
            "num_computed_tokens": s.num_computed_tokens,
            "num_host_hit_blocks": self.kv.num_host_hits,
            "num_rerotated_blocks": self.kv.num_rerotated,
            "num_host_blocks": self.runner.num_host_blocks,
            "host_bytes_moved": 0 if host is None else (host.num_stored + host.num_loaded) * self.runner.block_bytes,
            "prefill_progress": self.prefill_progress(),
        } | self._state_stats()

    def prefill_progress(self) -> dict[str, tuple[str, int, int]]:
        """Request id -> (stage, prompt tokens in the cache, prompt tokens) of each request with no token yet: stage
        "prefilling" (admitted) or "queued" (not yet admitted; under isps or barrier its documents may be prefilling
        already), running ones first."""
        sched = self.scheduler
        return {
            req.request_id: (stage, prompt_tokens_in_cache(req), req.num_prompt_tokens)
            for stage, reqs in (("prefilling", sched.running), ("queued", sched.waiting))
            for req in reqs
            if req.num_output_tokens == 0  # NOTE: span prefills (isps, barrier) queue apart, in span_running
        }

    def _state_stats(self) -> dict:
        """Hybrids: checkpoints saved / evicted, resumes, prompt tokens recomputed, state memory (bytes)."""
        states, s = self.kv.states, self.stats
        if states is None:
            return {}
        return {
            "num_checkpoints": len(states.by_hash),
            "num_checkpoints_saved": states.stats.num_saved,
            "num_checkpoints_evicted": states.stats.num_evicted,
            "num_checkpoints_declined": states.stats.num_declined_saves,  # worth less than what they'd evict
            "num_checkpoints_moved": states.stats.num_moved,  # saves that took a stale one's place (store.is_stale)
            "num_resumed": states.stats.num_resumed,
            "num_resumed_tokens": s.num_resumed_tokens,
            "num_recomputed_prompt_tokens": s.num_prompt_tokens - s.num_resumed_tokens,
            "state_memory_bytes": states.num_used_bytes,
            "state_budget_bytes": states.budget_bytes,
        }
