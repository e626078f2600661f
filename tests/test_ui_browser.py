"""The web app in a real browser: Debian's chromium driven by Playwright against `build_demo(llm)` on 127.0.0.1.

Compose a block-attention prompt, watch the answer stream in, reorder the documents, generate again and see
the documents' blocks turn to hits; two pages at once each get their own answer; a too-long input shows its
message; closing a tab aborts its request; Stop aborts the answer in flight; the scheduler timeline draws the step
log (decode on its own scale too); the overlap histogram draws its bins from depth 0. Screenshots go to
$UI_ARTIFACTS (default test-artifacts/ui, not committed).
"""

import os
import re
import shutil
import socket
import time
import uuid
from pathlib import Path

import pytest

import minipic_lite as mp
from ui import compose, texts

pytest.importorskip("gradio", reason="the web app needs the [ui] extra: ./scripts/setup.sh installs it")
sync_api = pytest.importorskip("playwright.sync_api", reason="./scripts/setup.sh installs playwright")

ARTIFACTS = Path(os.environ.get("UI_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts" / "ui"))
TIMEOUT_S = 90
MAX_TOKENS = 16


def chromium_path() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "no chromium: ./scripts/setup.sh installs Debian's (apt-get install chromium)"
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url(llm):
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    from ui import build_demo

    demo = build_demo(llm).queue()
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    yield url
    demo.close()


@pytest.fixture(scope="module")
def browser():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(browser, url):
    page = browser.new_context(viewport={"width": 1280, "height": 1100}).new_page()
    page.set_default_timeout(TIMEOUT_S * 1000)
    page.goto(url)
    page.wait_for_selector("#generate")
    return page


def fill_form(page, documents: list[str], question: str, max_tokens: int = MAX_TOKENS) -> None:
    page.locator("#documents textarea").fill(compose.join_documents(documents))
    page.locator("#question textarea").fill(question)
    slider = page.locator("#max-tokens input[type=number]")
    slider.fill(str(max_tokens))
    slider.press("Enter")


def status(page) -> str:
    return page.locator("#status").inner_text()


def wait_finished(page, request_id_before: str = "") -> str:
    """Poll until the status names a finished request other than the last one; the answers seen on the way."""
    seen, deadline = [], time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        answer = page.locator("#answer textarea").input_value()
        if answer and (not seen or seen[-1] != answer):
            seen.append(answer)
        text = status(page)
        request_id = text.split(":")[0]
        if request_id.startswith("ui-") and request_id != request_id_before and text.endswith(("(length)", "(stop)")):
            seen.append(page.locator("#answer textarea").input_value())
            return seen
        time.sleep(0.05)
    raise AssertionError(f"no finished answer within {TIMEOUT_S} s (status {status(page)!r})")


def record_answers(page) -> None:
    """Record, in the page, each new value of the answer box (every 10 ms): what streamed is then on record however
    slowly this process polls the browser (two suites on two cores missed the growing prefixes)."""
    page.evaluate(
        """() => { window.mpSeen = []; clearInterval(window.mpPoll); window.mpPoll = setInterval(() => {
            const v = document.querySelector('#answer textarea').value, seen = window.mpSeen;
            if (v && seen[seen.length - 1] !== v) seen.push(v);
        }, 10); }"""
    )


def recorded_answers(page) -> list[str]:
    # NOTE: one last sample: the final frame may land within the interval's last 10 ms
    return page.evaluate(
        """() => { clearInterval(window.mpPoll); const v = document.querySelector('#answer textarea').value;
            if (v && window.mpSeen[window.mpSeen.length - 1] !== v) window.mpSeen.push(v); return window.mpSeen; }"""
    )


def record_grid_captions(page) -> None:
    """Record, in the page, each new caption of the grid (a MutationObserver: none is missed, however brief)."""
    page.evaluate(
        """() => { const grid = document.querySelector('#grid'), seen = window.mpCaptions = [];
            const note = () => { const c = grid.querySelector('.mp-caption, .mp-empty');
                const text = c ? c.textContent : ''; if (seen[seen.length - 1] !== text) seen.push(text); };
            note(); window.mpGridObserver = new MutationObserver(note);
            window.mpGridObserver.observe(grid, {childList: true, subtree: true, characterData: true}); }"""
    )


