"""The app's handlers as plain Python over the public API (`LLM.make_requests` and `LLM.submit`, `LLM.abort`,
`LLM.stats`): gradio calls them (app.py), the tests call them directly. One `Handlers` serves every browser session;
a session is named by gradio's session hash and sees its own answers only."""

from __future__ import annotations

import html
import logging
import queue
import time
from collections.abc import Iterator
from functools import lru_cache

import minipic_lite as mp
from minipic_lite.checkpoints import DEFAULT_BIN_SIZE
from minipic_lite.checkpoints.policies import DEFAULT_BLOCK_SIZE as BLOCK_POLICY_TOKENS
from minipic_lite.llm import is_last
from ui.cache_view import grid_cells, grid_html, inflight_html, pool_markdown, summary_markdown
from ui.checkpoints_panel import (
    MAX_BUDGET,
    TokenAxis,
    axis_html,
    histogram_frame,
    learn_overlaps,
    no_plan,
    plans_frame,
    policy_plans,
    positions_frame,
    state_markdown,
    token_axis,
)
from ui.compose import InputError, build_prompt, check_recipe_for_model, check_repetition_penalty, split_documents
from ui.monitor import Monitor
from ui.timeline import timeline_frame

logger = logging.getLogger(__name__)

APP_STREAM = "this app's prompts"
BENCH_STREAMS = ("system_prompts", "essay_questions")
BENCH_STREAM_REQUESTS = 60
# what a request's finish_reason means to someone watching the app (the reason itself stays in brackets)
FINISH_WORDS = {
    None: "generating…",
    "length": "done: it reached the new-token limit",
    "stop": "done: the model ended its answer",
    "abort": "stopped before the end",
}
# NOTE: a refusal clears the grid and the token axis: the last request's under the message would read as the refused
# input's. So does a new request until its reports arrive: the last one's would read as the new one's.
WAITING_FOR_STATS = "*The engine is in a long step: its counters come when the step ends.*"
REFUSED_GRID_CAPTION = "No blocks: the input was refused, nothing ran."
REFUSED_AXIS_CAPTION = "No token axis: the input was refused, nothing ran."
NO_AXIS_CAPTION = "Generate (with the prefix recipe) to see your request here."
HEARTBEAT_SECONDS = 1.0  # until its first token, a request's status line counts the seconds (a CPU prefill is long)
STATS_WAIT_SECONDS = 0.2  # a tick waits this long for the engine's stats, then shows the last ones (its step runs on)


