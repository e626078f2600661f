"""The web app's handlers and panels without a browser: composing and its bounds, the cache grid before and
after the documents move, stop and early exit abort, the live views, the checkpoint panel (and a hybrid model's
checkpoints on its requests' token axes), the CLI entry."""

import html
import re
import threading
import time
import uuid

import numpy as np
import pytest

from minipic_lite.cache_report import StateReport
from minipic_lite.checkpoints import expected_cost
from minipic_lite.spans import SegmentKind
from tests.hybrid_models import make_hybrid, make_hybrid_with_tokenizer
from ui import compose, texts
from ui import handlers as handlers_module
from ui.cache_view import grid_cells, grid_html, inflight_html
from ui.checkpoints_panel import (
    PLAN_COLUMNS,
    TokenAxis,
    axis_frame,
    axis_html,
    format_bytes,
    histogram_frame,
    plans_frame,
    policy_plans,
    state_markdown,
    token_axis,
)
from ui.compose import InputError
from ui.handlers import APP_STREAM, NO_AXIS_CAPTION, REFUSED_AXIS_CAPTION, Handlers
from ui.monitor import Monitor

pytest.importorskip("gradio", reason="the web app needs the [ui] extra: ./scripts/setup.sh installs it")


@pytest.fixture
def patient_stats(monkeypatch):
    """A tick waits for the engine's stats, however slow the machine (the app's 0.2 s shows the last ones)."""
    monkeypatch.setattr(handlers_module, "STATS_WAIT_SECONDS", 30)


@pytest.fixture(scope="module")
def handlers(llm):
    return Handlers(llm)


def unique_documents(num: int = 3) -> list[str]:
    """Bundled essays made unique to this run (a note in front), so their blocks start out uncached."""
    note = uuid.uuid4().hex[:8]
    return [f"Note {note}-{i}. {doc}" for i, doc in enumerate(list(texts.bundled_documents().values())[:num])]


def last(items):
    *_, item = items
    return item


def admitted(outputs):
    """The frame of a request's first output (admitted, its first token out), past the pending frame and any
    heartbeat frames (no summary yet) before it."""
    return next(frame for frame in outputs if frame[1])


# -- composing ------------------------------------------------------------------------------------------------


def test_documents_split_join_and_reorder():
    text = "first doc\n---\nsecond doc\n  ---  \nthird\n---\n"
    assert compose.split_documents(text) == ["first doc", "second doc", "third"]
    assert compose.split_documents(compose.reverse_documents(text)) == ["third", "second doc", "first doc"]
    assert compose.split_documents(compose.rotate_documents(text)) == ["third", "first doc", "second doc"]
    assert compose.split_documents("a --- b") == ["a --- b"]  # a separator is a line of its own


def test_prompt_cache_sections_are_modules_or_params():
    items = compose.schema(["a module", "param: 42 apples"])
    assert [type(i).__name__ for i in items] == ["Module", "Param"] and items[1].text == "42 apples"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("documents", ["d"] * (compose.MAX_DOCUMENTS + 1), "Too many documents"),
        ("documents", ["x" * (compose.MAX_DOCUMENT_CHARS + 1)], "Document 1 of 1 .* is too long"),
        ("system", "s" * (compose.MAX_SYSTEM_CHARS + 1), "system prompt is too long"),
        ("question", "q" * (compose.MAX_QUESTION_CHARS + 1), "question is too long"),
        ("question", "   ", "Write a question"),
        ("max_tokens", compose.MAX_NEW_TOKENS + 1, "Max new tokens"),
        ("max_tokens", 0, "Max new tokens"),
        ("max_tokens", None, "Max new tokens"),
        ("recipe", "nope", "Unknown recipe"),
    ],
)
def test_input_bounds_name_the_limit(field, value, message):
    fields = {"recipe": "block_attention", "system": "", "documents": ["d"], "question": "q?", "max_tokens": 8}
    fields[field] = value
    with pytest.raises(InputError, match=message):
        compose.check_inputs(**fields)


@pytest.mark.parametrize("value", [0.99, 2.01, None, "1.2", True, float("nan")])
def test_a_repetition_penalty_outside_the_slider_is_named(value):
    with pytest.raises(InputError, match=r"Repetition penalty must be a number from 1 to 2, got "):
        compose.check_repetition_penalty(value)
    assert compose.check_repetition_penalty(1) == 1.0 and compose.check_repetition_penalty(2) == 2.0


def test_a_too_long_document_is_named_by_its_opening_words():
    # the grid counts segments from 0 (doc 0, module 0), the message from 1: its opening words settle which one
    docs = ["A short one.", "Second   document\nopens" + " so" * compose.MAX_DOCUMENT_CHARS, "Third."]
    with pytest.raises(InputError) as e:
        compose.check_inputs("block_attention", "", docs, "Why?", 8)
    assert str(e.value) == (
        "Document 2 of 3 ('Second document opens so so so…') is too long: 12,023 characters (at most 4,000)."
    )


def test_a_prompt_longer_than_the_bound_is_refused_before_anything_runs(handlers, llm):
    docs = ["word " * 700] * 6  # ~4,200 tokens: under the character bounds, over the token bound
    answer, summary, _, status = last(
        handlers.generate("block_attention", "", compose.join_documents(docs), "Why?", 8, "s-long")
    )
    assert (answer, summary) == ("", "") and "The prompt is too long" in status
    assert handlers.monitor.in_flight() == [] and llm.stats()["num_waiting"] == 0


def test_a_refused_input_clears_the_grid_of_the_sessions_last_request(handlers):
    """The last request's blocks under a refusal's message would read as the refused input's blocks."""
    docs = compose.join_documents(unique_documents(1))
    *_, (_, _, grid, _) = handlers.generate("block_attention", "", docs, "Why?", 2, "s-refused")
    assert grid_blocks(grid)
    *_, (answer, summary, grid, status) = handlers.generate("block_attention", "", docs, "  ", 2, "s-refused")
    assert (answer, summary, status) == ("", "", "⚠️ Write a question.")
    assert grid == grid_html([], "No blocks: the input was refused, nothing ran.")