def recorded_grid_captions(page) -> list[str]:
    return page.evaluate("() => { window.mpGridObserver.disconnect(); return window.mpCaptions; }")


def grid_cells(page) -> list[dict]:
    return page.eval_on_selector_all(
        "#grid .mp-cell[data-block]",
        "cells => cells.map(c => ({label: c.dataset.label, status: c.dataset.status, hash: c.dataset.hash}))",
    )


def unique_documents() -> list[str]:
    note = uuid.uuid4().hex[:8]
    return [f"Note {note}-{i}. {doc}" for i, doc in enumerate(list(texts.bundled_documents().values())[:3])]


def test_reordered_documents_become_hits(browser, app_url):
    page = open_page(browser, app_url)
    docs = unique_documents()
    fill_form(page, docs, "What do these documents have in common?")
    record_answers(page)
    page.click("#generate")
    final = wait_finished(page)[-1]
    # it streamed: several growing prefixes of the answer were on screen before the last
    answers = recorded_answers(page)
    assert len(set(answers)) >= 3 and answers[-1] == final, answers
    assert all(b.startswith(a) for a, b in zip(answers, answers[1:], strict=False)), answers
    first = grid_cells(page)
    assert all(c["status"] == "computed" for c in first if c["label"].startswith("doc"))  # new documents
    page.screenshot(path=ARTIFACTS / "1-first.png", full_page=True)

    page.click("#reverse")
    page.wait_for_function(
        "doc => document.querySelector('#documents textarea').value.startsWith(doc)", arg=docs[-1][:40]
    )
    first_id = status(page).split(":")[0]
    record_grid_captions(page)
    page.click("#generate")
    wait_finished(page, first_id)
    # until its report arrived, the grid waited for it: the first request's blocks never stood under the new answer
    new_id, captions = status(page).split(":")[0], recorded_grid_captions(page)
    assert captions[0].startswith(f"request {first_id} ") and captions[1:-1] == [
        f"Waiting for request {new_id}'s cache report…"
    ], captions
    assert captions[-1].startswith(f"request {new_id} "), captions
    again = grid_cells(page)
    doc_cells = [c for c in again if c["label"].startswith("doc")]
    assert doc_cells and all(c["status"] == "hit" for c in doc_cells)
    hashes = lambda cells, label: [c["hash"] for c in cells if c["label"] == label]  # noqa: E731
    assert hashes(again, "doc 0") == hashes(first, "doc 2")  # the same blocks at another offset
    num_hits = int(re.search(r"blocks (\d+) hit", page.locator("#summary").inner_text()).group(1))
    assert num_hits >= len(doc_cells)
    page.screenshot(path=ARTIFACTS / "2-reordered-hits.png", full_page=True)
    page.get_by_role("tab", name="Cache view").click()
    page.wait_for_function("() => document.querySelector('#pool').innerText.includes('blocks used')")
    page.screenshot(path=ARTIFACTS / "3-cache-view.png", full_page=True)
    page.context.close()


def test_two_pages_at_once_each_get_their_own_answer(browser, app_url, llm):
    questions = ["Name a fruit.", "Name a planet."]
    pages = [open_page(browser, app_url) for _ in questions]
    for page, question in zip(pages, questions, strict=True):
        fill_form(page, [], question)
    for page in pages:
        page.click("#generate")
    answers = [wait_finished(page)[-1] for page in pages]
    for question, answer in zip(questions, answers, strict=True):
        prompt = llm.composer.block_attention(texts.DEFAULT_SYSTEM, [], question)
        alone = llm.generate(prompt, mp.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0), use_tqdm=False)[0]
        assert answer == alone.text
    assert answers[0] != answers[1]
    pages[0].screenshot(path=ARTIFACTS / "4-two-pages.png", full_page=True)
    for page in pages:
        page.context.close()


