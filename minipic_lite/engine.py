"""The step loop: validate and admit requests, schedule, run, detokenize, finish.

One step = `scheduler.schedule()` (host plan) -> `runner.execute()` (device: one step, or a burst of decode
steps) -> `scheduler.postprocess()`, which asks the stop checks here after every new token. Bad input is
rejected in `add_request`, before it reaches the scheduler, so a bad request never disturbs the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import count

from minipic_lite.block_pool import BlockPool
from minipic_lite.cache_report import BlockReport, build_cache_report, report_totals
from minipic_lite.config import EngineConfig
from minipic_lite.hashing import root_hash
from minipic_lite.model_runner import ModelRunner
from minipic_lite.outputs import RequestMetrics, RequestOutput
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.scheduler import Scheduler
from minipic_lite.sequence import Sequence
from minipic_lite.spans import SpanLayout, span_layout


@dataclass
class EngineStats:
    num_steps: int = 0
    num_prompt_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    num_hit_blocks: int = 0  # prompt blocks taken from the cache at admission (cache reports)
    num_computed_blocks: int = 0  # prompt blocks computed
    total_step_time: float = 0.0  # seconds, summed over steps (a list would grow without bound)


class LLMEngine:
    def __init__(self, config: EngineConfig, tokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self.runner = ModelRunner(config)
        self._check_cache_fits_one_request()
        self.pool = BlockPool(self.runner.num_blocks)
        self.scheduler = Scheduler(config.scheduler, self.pool, config.cache.enable_prefix_caching)
        self.root = root_hash(self._namespace())
        self.stats = EngineStats()
        self._ids = count()
        self._prompts: dict[int, str | None] = {}
        self._texts: dict[int, str] = {}  # text cut at a stop string
        self._stop_reasons: dict[int, str | int | None] = {}
        self._streaming: set[int] = set()  # requests whose every output carries the text so far
        self._spans: dict[int, tuple[SpanLayout, tuple[str | None, ...]]] = {}  # layout and span labels
        self._reports: dict[int, list[BlockReport]] = {}

    def _namespace(self) -> str:
        c = self.config
        return f"minipic:{c.model_dir.name}:{c.dtype}:B{c.cache.block_size}:pf{int(c.cache.position_free)}"

    def _check_cache_fits_one_request(self) -> None:
        need = -(-self.config.scheduler.max_model_len // self.config.cache.block_size)
        if self.runner.num_blocks < need:
            raise ValueError(
                f"the KV cache has {self.runner.num_blocks} blocks of {self.config.cache.block_size} tokens, "
                f"too few for one request of max_model_len={self.config.scheduler.max_model_len} tokens "
                f"({need} blocks): lower max_model_len or give the cache more memory"
            )

    # -- requests ----------------------------------------------------------------------------------------

    def validate(self, token_ids: list[int], params: SamplingParams, require_spans: bool = False) -> SpanLayout:
        """Check one request; returns its span layout (spans.py). Raises ValueError / TypeError naming the fault."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if not token_ids:
            raise ValueError("the prompt is empty")
        vocab = self.config.model.vocab_size
        bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad!r} is outside the vocabulary [0, {vocab})")
        max_len = self.config.scheduler.max_model_len
        if len(token_ids) >= max_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens; the model's context is {max_len} "
                "(at least one token must be left to generate)"
            )
        cache = self.config.cache
        return span_layout(token_ids, self.config.control, cache.block_size, cache.position_free, require_spans)

    def add_request(
        self,
        token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        stream: bool = False,
        require_spans: bool = False,
        span_labels: tuple[str | None, ...] = (),
    ) -> int:
        """Queue one request (validated first: a bad one raises here and nothing else is touched).

        Span markers in `token_ids` take effect in position-free mode (spans.py): the engine derives each
        token's visible_start and the block hashes from the tokens and the control tokens. `require_spans`
        (a composed span prompt) makes markers an error where they cannot take effect. `span_labels` name the
        segments in the cache report.
        """
        token_ids = list(token_ids)
        layout = self.validate(token_ids, params, require_spans)
        seq = Sequence(
            next(self._ids),
            token_ids,
            params,
            self.config.cache.block_size,
            self.root,
            visible_start=list(layout.visible_start) if layout.has_spans else None,
            marker_blocks=dict(layout.marker_blocks),
        )
        self._prompts[seq.seq_id] = prompt
        self._spans[seq.seq_id] = (layout, tuple(span_labels))
        if stream:
            self._streaming.add(seq.seq_id)
        self.scheduler.add(seq)
        self.stats.num_prompt_tokens += len(token_ids)
        return seq.seq_id

    def abort(self, seq_id: int) -> None:
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            if seq.seq_id == seq_id:
                self.scheduler.finish(seq, "abort")
                self._forget(seq_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    # -- the loop ----------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One scheduler step. Returns an output for every request that got a token (or finished)."""
        start = time.perf_counter()
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        self._report_admissions(out)
        num_tokens_before = sum(len(s.seq) for s in out.scheduled)
        sampled = self.runner.execute(out)
        advanced = self.scheduler.postprocess(out, sampled, self._stops)
        now = time.perf_counter()
        self._count(out, advanced, sum(len(s.seq) for s in out.scheduled) - num_tokens_before, now - start)
        results = []
        for seq in advanced:
            if seq.first_token_time is None:
                seq.first_token_time = now
            if seq.is_finished:
                seq.finish_time = now
                self.runner.sampler.forget(seq.seq_id)
            results.append(self._output(seq))
        return results

    def _count(self, out, advanced, num_new_tokens: int, elapsed: float) -> None:
        s = self.stats
        s.num_steps += out.num_steps
        s.num_computed_tokens += out.num_batched_tokens
        s.num_generated_tokens += num_new_tokens
        s.num_preemptions += len(out.preempted)
        s.total_step_time += elapsed
        for seq in advanced:
            if seq.num_output_tokens == 1:
                s.num_cached_prompt_tokens += seq.num_cached_tokens

    def _report_admissions(self, out) -> None:
        """Build the cache report of each request whose first chunk this step is (admission or re-admission)."""
        for scheduled in out.scheduled:
            seq = scheduled.seq
            if seq.num_computed_tokens == 0:
                layout, labels = self._spans[seq.seq_id]
                report = build_cache_report(seq, self.pool, layout.segments, labels)
                self._reports[seq.seq_id] = report
                totals = report_totals(report)
                self.stats.num_hit_blocks += totals["num_hit_blocks"]
                self.stats.num_computed_blocks += totals["num_computed_blocks"]

    def _stops(self, seq: Sequence) -> bool:
        """After each new token: finish the request if it stops here (the scheduler drops the rest of a burst)."""
        self._check_stop(seq)
        return seq.is_finished

    def _check_stop(self, seq: Sequence) -> None:
        params, token = seq.sampling_params, seq.token_ids[-1]
        eos = () if params.ignore_eos else self.config.model.eos_token_ids
        # NOTE: text is decoded only where it is needed (stop strings, streaming, the final output):
        # decoding every request's whole output every step would cost more than a GPU decode step.
        text = self._decode(seq) if params.stop else ""
        hit = next((s for s in params.stop if s in text), None)
        if hit is not None:
            self._texts[seq.seq_id] = text[: text.index(hit)]
            self._finish(seq, "stop", hit)
        elif token in eos or token in params.stop_token_ids:
            self._finish(seq, "stop", token)
        elif seq.num_output_tokens >= params.max_tokens or len(seq) >= self.config.scheduler.max_model_len:
            self._finish(seq, "length", None)

    def _decode(self, seq: Sequence) -> str:
        params = seq.sampling_params
        if not params.detokenize or self.tokenizer is None:
            return ""
        return self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=params.skip_special_tokens)

    def _finish(self, seq: Sequence, reason: str, stop_reason) -> None:
        self._stop_reasons[seq.seq_id] = stop_reason
        self.scheduler.finish(seq, reason)

    def _text(self, seq: Sequence) -> str:
        if isinstance(self._stop_reasons.get(seq.seq_id), str):
            return self._texts[seq.seq_id]  # cut before the stop string in _check_stop
        if seq.is_finished or seq.seq_id in self._streaming:
            return self._decode(seq)
        return ""

    def _output(self, seq: Sequence) -> RequestOutput:
        output = RequestOutput(
            request_id=seq.seq_id,
            prompt=self._prompts[seq.seq_id],
            prompt_token_ids=seq.prompt_token_ids,
            text=self._text(seq),
            token_ids=seq.output_token_ids,
            num_cached_tokens=seq.num_cached_tokens,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            metrics=RequestMetrics(seq.arrival_time, seq.first_token_time, seq.finish_time, seq.num_preemptions),
            stop_reason=self._stop_reasons.get(seq.seq_id),
            cache_report=self._reports.get(seq.seq_id, []),
        )
        if seq.is_finished:
            self._forget(seq.seq_id)
        return output

    def _forget(self, seq_id: int) -> None:
        for table in (self._prompts, self._texts, self._stop_reasons, self._spans, self._reports):
            table.pop(seq_id, None)
        self._streaming.discard(seq_id)

    def cache_stats(self) -> dict:
        pool = self.pool
        s = self.stats
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
            "mean_step_ms": 1e3 * s.total_step_time / s.num_steps if s.num_steps else 0.0,
            "num_hit_blocks": s.num_hit_blocks,
            "num_computed_blocks": s.num_computed_blocks,
            "prompt_block_hit_rate": s.num_hit_blocks / num_admitted if num_admitted else 0.0,
        }