def test_a_new_request_shows_a_pending_grid_not_the_previous_requests(handlers, llm):
    """Until the new request's report arrives (after its prefill), the last one's grid would read as its blocks."""
    docs = compose.join_documents(unique_documents(1))
    *_, (_, _, grid, status) = handlers.generate("block_attention", "", docs, "Why?", 2, "s-pending")
    old_id = status.split(":")[0]
    assert grid_blocks(grid) and f"request {old_id} " in grid
    outputs = handlers.generate("block_attention", "", docs, "Why not?", 2, "s-pending")
    answer, summary, grid, status = next(outputs)  # the stream not started: nothing queued yet
    new_id = status.split(":")[0]
    assert new_id != old_id and (answer, summary, status) == ("", "", f"{new_id}: generating…")
    assert grid == grid_html([], f"Waiting for request {new_id}'s cache report…")
    outputs.close()  # left at the pending frame: nothing was queued, nothing stays in flight
    assert handlers.monitor.in_flight() == [] and llm.stats()["num_waiting"] == llm.stats()["num_running"] == 0


def test_stop_of_a_request_whose_stream_ended_meanwhile_keeps_no_id(handlers, monkeypatch):
    """Stop read the session's requests, then the stream ended (its `finally` discarding an id not yet added): the id
    Stop adds after it must not stay in `stopped` for the app's lifetime."""
    docs = compose.join_documents(unique_documents(1))
    *_, (_, _, _, status) = handlers.generate("block_attention", "", docs, "Why?", 2, "s-ended")
    request_id = status.split(":")[0]
    monkeypatch.setattr(handlers.monitor, "requests_of", lambda session: [request_id])  # as read before it ended
    assert handlers.stop("s-ended") == f"stopped {request_id}"
    assert handlers.stopped == set() and not handlers.monitor.is_in_flight(request_id)


def test_stop_at_the_pending_frame_keeps_the_request_from_running(handlers, llm):
    """Stop between the pending frame and the stream's first next(): the engine has not seen the request yet, so the
    abort alone would miss it and the request would run to its end."""
    docs = compose.join_documents(unique_documents(1))
    outputs = handlers.generate("block_attention", "", docs, "Why?", 32, "s-stop-early")
    request_id = next(outputs)[3].split(":")[0]
    assert handlers.stop("s-stop-early") == f"stopped {request_id}"
    frames = list(outputs)
    assert [status for *_, status in frames] == [f"{request_id}: stopped before the end (abort)"]
    assert frames[0][0] == ""  # no answer: nothing ran
    assert handlers.monitor.in_flight() == [] and handlers.stopped == set()
    assert llm.stats()["num_waiting"] == llm.stats()["num_running"] == 0


def test_the_prompt_bound_leaves_room_for_the_answer(handlers):
    docs, max_tokens = ["A short document."], 8
    num_tokens = len(handlers.composer.block_attention(None, docs, "Why?"))
    prompt = compose.build_prompt(handlers.composer, "block_attention", "", docs, "Why?", max_tokens, num_tokens + 8)
    assert len(prompt) == num_tokens  # prompt and answer fill the context exactly
    with pytest.raises(
        InputError, match=f"The prompt is too long: {num_tokens} tokens \\(at most {num_tokens - 1} here\\)"
    ):
        compose.build_prompt(handlers.composer, "block_attention", "", docs, "Why?", max_tokens, num_tokens + 7)


def test_build_prompt_strips_the_fields_and_gives_prompt_cache_its_schema(handlers):
    composer, docs = handlers.composer, ["A module.", "param: 42 apples"]
    built = compose.build_prompt(composer, "block_attention", "   ", docs, "  Why? ", 8, 2048)
    assert built.token_ids == composer.block_attention(None, docs, "Why?").token_ids  # a blank system: none
    built = compose.build_prompt(composer, "prompt_cache", "", docs, "Why?", 8, 2048)  # the composer takes a schema
    assert built.token_ids == composer.prompt_cache(None, compose.schema(docs), "Why?").token_ids


def test_generate_queues_the_recipes_prompt_of_every_field(handlers):
    """The prompt generate() queues (the token ids the monitor records as served) is the recipe's prompt of the
    form's system prompt, documents and question: none of them is dropped on the way."""
    system, docs = f"Be brief ({uuid.uuid4().hex[:8]}).", ["A short document.", "Another one."]
    *_, (_, _, _, status) = handlers.generate("prefix", system, compose.join_documents(docs), "Why?", 1, "s-fields")
    assert ": done" in status  # it ran
    assert handlers.monitor.served_prompts()[-1] == list(handlers.composer.prefix(system, docs, "Why?").token_ids)


@pytest.mark.parametrize(
    "system, documents, question, field",
    [
        ("", "first\n---\na <repo_name> b", "Why?", "Document 2 of 2 ('a <repo_name> b')"),
        ("Be <reponame> brief.", "a doc", "Why?", "The system prompt"),
        ("", "a doc", "Why <repo_name>?", "The question"),
    ],
)
def test_a_span_markers_text_in_a_field_is_refused_naming_the_field(handlers, system, documents, question, field):
    """Before: the composer's words, numbering pieces from 0 ("piece 1 (doc 0) contains the SSEP control token")."""
    marker = "<reponame>" if "<reponame>" in system else "<repo_name>"
    kind = "PDEP" if marker == "<reponame>" else "SSEP"
    *_, (answer, _, _, status) = handlers.generate("block_attention", system, documents, question, 8, "s-ctl")
    message = f"{field} holds '{marker}', the text of this model's {kind} span marker, which a field may not hold: "
    # NOTE: escaped: the status is Markdown, where `<repo_name>` would be read as an HTML tag and vanish
    assert answer == "" and status == "⚠️ " + html.escape(message + "remove it.", quote=False)
    assert "&lt;repo_name&gt;" in status or "&lt;reponame&gt;" in status
    assert handlers.monitor.in_flight() == []


# -- generate, the grid, and the documents moved --------------------------------------------------------------


CELL = re.compile(r"data-block='(\d+)' data-status='(\w+)' data-hash='(\w*)' data-label='([^']*)'")


def grid_blocks(grid_html: str) -> list[tuple[int, str, str, str]]:
    """(block, status, hash, segment label) of every cell of a drawn grid."""
    return [(int(b), status, h, label) for b, status, h, label in CELL.findall(grid_html)]


def doc_hashes(blocks, label: str) -> list[str]:
    return [h for _, _, h, lab in blocks if lab == label]