def test_the_repetition_penalty_slider_reaches_the_answer(browser, app_url, llm):
    """The penalty typed into the slider's box runs: the answer is the API's greedy answer with that penalty."""
    page = open_page(browser, app_url)
    question = "Write a short story about a cat who learns to fly."
    fill_form(page, [], question)
    box = page.locator("#repetition-penalty input[type=number]")
    box.fill("1.3")
    box.press("Enter")
    page.click("#generate")
    answer = wait_finished(page)[-1]
    prompt = llm.composer.block_attention(texts.DEFAULT_SYSTEM, [], question)
    answers = [llm.generate(prompt, mp.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, repetition_penalty=r),
                            use_tqdm=False)[0].text for r in (1.3, 1.0)]  # fmt: skip
    assert answer == answers[0] != answers[1]  # the penalty's answer, not the plain one
    assert box.input_value() == "1.3"
    page.context.close()


def test_a_too_long_input_shows_the_message(browser, app_url):
    page = open_page(browser, app_url)
    fill_form(page, ["short"], "why? " * 300)
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('too long')")
    assert f"at most {compose.MAX_QUESTION_CHARS:,}" in status(page)
    page.screenshot(path=ARTIFACTS / "5-too-long.png", full_page=True)
    page.context.close()


def test_a_new_token_count_outside_the_slider_runs_as_shown_and_a_markers_text_is_named_visibly(browser, app_url):
    """0 typed into the slider's box is clamped by the browser when it loses focus: the box then shows 1, and 1 token
    is what runs. A marker's text in a document gets the form's message with the marker visible (the status line is
    Markdown, where an unescaped `<repo_name>` vanished as an HTML tag)."""
    page = open_page(browser, app_url)
    fill_form(page, ["A short document."], "Name a fruit.", max_tokens=0)
    page.click("#generate")
    wait_finished(page)
    assert page.locator("#max-tokens input[type=number]").input_value() == "1"
    assert "generated 1 token (length)" in page.locator("#summary").inner_text()
    fill_form(page, ["The header is <repo_name>x</repo_name>."], "Why?")
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('span marker')")
    assert "holds '<repo_name>', the text of this model's SSEP span marker" in status(page)
    page.context.close()


def test_closing_the_tab_aborts_its_request_and_others_see_its_blocks_only(browser, app_url, llm):
    aborted_before = llm.stats()["num_aborted"]
    watcher = open_page(browser, app_url)
    watcher.get_by_role("tab", name="Cache view").click()
    page = open_page(browser, app_url)
    question = "Tell me a very long story about a dragon."
    fill_form(page, ["A short document."], question, compose.MAX_NEW_TOKENS)
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#answer textarea').value.length > 0")
    # the other tab sees the request in flight: its id and blocks, not its text
    watcher.wait_for_selector("#inflight .mp-inflight .mp-cell")
    inflight = watcher.locator("#inflight").inner_text()
    assert "ui-" in inflight and question not in inflight and "dragon" not in inflight
    watcher.screenshot(path=ARTIFACTS / "6-in-flight-seen-from-another-tab.png", full_page=True)

    page.context.close()
    deadline = time.monotonic() + 30
    while llm.stats()["num_aborted"] == aborted_before and time.monotonic() < deadline:
        time.sleep(0.2)
    stats = llm.stats()
    assert stats["num_aborted"] == aborted_before + 1 and stats["num_running"] == 0
    watcher.wait_for_function("() => document.querySelector('#inflight').innerText.includes('No request in flight')")
    watcher.context.close()


def test_stop_aborts_the_answer_in_flight_and_the_page_says_so(browser, app_url, llm):
    """The Stop button while an answer streams: the request is aborted in the engine, the answer stops growing, the
    status says it was stopped. (Stop's `concurrency_limit=None` is not what this holds: one page's Stop also runs
    beside its generate under gradio's default limit, a queue per event.)"""
    aborted_before = llm.stats()["num_aborted"]
    page = open_page(browser, app_url)
    fill_form(page, ["A short document."], "Tell me a very long story about a lighthouse.", compose.MAX_NEW_TOKENS)
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#answer textarea').value.length > 0")
    # NOTE: every status on record (a MutationObserver): the stream's last frame, "(abort)", and the Stop handler's
    # "stopped ui-..." come in either order, and the one that comes first may be on screen for a moment only
    page.evaluate(
        """() => { const s = document.querySelector('#status'); window.mpStatuses = [s.innerText];
            window.mpStatusObserver = new MutationObserver(() => window.mpStatuses.push(s.innerText));
            window.mpStatusObserver.observe(s, {childList: true, subtree: true, characterData: true}); }"""
    )
    page.click("#stop")
    page.wait_for_function("() => window.mpStatuses.some(s => s.includes('(abort)'))")
    deadline = time.monotonic() + 30
    while llm.stats()["num_aborted"] == aborted_before and time.monotonic() < deadline:
        time.sleep(0.2)
    stats = llm.stats()
    assert stats["num_aborted"] == aborted_before + 1 and stats["num_running"] == stats["num_waiting"] == 0
    answer = page.locator("#answer textarea").input_value()
    time.sleep(1.0)  # nothing more streams in after the stop
    assert page.locator("#answer textarea").input_value() == answer
    assert len(llm.tokenizer.encode(answer)) < compose.MAX_NEW_TOKENS
    page.screenshot(path=ARTIFACTS / "7-stopped.png", full_page=True)
    page.context.close()