class Handlers:
    def __init__(self, llm: mp.LLM):
        self.llm = llm
        self.composer = llm.composer if llm.tokenizer is not None else None
        self.is_hybrid = llm.config.model.is_hybrid
        self.monitor = Monitor()
        # hybrids: session -> (request id, token axis) of its last request, or the caption of why none is drawn
        self.last_axis: dict[str, tuple[str, TokenAxis] | str] = {}
        self.stopped: set[str] = set()  # requests the Stop button aborted, until their stream ends

    # -- compose & generate -------------------------------------------------------------------------------

    def generate(
        self,
        recipe: str,
        system: str,
        documents_text: str,
        question: str,
        max_tokens,
        session: str = "local",
        repetition_penalty=1.0,
    ) -> Iterator[tuple[str, str, str, str]]:
        """Stream (answer so far, summary, cache grid, status message) of one request, the first with nothing yet
        and an empty grid waiting for its cache report; bad input: the message, under an empty grid. Greedy, so
        an answer is the same whether its documents were cached or not; the repetition penalty (1: none) keeps
        it so."""
        request_id = self.monitor.new_request_id()
        try:
            self.check_model(recipe)
            prompt = build_prompt(
                self.composer,
                recipe,
                system or "",
                split_documents(documents_text),
                question or "",
                max_tokens,
                self.llm.config.scheduler.max_model_len,
            )
            penalty = check_repetition_penalty(repetition_penalty)
            params = mp.SamplingParams(max_tokens=int(max_tokens), temperature=0.0, repetition_penalty=penalty)
            # NOTE: validated here, queued below: the stream's outputs come through `outputs`, read with a timeout so
            # that the status line counts the seconds of a long prefill (LLM.stream would block until its first token)
            (req,) = self.llm.make_requests([prompt], [params], stream=True, request_id=request_id)
        except ValueError as e:  # InputError is one: outside the bounds; others: the engine's own checks
            self.last_axis[session] = REFUSED_AXIS_CAPTION
            yield "", "", grid_html([], REFUSED_GRID_CAPTION), warning(e)
            return
        self.monitor.start(request_id, session, prompt.token_ids)
        self.last_axis[session] = f"Waiting for request {request_id}'s state report…"
        grid, has_report = grid_html([], f"Waiting for request {request_id}'s cache report…"), False
        outputs: queue.SimpleQueue = queue.SimpleQueue()
        submitted = finished = False
        try:
            # NOTE: before the request is queued: until this frame the page still shows the previous answer and grid
            yield "", "", grid, status_line(request_id, None)
            if request_id in self.stopped:  # NOTE: Stop came before it was queued: the engine never knew it
                yield "", "", grid, status_line(request_id, "abort")
                return
            self.llm.submit([req], outputs.put)
            submitted, start, out = True, time.perf_counter(), None
            if request_id in self.stopped:  # NOTE: Stop came between the check above and the submit: its abort found
                self.llm.abort(request_id, wait=False)  # nothing; this one follows the submit in the loop's inbox
            while not finished:
                try:
                    item = outputs.get(timeout=HEARTBEAT_SECONDS)
                except queue.Empty:
                    if self.llm.closed:  # NOTE: a loop closed between a submit and its arrival never answers it
                        yield (out.text if out else ""), "", grid, warning("The engine has stopped.")
                        return
                    if out is None:  # queued or prefilling: say how far it is, and how long it has taken so far
                        waited = time.perf_counter() - start
                        yield "", "", grid, waiting_line(request_id, len(prompt), waited, self.progress(request_id))
                    continue
                finished = is_last(item)
                if isinstance(item, BaseException):  # the engine refused it, or a step failed (the loop logs why)
                    yield (out.text if out else ""), "", grid, warning(item)
                    return
                out = item
                self.monitor.update(request_id, out)
                if out.cache_report and not has_report:  # NOTE: the report is fixed at admission: draw it once
                    has_report = True
                    grid = self.grid(out, caption=f"request {request_id} ({recipe}): {len(prompt)} prompt tokens")
                if out.state_report is not None:  # hybrids: the checkpoints saved so far and the resume point
                    self.last_axis[session] = (request_id, token_axis(out.state_report, len(out.prompt_token_ids)))
                yield out.text, summary_markdown(out), grid, status_line(request_id, out.finish_reason, out.text)
        finally:
            try:
                # NOTE: left early (tab closed, event cancelled): free its blocks, without waiting for the engine's
                # step: gradio closes a generator on its event loop, which every tab shares
                if submitted and not finished and not self.llm.closed:
                    self.llm.abort(request_id, wait=False)
            finally:
                self.monitor.finish(request_id)
                self.stopped.discard(request_id)

    def check_model(self, recipe: str) -> None:
        if self.composer is None:
            raise InputError(
                f"{self.llm.config.model_dir} ships no tokenizer: the app composes text prompts. Serve a model "
                "directory with a tokenizer (or send token ids from Python: `LLM.generate`)."
            )
        check_recipe_for_model(recipe, self.is_hybrid)

    def grid(self, output, caption: str = "") -> str:
        return grid_html(grid_cells(output.cache_report, output.prompt_token_ids, self.llm.config.control), caption)

    def stop(self, session: str) -> str:
        """Abort the session's requests in flight (the Stop button, a closed tab)."""
        request_ids = self.monitor.requests_of(session)
        for request_id in request_ids:
            self.stopped.add(request_id)
            try:
                self.llm.abort(request_id)
            finally:
                if not self.monitor.is_in_flight(request_id):  # NOTE: its stream ended after requests_of: the id
                    self.stopped.discard(request_id)  # was added after its own discard, and would stay for good
        return f"stopped {', '.join(request_ids)}" if request_ids else "nothing to stop"

    def close_session(self, session: str) -> None:
        self.stop(session)
        self.last_axis.pop(session, None)

    # -- live views ---------------------------------------------------------------------------------------

    def tick(self) -> tuple:
        """(pool table, one hit rate over time per monitor.HIT_RATES, requests in flight, scheduler timeline),
        sampled now."""
        stats = self.stats()
        if stats is not None:
            self.monitor.record_stats(stats)
        control = self.llm.config.control
        waiting = self.monitor.awaiting_first_output()
        entries = []
        for rid, out in self.monitor.in_flight():
            if out is not None:
                cells = grid_cells(out.cache_report, out.prompt_token_ids, control)
                entries.append((rid, cells, f"{len(out.token_ids)} tokens so far"))
            elif rid in waiting:  # NOTE: not there: it started between the two reads (listed at the next tick)
                progress = None if stats is None else stats["prefill_progress"].get(rid)
                entries.append((rid, [], waiting_words(*waiting[rid], progress)))
        records = self.llm.engine.step_log.records()
        pool = WAITING_FOR_STATS if stats is None else pool_markdown(stats)
        return pool, *self.monitor.hit_rate_frames(), inflight_html(entries), timeline_frame(records)

    def stats(self) -> dict | None:
        """The engine's counters as of its last step boundary, without waiting out a long step (None at first)."""
        return self.monitor.latest_stats(self.llm.stats, STATS_WAIT_SECONDS)

    def progress(self, request_id: str) -> tuple[str, int, int] | None:
        """A request's (stage, prompt tokens in the cache, prompt tokens) in the engine's last counters (None: they
        predate it, or it has a token already, or the fetch failed: the stream goes on without it, and the next tick
        fetches again). NOTE: it waits for no fetch (one is started if none is under way): the heartbeat's line comes
        on time, with the counters of the fetch an earlier heartbeat or tick started."""
        try:
            stats = self.monitor.latest_stats(self.llm.stats, 0.0)
        except Exception:  # noqa: BLE001 -- a status line's detail: the stream goes on without it
            return None
        return None if stats is None else stats["prefill_progress"].get(request_id)

    def state_tick(self, session: str = "local") -> tuple[str, str, str]:
        """Hybrids: (the checkpoint store's table, the session's last request on its token axis, every request in
        flight on its axis), sampled now."""
        last = self.last_axis.get(session, NO_AXIS_CAPTION)
        in_flight = [
            (rid, token_axis(out.state_report, len(out.prompt_token_ids)))
            for rid, out in self.monitor.in_flight()
            if out is not None and out.state_report is not None
        ]
        stats = self.stats()
        return (
            WAITING_FOR_STATS if stats is None else state_markdown(stats),
            axis_html([], last) if isinstance(last, str) else axis_html([last]),
            axis_html(in_flight, "No request in flight."),
        )

    # -- checkpoints --------------------------------------------------------------------------------------

    def plan(self, source: str, budget, bin_size=DEFAULT_BIN_SIZE):
        """The Plan button: `plan_checkpoints`, or for refused input an empty panel under the message (an earlier
        plan left on screen would read as the answer to the refused input)."""
        try:
            return self.plan_checkpoints(source, budget, bin_size)
        except InputError as e:
            return *no_plan(), warning(e)
        except (ValueError, TypeError) as e:
            # NOTE: the planner's own checks on input the form let through (a bin size of 0, a cleared dropdown's
            # None); logged with the traceback, so a bug that raises one is not hidden. Any other type is a bug: it
            # propagates (gradio's error toast over the old plan, and the server log)
            logger.exception("plan(%r, %r, %r) failed", source, budget, bin_size)
            return *no_plan(), warning(f"The planner refused this input: {e}")

    def plan_checkpoints(self, source: str, budget, bin_size=DEFAULT_BIN_SIZE):
        """(overlap histogram, positions per policy, table, caption) for the chosen request stream."""
        # NOTE: the slider's number box takes any number: 2.5 is refused, not quietly planned as 2
        if not isinstance(budget, int | float) or not 1 <= budget <= MAX_BUDGET or budget != int(budget):
            raise InputError(f"The budget must be a whole number from 1 to {MAX_BUDGET} checkpoints, got {budget!r}.")
        budget, bin_size = int(budget), int(bin_size)
        requests = self.monitor.served_prompts() if source == APP_STREAM else bench_stream(source)
        if len(requests) < 2:
            raise InputError(
                "Generate a few prompts first (or pick a benchmark stream): there is nothing to learn from."
            )
        estimator = learn_overlaps(requests, budget, bin_size)
        num_tokens = len(requests[-1])
        weights = estimator.weights(num_tokens)
        rows = policy_plans(weights, budget, bin_size)
        caption = (
            f"Learned from {len(requests)} requests of *{source}* ({estimator.num_observations} overlaps seen); "
            f"planned for its last request (N = {num_tokens:,} tokens) with a budget of M = {budget}, on a "
            f"{bin_size}-token grid. `block` saves one every {BLOCK_POLICY_TOKENS} tokens (none in a shorter "
            "prompt); the others place up to M on the grid, `dp` where the learned histogram says they save most, "
            "the rest by fixed rules (two may round to one point)."
        )
        return histogram_frame(weights, bin_size), positions_frame(rows), plans_frame(rows), caption