def test_reordered_documents_hit_with_the_same_hashes(handlers):
    docs = compose.join_documents(unique_documents())
    system = f"{texts.DEFAULT_SYSTEM} ({uuid.uuid4().hex[:8]})"  # NOTE: uncached whichever test ran before
    first = list(handlers.generate("block_attention", system, docs, "What is common?", 6, "s-grid"))
    answer, summary, grid, status = first[-1]
    assert answer and "length" in status and "0 cached" in summary
    assert len({a for a, *_ in first}) > 2, "the answer streams in, token by token"
    before = grid_blocks(grid)
    assert before and all(status == "computed" for _, status, _, _ in before)

    moved = compose.rotate_documents(docs)  # doc i of the new prompt was doc i - 1
    *_, (_, summary, grid, status) = handlers.generate("block_attention", system, moved, "What is common?", 6, "s-grid")
    after = grid_blocks(grid)
    for i in range(3):
        assert doc_hashes(after, f"doc {i}") == doc_hashes(before, f"doc {(i - 1) % 3}")  # same blocks, new offsets
    doc_cells = [b for b in after if b[3].startswith("doc")]
    assert doc_cells and all(status == "hit" for _, status, _, _ in doc_cells)
    assert after[-1][1:] == ("computed", "", "question")  # the partial question block: computed, no hash
    assert after[0][1] == "hit"  # the system turn is the same prefix


def test_documents_held_by_a_running_request_show_as_shared(handlers):
    docs = compose.join_documents(unique_documents(2))
    running = handlers.generate("block_attention", "", docs, "Tell me a long story.", 64, "s-holder")
    admitted(running)  # decoding: it holds the documents' blocks
    *_, (_, summary, grid, _) = handlers.generate(
        "block_attention", "", compose.reverse_documents(docs), "Why?", 2, "s-sharer"
    )
    running.close()
    doc_cells = re.findall(r"class='([^']*)'[^>]*data-label='doc \d'", grid)
    assert doc_cells and all("hit" in c and "shared" in c for c in doc_cells)
    assert int(re.search(r"(\d+) shared", summary).group(1)) >= len(doc_cells)  # the system turn's blocks too


def test_grid_cells_mark_markers_and_padding(handlers, llm):
    import minipic_lite as mp

    prompt = handlers.composer.block_attention(None, unique_documents(2), "Why?")
    out = llm.generate(prompt, mp.SamplingParams(max_tokens=1), use_tqdm=False)[0]
    cells = grid_cells(out.cache_report, out.prompt_token_ids, llm.config.control)
    for seg in prompt.segments:
        first = next(c for c in cells if c.span_id == seg.index)
        assert first.start <= seg.start < first.end  # each segment's cells start at its block
        if seg.index < len(prompt.segments) - 1:
            assert seg.end % 16 == 0  # padded: the next marker starts a block
    num_pad = sum(c.num_pad_tokens for c in cells)
    assert num_pad > 0 and num_pad == prompt.token_ids.count(llm.config.control.pad_id)


# -- stop, a closed tab, the live views -------------------------------------------------------------------------


def test_stop_aborts_the_sessions_request(handlers, llm):
    aborted_before = llm.stats()["num_aborted"]
    outputs = handlers.generate("prefix", "", "A short document.", "Tell me a long story.", 256, "s-stop")
    admitted(outputs)  # the first token is out: the request is running
    assert handlers.monitor.requests_of("s-stop")
    assert handlers.stop("s-stop").startswith("stopped ui-")
    *_, (_, summary, _, status) = outputs
    assert "abort" in status and "(abort)" in summary
    assert handlers.monitor.in_flight() == [] and llm.stats()["num_aborted"] == aborted_before + 1


def test_closing_a_session_aborts_its_requests_and_forgets_its_views(handlers, llm):
    aborted_before = llm.stats()["num_aborted"]
    outputs = handlers.generate("prefix", "", "A short document.", "Tell me a long story.", 256, "s-close")
    _, summary, grid, _ = admitted(outputs)  # its report drawn
    num_prompt = int(re.search(r"\*\*prompt tokens\*\* (\d+):", summary).group(1))
    assert f"(prefix): {num_prompt} prompt tokens" in grid and "s-close" in handlers.last_axis
    assert handlers.stop("s-nobody") == "nothing to stop"
    handlers.close_session("s-close")  # the tab was closed
    *_, (_, _, _, status) = outputs
    assert status.endswith("stopped before the end (abort)") and "s-close" not in handlers.last_axis
    assert handlers.monitor.in_flight() == [] and llm.stats()["num_aborted"] == aborted_before + 1


def test_leaving_the_stream_early_aborts_the_request(handlers, llm):
    aborted_before = llm.stats()["num_aborted"]
    outputs = handlers.generate("prefix", "", "A short document.", "Tell me a long story.", 256, "s-gone")
    admitted(outputs)
    outputs.close()  # what gradio does to the generator of a closed tab
    assert handlers.monitor.in_flight() == [] and llm.stats()["num_aborted"] == aborted_before + 1
    assert llm.stats()["num_running"] == 0


class LongFirstStep:
    """An LLM whose engine loop is held `seconds` (as by a long CPU prefill step) before a request's first output:
    the loop thread itself sleeps, so `stats()` and `abort()` wait as they would for a real step."""

    def __init__(self, llm, seconds: float):
        self._llm, self.seconds = llm, seconds

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def submit(self, requests, sink):
        first = [True]

        def late_first(output):
            if first[0]:
                first[0] = False
                time.sleep(self.seconds)  # NOTE: on the engine loop's thread: nothing else runs meanwhile
            sink(output)

        self._llm.submit(requests, late_first)