def test_the_scheduler_timeline_draws_the_step_log(browser, app_url, llm):
    """The Scheduler timeline tab, once the timer has drawn it, holds one bar per step and kind of the step log's last
    steps (vega names each bar's step, tokens and kind in its aria-label), and a legend of the four kinds."""
    from ui.timeline import KINDS, timeline_frame

    page = open_page(browser, app_url)
    fill_form(page, unique_documents()[:2], "Which note is about startups?", max_tokens=4)
    page.click("#generate")
    wait_finished(page)
    page.get_by_role("tab", name="Scheduler timeline").click()
    frame = timeline_frame(llm.engine.step_log.records())
    expected = [f"step: {r.step}; tokens: {r.tokens}; kind: {r.kind}" for r in frame.itertuples()]
    bars, deadline = [], time.monotonic() + 30
    while bars != expected and time.monotonic() < deadline:  # NOTE: the one-second timer redraws the chart
        time.sleep(0.2)
        labels = page.eval_on_selector_all(
            "#timeline [aria-roledescription=bar]", "bars => bars.map(b => b.getAttribute('aria-label'))"
        )
        bars = [label.replace(",", "") for label in labels]  # NOTE: vega writes 1,024
    assert bars == expected and len(expected) == 4 * frame["step"].nunique() > 4
    legend = page.eval_on_selector_all(
        "#timeline [aria-roledescription=legend] text", "texts => texts.map(t => t.textContent)"
    )
    assert [text for text in legend if text in KINDS] == list(KINDS)
    page.screenshot(path=ARTIFACTS / "8-timeline.png", full_page=True)
    page.context.close()


def axis_ticks(page, selector: str) -> list[list[str]]:
    """The tick labels of each axis of a vega chart (x first), its title left off; vega writes a minus as U+2212."""
    axes = page.eval_on_selector_all(
        f"{selector} [aria-roledescription=axis]",
        "axes => axes.map(a => Array.from(a.querySelectorAll('text')).map(t => t.textContent))",
    )
    return [[label.replace("\u2212", "-").replace(",", "") for label in labels[:-1]] for labels in axes]


def test_the_overlap_histogram_draws_each_bin_from_its_start_and_no_negative_depth(browser, app_url):
    """The Checkpoints tab's histogram after Plan, on each grid in turn: one bar per bin, over [start, start + grid),
    and an x axis from depth 0 to the last bin's end (it started at -50 while vega centred a thin bar on each bin's
    start and padded the scale; and a new grid once redrew the old grid's masses)."""
    from ui.checkpoints_panel import histogram_frame, learn_overlaps
    from ui.handlers import BENCH_STREAMS, bench_stream

    page = open_page(browser, app_url)
    page.get_by_role("tab", name="Checkpoints").click()
    requests = bench_stream(BENCH_STREAMS[0])  # the form's stream and budget
    for bin_size in (64, 16):  # the default grid first
        if bin_size != 64:
            page.get_by_label("Grid (tokens)").click()
            page.get_by_role("option", name=str(bin_size), exact=True).click()
        page.click("#plan")
        page.wait_for_function(
            "grid => document.querySelector('#plan-caption').innerText.includes(`${grid}-token grid`)", arg=bin_size
        )
        frame = histogram_frame(learn_overlaps(requests, 4, bin_size).weights(len(requests[-1])), bin_size)
        expected = [(d, d + bin_size) for d in frame["depth"]]
        spans, deadline = [], time.monotonic() + 30
        while [(int(m[1]), int(m[2])) for m in spans] != expected and time.monotonic() < deadline:
            time.sleep(0.2)
            labels = page.eval_on_selector_all(
                "#histogram [aria-roledescription=bar]", "bars => bars.map(b => b.getAttribute('aria-label'))"
            )
            spans = [re.match(r"depth: (\d+) – (\d+); mass: ([\d.e-]+)$", label.replace(",", "")) for label in labels]
            spans = spans if all(spans) else []
        x_ticks, _ = axis_ticks(page, "#histogram")
        assert x_ticks[0] == "0" and all(float(t) >= 0 for t in x_ticks), x_ticks
        assert float(x_ticks[-1]) == expected[-1][1], x_ticks  # the last bin's end
        assert [(int(m[1]), int(m[2])) for m in spans] == expected, labels
        assert [float(m[3]) for m in spans] == pytest.approx(frame["mass"].tolist(), abs=1e-6)
        page.locator("#histogram").screenshot(path=ARTIFACTS / f"9-histogram-{bin_size}.png")
    page.context.close()