@lru_cache(maxsize=len(BENCH_STREAMS))
def bench_stream(name: str) -> list[list[int]]:
    """The first requests of a benchmark stream (checkpoints/streams.py), as token ids."""
    from minipic_lite.checkpoints.streams import STREAMS, StreamSpec, load_tokenizer, tokenize

    if name not in STREAMS:
        raise InputError(f"Unknown stream {name!r}: choose one of {APP_STREAM!r}, {', '.join(STREAMS)}.")
    return tokenize(STREAMS[name](StreamSpec(num_requests=BENCH_STREAM_REQUESTS, num_prefixes=8)), load_tokenizer())


def warning(message) -> str:
    """A message for a Markdown line, HTML-escaped: the user's text in it (a document's opening, a marker's
    `<repo_name>`) would otherwise be read as HTML and vanish from the page (its Markdown marks still render)."""
    return f"⚠️ {html.escape(str(message), quote=False)}"


def waiting_line(request_id: str, num_prompt_tokens: int, seconds: float, progress=None) -> str:
    """The status line of a request with no token yet."""
    return f"{request_id}: {waiting_words(num_prompt_tokens, seconds, progress)}"


def waiting_words(num_prompt_tokens: int, seconds: float, progress: tuple[str, int, int] | None = None) -> str:
    """Where a request with no token yet stands: `progress` is its `LLMEngine.prefill_progress` entry in the engine's
    last counters, None where they do not know it (they predate it)."""
    n, so_far = f"{num_prompt_tokens:,}", f"{seconds:.0f} s so far…"
    if progress is None:
        return f"queued or prefilling its {n} prompt tokens, {so_far}"
    stage, in_cache, _ = progress
    if stage == "queued":
        return f"queued with its {n} prompt tokens, {so_far}"
    return f"prefilling its {n} prompt tokens: {in_cache:,} in the cache, {so_far}"


def status_line(request_id: str, finish_reason: str | None, text: str | None = None) -> str:
    """The line under the answer: the request, where it stands in words, and the engine's finish_reason (a finished
    answer with no text says so: an empty box alone reads as a fault)."""
    words = FINISH_WORDS.get(finish_reason, "done")
    if finish_reason == "stop" and text is not None and not text.strip():
        words += " before saying anything"
    return f"{request_id}: {words}" + (f" ({finish_reason})" if finish_reason else "")