def test_a_long_step_neither_freezes_the_views_nor_leaves_the_request_silent(llm, monkeypatch):
    """While the engine's step runs, the requester's status line counts the seconds (a frame each heartbeat), and a
    tick answers at once: the pool from the last stats (none yet: a line saying so), the request listed as waiting
    with its prompt's size. Before: the tick waited for the step, and nothing moved on the page until the first
    token."""
    monkeypatch.setattr(handlers_module, "HEARTBEAT_SECONDS", 0.1)
    h = Handlers(LongFirstStep(llm, seconds=1.5))
    outputs = h.generate("prefix", "", "", "Name a color.", 2, "s-long-step")
    request_id = next(outputs)[3].split(":")[0]  # the pending frame
    waiting = next(outputs)  # no output within a heartbeat: the seconds so far
    assert waiting[:2] == ("", "") and re.fullmatch(
        rf"{request_id}: queued or prefilling its \d+ prompt tokens, 0 s so far…", waiting[3]
    )
    start = time.perf_counter()
    pool, *_, inflight, _ = h.tick()
    assert time.perf_counter() - start < 1.0  # the step still runs: the tick did not wait for it
    assert pool == handlers_module.WAITING_FOR_STATS and f"request {request_id}: queued or prefilling" in inflight
    frames = list(outputs)
    waiting = r"its \d+ prompt tokens(?:: [\d,]+ in the cache)?, (\d+) s so far"  # queued, or prefilling
    seconds = [int(m.group(1)) for f in frames if (m := re.search(waiting, f[3]))]
    assert len(seconds) >= 5 and seconds == sorted(seconds) and seconds[-1] >= 1  # counted up through the step
    assert frames[-1][3] == f"{request_id}: done: it reached the new-token limit (length)"
    assert "blocks used / free / total" in h.tick()[0]  # the step over: the counters are back


class Proxy:
    """The LLM with `submit` (and `closed`) replaced: what the engine loop does with a request, scripted."""

    def __init__(self, llm, submit, closed=False):
        self._llm, self.submit, self._closed = llm, submit, closed

    def __getattr__(self, name):
        return getattr(self._llm, name)

    @property
    def closed(self):
        return self._closed


def test_a_stop_between_the_check_and_the_submit_still_aborts(llm):
    """Stop landed after generate() looked for it and before the request reached the loop: the Stop's own abort
    found nothing, so generate() aborts it once submitted (before: it ran to its token limit)."""
    h = Handlers(llm)
    h = Handlers(Proxy(llm, lambda requests, sink: (h.stopped.add(requests[0].request_id), llm.submit(requests, sink))))
    *_, (_, _, _, status) = h.generate("prefix", "", "", "Tell me a long story.", 200, "s-stop-race")
    assert status.endswith(": stopped before the end (abort)")


def test_an_error_for_the_request_and_a_stopped_engine_end_the_stream_with_a_message(llm, monkeypatch):
    """The loop's error for a request (a failed step) is the status line's message; a loop closed before it took the
    request never answers: the heartbeat notices and says so, where it waited forever."""
    monkeypatch.setattr(handlers_module, "HEARTBEAT_SECONDS", 0.05)
    failing = Handlers(Proxy(llm, lambda requests, sink: sink(RuntimeError("the step failed: <boom>"))))
    *_, (answer, _, _, status) = failing.generate("prefix", "", "", "Why?", 4, "s-error")
    assert (answer, status) == ("", "⚠️ the step failed: &lt;boom&gt;") and failing.monitor.in_flight() == []
    silent = Handlers(Proxy(llm, lambda requests, sink: None, closed=True))
    *_, (_, _, _, status) = silent.generate("prefix", "", "", "Why?", 4, "s-closed")
    assert status == "⚠️ The engine has stopped." and silent.monitor.in_flight() == []


def test_two_sessions_at_once_each_get_their_own_answer(handlers, llm):
    import minipic_lite as mp

    questions = {"s-a": "Name a fruit.", "s-b": "Name a planet."}
    answers = {}

    def run(session):
        *_, (answer, *_rest) = handlers.generate("prefix", "", "", questions[session], 12, session)
        answers[session] = answer

    threads = [threading.Thread(target=run, args=(s,)) for s in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for session, question in questions.items():
        alone = handlers.composer.prefix(None, [], question)
        expected = llm.generate(alone, mp.SamplingParams(max_tokens=12, temperature=0.0), use_tqdm=False)[0].text
        assert answers[session] == expected


def test_the_repetition_penalty_reaches_the_answer_and_a_bad_one_queues_nothing(handlers, llm):
    """The slider's penalty: the answer is the API's greedy answer with the same penalty (not the plain one's); one
    outside the slider is a message under an empty grid, and nothing is queued."""
    import minipic_lite as mp

    question = "Write a short story about a cat who learns to fly."
    *_, (answer, _, _, status) = handlers.generate("prefix", "", "", question, 40, "s-penalty", 1.3)
    assert ": done" in status
    prompt = handlers.composer.prefix(None, [], question)
    outs = [llm.generate(prompt, mp.SamplingParams(max_tokens=40, temperature=0.0, repetition_penalty=r),
                         use_tqdm=False)[0].text for r in (1.3, 1.0)]  # fmt: skip
    assert answer == outs[0] != outs[1]
    served = len(handlers.monitor.served_prompts())
    ((answer, summary, grid, message),) = list(handlers.generate("prefix", "", "", question, 40, "s-penalty", 2.5))
    assert "Repetition penalty must be a number from 1 to 2, got 2.5" in message and answer == summary == ""
    assert len(handlers.monitor.served_prompts()) == served


def test_tick_shows_the_pool_the_hit_rate_and_the_timeline(handlers, patient_stats):
    *_, (_, _, _, status) = handlers.generate(
        "block_attention", "", compose.join_documents(unique_documents(2)), "Why?", 3, "s-tick"
    )
    pool, block_rate, token_rate, inflight, timeline = handlers.tick()
    assert "blocks used / free / total" in pool
    for hit_rate in (block_rate, token_rate):
        assert list(hit_rate.columns) == ["seconds", "hit rate"] and len(hit_rate) >= 1
    assert "No request in flight" in inflight
    totals = timeline.groupby("kind")["tokens"].sum()
    assert totals["span prefill"] > 0 and totals["final prefill"] > 0 and totals["decode"] > 0


def test_waiting_words_say_where_a_request_with_no_token_stands():
    assert handlers_module.waiting_words(3800, 7.4) == "queued or prefilling its 3,800 prompt tokens, 7 s so far…"
    queued = handlers_module.waiting_words(3800, 7.6, ("queued", 0, 3800))
    assert queued == "queued with its 3,800 prompt tokens, 8 s so far…"
    prefilling = handlers_module.waiting_words(3800, 12.0, ("prefilling", 1536, 3800))
    assert prefilling == "prefilling its 3,800 prompt tokens: 1,536 in the cache, 12 s so far…"


def test_a_long_prefill_shows_its_tokens_in_the_cache_as_its_chunks_are_computed(model_dir, monkeypatch):
    """64-token steps, each held 0.3 s: the status line, and the in-flight list of a tick, say how many of the
    prompt's tokens are in the cache (64, 128, ...: the engine's last counters) until the first token. Before, they
    said "queued or prefilling" throughout."""
    import minipic_lite as mp

    monkeypatch.setattr(handlers_module, "HEARTBEAT_SECONDS", 0.1)
    llm = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=2048, max_num_batched_tokens=64)
    try:
        step = llm.engine.step

        def slow_step():
            outputs = step()
            time.sleep(0.3)
            return outputs

        monkeypatch.setattr(llm.engine, "step", slow_step)
        h = Handlers(llm)
        docs = compose.join_documents(unique_documents(3))
        frames, inflight = [], None
        for frame in h.generate("prefix", "", docs, "Why?", 2, "s-progress"):
            frames.append(frame)
            if inflight is None and ": 64 in the cache" in frame[3]:
                inflight = h.tick()[3]
    finally:
        llm.close()
    found = [re.search(r"prefilling its ([\d,]+) prompt tokens: ([\d,]+) in the cache", f[3]) for f in frames]
    found = [(int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))) for m in found if m]
    (n,) = {n for n, _ in found}
    counts = [c for _, c in found]
    assert n > 3 * 64 and len(set(counts)) >= 3 and counts == sorted(counts)
    assert all(c % 64 == 0 and 0 < c < n for c in counts)
    assert inflight is not None and re.search(r"prefilling its [\d,]+ prompt tokens: \d+ in the cache", inflight)
    assert frames[-1][3].endswith("(length)")