def test_decode_steps_stay_visible_beside_a_long_prefill(browser, app_url, llm, monkeypatch):
    """A long prompt's prefill step (hundreds of tokens) and its decode steps (one token each): on one linear scale a
    decode bar is under a pixel tall. The decode plot, on its own scale, draws each decode step's bar
    at least a few pixels tall (vega names each bar's step, tokens and kind in its aria-label), also on a page that
    watched the plots empty before the steps came."""
    log = llm.engine.step_log
    first, records = log.records()[-1].index + 1 if log.records() else 0, log.records

    def this_requests_records(since: int = 0):
        return records(max(since, first))

    # NOTE: the plots drawn over this request's steps alone: the module's engine ran other tests' batches, whose
    # decode steps of tens of tokens in the last 120 steps would rightly leave a 1-token bar under a pixel
    monkeypatch.setattr(log, "records", this_requests_records)
    page = open_page(browser, app_url)
    # NOTE: the page watches the timeline while another caller's request runs, its plots drawn empty first (no
    # step of this request yet): gradio keeps the field types of the first frame a plot draws, and an untyped empty
    # frame left the bars' labels "tokens: undefined" (a fresh clone's run of this test, stop 72's third try)
    page.get_by_role("tab", name="Scheduler timeline").click()
    time.sleep(1.5)  # NOTE: a tick of the one-second timer draws the empty frames (no wait can see an empty plot)
    prompt = "\n\n".join(unique_documents()) + "\n\nWhich note is about startups?"
    llm.generate(prompt, mp.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), use_tqdm=False)
    steps = log.records()[-6:]  # this request's decode steps (nothing else ran)
    assert [(r.num_decode_tokens, r.num_span_prefill_tokens + r.num_final_prefill_tokens) for r in steps[1:]] == [
        (1, 0)
    ] * 5
    wanted = {f"step: {r.index}; tokens: 1; kind: decode" for r in steps[1:]}

    def drawn(heights):
        return wanted <= heights.keys() and all(heights[label] >= 4 for label in wanted)

    # NOTE: the decode plot alone: the plot of all kinds names the same bars (under a pixel there, rightly) and may
    # draw before it, which ended the wait on the wrong plot (CI, 25c6c20)
    heights, deadline = {}, time.monotonic() + 30
    while not drawn(heights) and time.monotonic() < deadline:  # NOTE: the one-second timer redraws it
        time.sleep(0.2)
        bars = page.eval_on_selector_all(
            "#timeline-decode [aria-roledescription=bar]",
            "bars => bars.map(b => [b.getAttribute('aria-label'), b.getBoundingClientRect().height])",
        )
        heights = {}
        for label, height in bars:
            heights[label.replace(",", "")] = height  # NOTE: vega writes 1,024
    assert wanted <= heights.keys(), sorted(heights)
    assert all(heights[label] >= 4 for label in wanted), {label: heights[label] for label in wanted}
    page.screenshot(path=ARTIFACTS / "10-timeline-decode.png", full_page=True)
    page.context.close()