def test_tick_draws_each_request_in_flight_and_its_blocks_once_it_has_an_output(handlers, llm):
    """A request with no output yet (queued, or in a long prefill) is listed with its prompt's size and the seconds
    it has waited; one with an output, with its tokens so far and its blocks."""
    import minipic_lite as mp

    out = llm.generate("Count to three.", mp.SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)[0]
    monitor = handlers.monitor
    monitor.start("ui-queued", "s-tick-2", out.prompt_token_ids)  # queued: no output yet
    monitor.start("ui-running", "s-tick-2", out.prompt_token_ids)
    monitor.update("ui-running", out)
    try:
        inflight = handlers.tick()[3]
    finally:
        monitor.finish("ui-queued")
        monitor.finish("ui-running")
    n = len(out.prompt_token_ids)
    assert "request ui-running: 3 tokens so far" in inflight
    assert f"request ui-queued: queued or prefilling its {n} prompt tokens, 0 s so far" in inflight
    assert inflight.count("data-block=") == len(out.cache_report)  # the queued one has no blocks to draw yet


def test_each_hit_rate_has_a_plot_of_its_own(llm):
    """The two prompt hit rates are often equal: drawn in one plot, one line hides the other."""
    import gradio as gr

    from ui import build_demo

    monitor = Monitor()
    monitor.record_stats({"prompt_block_hit_rate": 0.5, "prompt_token_hit_rate": 0.25})
    monitor.record_stats({"prompt_block_hit_rate": 0.75, "prompt_token_hit_rate": 0.75})
    block_rate, token_rate = monitor.hit_rate_frames()
    assert block_rate["hit rate"].tolist() == [0.5, 0.75] and token_rate["hit rate"].tolist() == [0.25, 0.75]
    assert list(block_rate.columns) == list(token_rate.columns) == ["seconds", "hit rate"]
    plots = [b for b in build_demo(llm).blocks.values() if isinstance(b, gr.LinePlot)]
    assert [(p.label, p.elem_id, p.color) for p in plots] == [
        ("Prompt blocks hit, over time", "prompt-block-hit-rate", None),  # one line per plot
        ("Prompt tokens hit, over time", "prompt-token-hit-rate", None),
    ]


def test_every_bar_plot_scales_from_zero_and_both_plan_events_share_one_queue(llm):
    """gradio leaves zero out of a plot's scale unless y_lim says otherwise, and vega starts bars at the scale's
    least value: a decode plot of steps of one token, or of one and two, drew the least as 0 px. And the Plan
    button's clear and plan share one queue, so a second click's clear waits for the first plan."""
    import gradio as gr

    from ui import build_demo

    demo = build_demo(llm)
    plots = {b.elem_id: b.y_lim for b in demo.blocks.values() if isinstance(b, gr.BarPlot)}
    assert plots == {"timeline": [0, None], "timeline-decode": [0, None], "histogram": [0, None]}
    (histogram,) = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "histogram"]
    plan_events = [fn for fn in demo.fns.values() if any(out is histogram for out in fn.outputs)]
    assert len(plan_events) == 2 and {fn.concurrency_id for fn in plan_events} == {"plan"}


def test_step_log_counts_span_prefill_final_prefill_and_decode(handlers, llm):
    import minipic_lite as mp

    prompt = handlers.composer.block_attention("Be brief.", unique_documents(2), "Why?")
    since = llm.engine.step_log.records()[-1].index + 1
    out = llm.generate(prompt, mp.SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)[0]
    records = llm.engine.step_log.records(since)
    span_tokens = sum(s.end - s.start for s in prompt.segments if s.kind is SegmentKind.SSEP)
    assert out.num_cached_tokens == 0
    assert sum(r.num_span_prefill_tokens for r in records) == span_tokens
    assert sum(r.num_final_prefill_tokens for r in records) == len(prompt) - span_tokens
    assert sum(r.num_decode_tokens for r in records) == 3  # the first token is sampled at the end of prefill


def test_inflight_view_shows_blocks_never_text(handlers, llm):
    import minipic_lite as mp

    docs = unique_documents(1)
    prompt = handlers.composer.block_attention(None, docs, "Why?")
    out = llm.generate(prompt, mp.SamplingParams(max_tokens=1), use_tqdm=False)[0]
    html = inflight_html([("ui-7", grid_cells(out.cache_report, out.prompt_token_ids, llm.config.control), "1 token")])
    assert "ui-7" in html and "data-status=" in html
    assert docs[0][:20] not in html and "Why?" not in html


# -- checkpoints --------------------------------------------------------------------------------------------


def test_policy_plans_dp_is_never_worse():
    rng = np.random.default_rng(0)
    weights = rng.random(513) * (rng.random(513) < 0.1)
    rows = policy_plans(weights, 4, 64)
    costs = {r["policy"]: r["expected_recompute"] for r in rows}
    assert costs["dp"] <= min(costs.values()) + 1e-9
    for r in rows:
        assert len(r["positions"]) <= 4 and all(p % 64 == 0 for p in r["positions"])
        assert r["expected_recompute"] == pytest.approx(expected_cost(weights, r["positions"]))
    assert histogram_frame(weights, 64)["mass"].sum() == pytest.approx(1.0)


def test_the_policies_table_has_its_columns_before_the_first_plan():
    assert list(plans_frame([]).columns) == list(PLAN_COLUMNS)  # not gradio's placeholder headers 1, 2, 3


def test_a_refused_plan_clears_the_earlier_plan(handlers):
    """The Plan button: the charts and table of an earlier plan under a refusal's message would read as its answer."""
    histogram, positions, table, caption = handlers.plan("system_prompts", 4)
    assert (len(table), caption[:28]) == (5, "Learned from 60 requests of ")
    assert len(histogram) > 0 and len(positions) > 0
    histogram, positions, table, caption = handlers.plan("system_prompts", 2.5)
    assert caption == "⚠️ The budget must be a whole number from 1 to 32 checkpoints, got 2.5."
    assert (histogram, positions) == (None, None)  # the plots empty, as before the first plan
    assert list(table.columns) == list(PLAN_COLUMNS) and len(table) == 0


def test_plan_checkpoints_on_a_bench_stream_and_on_the_apps_prompts(handlers):
    histogram, positions, table, caption = handlers.plan_checkpoints("system_prompts", 4)
    assert list(table["policy"]) == ["block", "balanced", "logarithmic", "sqrt", "dp"]
    assert "Learned from 60 requests" in caption and histogram["mass"].sum() == pytest.approx(1.0)
    assert set(positions["policy"]) <= set(table["policy"])
    for budget in (0, 33, 2.5, float("nan"), None):  # the number box takes any number: a fraction is not quietly cut
        with pytest.raises(InputError, match="budget must be a whole number from 1 to 32"):
            handlers.plan_checkpoints("system_prompts", budget)
    for budget in (1, 2.0, 32):  # both ends of the range are taken
        assert f"with a budget of M = {int(budget)}, on a" in handlers.plan_checkpoints("system_prompts", budget)[3]
    fresh = Handlers(handlers.llm)
    with pytest.raises(InputError, match="Generate a few prompts first"):
        fresh.plan_checkpoints(APP_STREAM, 4)
    for question in ("Why?", "Why not?"):  # NOTE: its own prompts, so that it passes alone as after the others
        list(fresh.generate("block_attention", "", "A short document.", question, 2, "s-plan"))
    _, _, table, _ = fresh.plan_checkpoints(APP_STREAM, 2, 16)
    assert len(table) == 5


def test_plan_on_the_apps_prompts_learns_from_two_and_plans_for_the_latest(llm):
    h = Handlers(llm)
    h.monitor.start("r0", "s", list(range(40)))
    with pytest.raises(InputError, match="Generate a few prompts first"):  # one prompt: no overlap to learn
        h.plan_checkpoints(APP_STREAM, 2, 16)
    h.monitor.start("r1", "s", list(range(30)) + list(range(100, 140)))  # 70 tokens, 30 shared with the first
    caption = h.plan_checkpoints(APP_STREAM, 2, 16)[3]
    assert caption.startswith(f"Learned from 2 requests of *{APP_STREAM}*") and "(N = 70 tokens)" in caption
    h.monitor.start("r2", "s", list(range(30)) + list(range(200, 255)))  # the latest is a third: 85 tokens
    caption = h.plan_checkpoints(APP_STREAM, 2, 16)[3]
    assert caption.startswith(f"Learned from 3 requests of *{APP_STREAM}*") and "(N = 85 tokens)" in caption


def test_an_unknown_stream_gets_a_message_not_a_crash(handlers):
    histogram, positions, table, caption = handlers.plan("no such stream", 4)
    assert caption.startswith("⚠️ Unknown stream 'no such stream': choose one of ")
    assert (histogram, positions, len(table)) == (None, None, 0)


@pytest.mark.parametrize(
    "bin_size, message",
    [(0, "bin_size must be an integer >= 1, got 0"), (None, "int() argument must be")],
    ids=["planner-ValueError", "cleared-dropdown-TypeError"],
)
def test_a_plan_the_planner_refuses_clears_the_earlier_plan_and_is_logged(handlers, bin_size, message, caplog):
    assert len(handlers.plan("system_prompts", 4)[2]) == 5  # an earlier plan on screen
    with caplog.at_level("ERROR", logger="ui.handlers"):
        histogram, positions, table, caption = handlers.plan("system_prompts", 4, bin_size)
    assert caption.startswith(f"⚠️ The planner refused this input: {html.escape(message, quote=False)}")
    assert (histogram, positions, len(table)) == (None, None, 0)
    (record,) = caplog.records  # not swallowed: the server log has it, with its traceback
    assert record.exc_info is not None and record.getMessage().startswith("plan('system_prompts', 4, ")


def test_a_bug_in_planning_is_not_dressed_up_as_a_refusal(handlers, monkeypatch):
    def broken(*args):
        raise KeyError("a bug")

    monkeypatch.setattr(handlers, "plan_checkpoints", broken)
    with pytest.raises(KeyError, match="a bug"):  # gradio's error toast and the server log, not a user's message
        handlers.plan("system_prompts", 4)


# -- a hybrid model's checkpoints -------------------------------------------------------------------------------

AXIS_SEGMENT = re.compile(
    r"mp-axis-seg (\w+)' data-start='(\d+)' data-end='(\d+)' style='left:([\d.]+)%;width:([\d.]+)%'"
)
AXIS_MARK = re.compile(r"mp-axis-mark (\w+)' data-position='(\d+)' style='left:([\d.]+)%'")


def test_a_state_report_on_its_token_axis():
    report = StateReport(64, 36, planned_checkpoints=(32, 64, 96), saved_checkpoints=(96,), state_memory_bytes=4096)
    axis = token_axis(report, 100)
    assert axis == TokenAxis(100, 64, (32, 64, 96), (96,))
    assert axis.segments == [(0, 64, "resumed"), (64, 100, "recomputed")]
    assert axis.marks == [(32, "planned"), (64, "planned"), (96, "saved"), (64, "resume")]
    assert axis_frame(axis).values.tolist() == [[32, "planned"], [64, "planned"], [96, "saved"], [64, "resume"]]
    drawn = axis_html([("ui-3", axis)])
    assert AXIS_SEGMENT.findall(drawn) == [
        ("resumed", "0", "64", "0.00", "64.00"),  # kind, start, end, left %, width %
        ("recomputed", "64", "100", "64.00", "36.00"),
    ]
    assert AXIS_MARK.findall(drawn) == [
        ("planned", "32", "32.00"),  # mark, position, left %
        ("planned", "64", "64.00"),
        ("saved", "96", "96.00"),
        ("resume", "64", "64.00"),
    ]
    assert "ui-3: 100 prompt tokens: resumed at 64, 36 recomputed; checkpoints saved at 96" in drawn

    cold = token_axis(StateReport(0, 40, (16, 32), (16, 32), 0), 40)  # computed from the start: no resume mark
    assert cold.segments == [(0, 40, "recomputed")] and cold.marks == [(16, "saved"), (32, "saved")]
    assert "40 prompt tokens: computed from the start, 40 recomputed; checkpoints saved at 16, 32" in axis_html(
        [("ui-4", cold)]
    )
    assert "No request in flight." in axis_html([], "No request in flight.")


def test_state_table_from_the_stats():
    stats = {"state_memory_bytes": 66 * 2**10, "state_budget_bytes": 2**29, "num_checkpoints": 4,
             "num_checkpoints_saved": 7, "num_checkpoints_moved": 2, "num_checkpoints_evicted": 1, "num_resumed": 2,
             "num_resumed_tokens": 1234, "num_recomputed_prompt_tokens": 56}  # fmt: skip
    assert state_markdown(stats).splitlines()[2:] == [
        "| state memory used / budget | 66.0 KiB / 512.0 MiB (0.01%) |",
        "| checkpoints held | 4 |",
        "| checkpoints saved / moved / evicted | 7 / 2 / 1 |",  # held 4 = 7 - 2 - 1
        "| requests resumed from a checkpoint | 2 |",
        "| prompt tokens resumed / recomputed | 1,234 / 56 |",
    ]
    assert "(no checkpoints: state_cache_gib=0)" in state_markdown(stats | {"state_budget_bytes": 0})
    assert state_markdown({"num_blocks": 8}) == ""  # an attention-only model: no table
    assert [format_bytes(n) for n in (100, 1536, 3 * 2**30)] == ["100 B", "1.5 KiB", "3.0 GiB"]


@pytest.fixture(scope="module")
def hybrid_llm(tmp_path_factory, model_dir):
    import minipic_lite as mp

    path = tmp_path_factory.mktemp("hybrid-app")
    make_hybrid_with_tokenizer(path, model_dir)
    return mp.LLM(str(path), device="cpu", dtype="float32", checkpoints_per_entry=2)


def test_a_hybrid_resumes_a_shared_prefix_and_the_panel_draws_it(hybrid_llm, patient_stats):
    h = Handlers(hybrid_llm)
    docs = compose.join_documents(unique_documents(2))
    *_, (answer, _, _, status) = h.generate("block_attention", "", docs, "Why?", 4, "s-hyb")
    assert answer == "" and "This model is a hybrid" in status and "Use prefix" in status
    assert hybrid_llm.stats()["num_waiting"] == 0

    *_, (_, _, _, status) = h.generate("prefix", texts.DEFAULT_SYSTEM, docs, "What is common?", 4, "s-hyb")
    first_id, first = h.last_axis["s-hyb"]
    assert first.resume_position == 0 and first.saved == first.planned and len(first.saved) == 2
    *_, (_, summary, _, _) = h.generate("prefix", texts.DEFAULT_SYSTEM, docs, "Why?", 4, "s-hyb")
    second_id, second = h.last_axis["s-hyb"]
    prompts = h.monitor.served_prompts()[-2:]
    shared = next(i for i, (a, b) in enumerate(zip(*prompts, strict=False)) if a != b)  # the questions differ from here
    assert second_id != first_id and second.resume_position == max(p for p in first.saved if p <= shared) > 0

    table, last, in_flight = h.state_tick("s-hyb")
    stats = hybrid_llm.stats()
    saved, moved = stats["num_checkpoints_saved"], stats["num_checkpoints_moved"]
    assert f"| checkpoints saved / moved / evicted | {saved} / {moved} / 0 |" in table
    assert f"| checkpoints held | {saved - moved} |" in table  # the table adds up: nothing evicted here
    assert stats["num_checkpoints_saved"] == len(first.saved) + len(second.saved) and stats["num_resumed"] == 1
    assert f"data-request='{second_id}'" in last and "No request in flight." in in_flight
    assert ("resume", str(second.resume_position)) in [m[:2] for m in AXIS_MARK.findall(last)]

    running = h.generate("prefix", "", docs, "Tell me a long story.", 64, "s-hyb-2")
    admitted(running)  # decoding: in flight, with its state report
    (rid,) = h.monitor.requests_of("s-hyb-2")
    _, mine, in_flight = h.state_tick("s-hyb-2")
    running.close()
    assert f"data-request='{rid}'" in in_flight and f"data-request='{rid}'" in mine


def test_a_refused_generate_clears_the_sessions_last_token_axis(hybrid_llm):
    """The last request's axis under a refusal's message would read as the refused input's, as its grid would."""
    h = Handlers(hybrid_llm)
    docs = compose.join_documents(unique_documents(1))
    assert h.state_tick("s-hyb-refused")[1] == axis_html([], NO_AXIS_CAPTION)
    *_, (_, _, _, status) = h.generate("prefix", "", docs, "Why?", 2, "s-hyb-refused")
    old_id = status.split(":")[0]
    assert f"data-request='{old_id}'" in h.state_tick("s-hyb-refused")[1]
    *_, (_, _, grid, status) = h.generate("epic", "", docs, "Why?", 2, "s-hyb-refused")
    assert "This model is a hybrid" in status and grid_blocks(grid) == []
    assert h.state_tick("s-hyb-refused")[1] == axis_html([], REFUSED_AXIS_CAPTION)


def test_a_new_request_on_a_hybrid_shows_a_pending_axis_not_the_previous_ones(hybrid_llm):
    h = Handlers(hybrid_llm)
    docs = compose.join_documents(unique_documents(1))
    *_, (_, _, _, status) = h.generate("prefix", "", docs, "Why?", 2, "s-hyb-pending")
    old_id = status.split(":")[0]
    outputs = h.generate("prefix", "", docs, "Why not?", 2, "s-hyb-pending")
    new_id = next(outputs)[3].split(":")[0]  # the pending frame: the stream not started
    _, last, _ = h.state_tick("s-hyb-pending")
    outputs.close()
    assert new_id != old_id and last == axis_html([], f"Waiting for request {new_id}'s state report…")


def test_the_app_on_a_hybrid_composes_with_prefix_only(hybrid_llm, llm):
    from ui import build_demo

    def recipes(demo):
        (radio,) = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "recipe"]
        return [value for _, value in radio.choices], radio.value

    assert recipes(build_demo(hybrid_llm)) == (["prefix"], "prefix")
    # Llama: every recipe, block_attention picked (the intro's reorder-and-hit tour needs a span recipe)
    assert recipes(build_demo(llm)) == (["prefix", "block_attention", "epic", "prompt_cache"], "block_attention")
    assert not Handlers(llm).is_hybrid and state_markdown(llm.stats()) == ""


def test_the_hybrid_apps_timer_redraws_its_checkpoint_panel_for_the_callers_session(
    hybrid_llm, llm, monkeypatch, patient_stats
):
    """The hybrid's panel (the store's table, your last request, those in flight) is redrawn by the app's timer
    through Handlers.state_tick with the tab's session; an attention-only model's app has no such panel to tick."""
    import types

    import gradio as gr

    from ui import app, build_demo

    def state_ticks(demo):
        ticks = [fn for fn in demo.fns.values() if any(isinstance(demo.blocks.get(i), gr.Timer) for i, _ in fn.targets)]
        return [fn for fn in ticks if (fn.outputs[0].elem_id or "").startswith("state-")]

    h = Handlers(hybrid_llm)
    monkeypatch.setattr(app, "Handlers", lambda served: h)
    (tick,) = state_ticks(build_demo(hybrid_llm))
    assert [view.elem_id for view in tick.outputs] == ["state-stats", "state-last", "state-inflight"]
    list(h.generate("prefix", texts.DEFAULT_SYSTEM, compose.join_documents(unique_documents(1)), "Why?", 2, "s-timer"))
    drawn = tick.fn(types.SimpleNamespace(session_hash="s-timer"))
    assert tuple(drawn) == tuple(h.state_tick("s-timer")) and drawn[1] != h.state_tick("s-other")[1]
    monkeypatch.undo()
    assert state_ticks(build_demo(llm)) == []


def test_a_model_without_a_tokenizer_gets_a_message(tmp_path):
    import gradio as gr

    import minipic_lite as mp
    from ui import build_demo

    make_hybrid(tmp_path)  # token ids only
    llm = mp.LLM(str(tmp_path), device="cpu", dtype="float32")
    assert isinstance(build_demo(llm), gr.Blocks)  # the app starts
    h = Handlers(llm)
    *_, (answer, _, _, status) = h.generate("prefix", "", "A document.", "Why?", 4, "s-notok")
    assert answer == "" and "ships no tokenizer" in status


# -- the entry points ---------------------------------------------------------------------------------------


def test_build_demo_and_the_cli_subcommand(llm, capsys):
    import gradio as gr

    from minipic_lite import cli
    from ui import build_demo

    assert isinstance(build_demo(llm), gr.Blocks)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ui", "--help"])
    assert exit_info.value.code == 0 and "--port" in capsys.readouterr().out
    assert cli.main(["ui", "--model", "/no/such/model"]) == cli.EXIT_USAGE
    assert "minipic-lite ui: error: unknown model" in capsys.readouterr().err


def test_serve_listens_where_asked_and_never_shares(monkeypatch):
    """`python -m ui` serves on the host and port given, with no public share link."""
    import minipic_lite as mp
    import ui
    import ui.__main__ as entry

    launches = []

    class Demo:
        def queue(self):
            return self

        def launch(self, **kwargs):
            launches.append(kwargs)

        def block_thread(self):
            pass

    engines = []
    monkeypatch.setattr(mp, "LLM", lambda *args, **kwargs: engines.append(kwargs))
    monkeypatch.setattr(ui, "build_demo", lambda llm: Demo())
    assert entry.serve("127.0.0.2", 7999) == 0
    (kwargs,) = launches
    assert (kwargs["server_name"], kwargs["server_port"], kwargs["share"]) == ("127.0.0.2", 7999, False)
    # short engine steps: one user's long prefill holds the others' tokens (and a Stop) one short step at most
    (engine_kwargs,) = engines
    assert engine_kwargs["max_num_batched_tokens"] == entry.APP_STEP_TOKENS == 512


@pytest.mark.parametrize("argv, expected", [([], None), (["--dtype", "bfloat16"], "bfloat16")])
def test_both_app_commands_pass_the_dtype_to_the_engine(monkeypatch, argv, expected):
    """`minipic-lite ui --dtype D` and `python -m ui --dtype D` load the model in D; auto leaves the device's."""
    import ui.__main__ as entry
    from minipic_lite import cli

    calls = []
    monkeypatch.setattr(entry, "serve", lambda *args: calls.append(args) or 0)
    monkeypatch.setattr(cli, "check_listen", lambda host, port: None)  # NOTE: nothing listens; 7860 may be taken
    assert cli.main(["ui", *argv]) == 0
    assert entry.main(argv) == 0
    assert [call[4] for call in calls] == [expected, expected]


@pytest.mark.parametrize(
    "reason, expected",
    [(None, "r-1: generating…"),
     ("length", "r-1: done: it reached the new-token limit (length)"),
     ("stop", "r-1: done: the model ended its answer (stop)"),
     ("abort", "r-1: stopped before the end (abort)"),
     ("other", "r-1: done (other)")],
)  # fmt: skip
def test_the_status_line_says_in_words_where_a_request_stands(reason, expected):
    from ui.handlers import status_line

    assert status_line("r-1", reason) == expected


def test_an_empty_answer_says_the_model_ended_it_at_once():
    from ui.handlers import status_line

    assert status_line("r-1", "stop", "") == "r-1: done: the model ended its answer before saying anything (stop)"
    assert status_line("r-1", "stop", "Hi.") == "r-1: done: the model ended its answer (stop)"
    assert status_line("r-1", "length", "") == "r-1: done: it reached the new-token limit (length)"
