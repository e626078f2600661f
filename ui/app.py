"""`build_demo(llm) -> gr.Blocks`: the panels laid out and wired to the handlers (handlers.py).

    Compose & generate | Cache view (your last request, the pool, every request in flight) |
    Scheduler timeline (and decode alone, on its own scale) | Checkpoints

A hybrid model (recurrent layers beside attention) composes with the `prefix` recipe only, and its Checkpoints tab
shows the checkpoints each request saved on its token axis and where it resumed.

Gradio is imported here only. Every session streams on the same engine loop; a timer refreshes the live views.
"""

from __future__ import annotations

from contextlib import closing

import gradio as gr

from minipic_lite.checkpoints import DEFAULT_BIN_SIZE
from minipic_lite.prompts import RECIPES
from ui import compose, texts
from ui.cache_view import grid_html
from ui.checkpoints_panel import MAX_BUDGET, plans_frame
from ui.compose import HYBRID_RECIPES
from ui.handlers import APP_STREAM, BENCH_STREAMS, Handlers
from ui.monitor import HIT_RATES
from ui.timeline import KIND_COLORS, decode_frame

TICK_SECONDS = 1.0
MAX_CONCURRENT_REQUESTS = 8  # generate events served at once (all share the engine's batches)
DEFAULT_MAX_TOKENS = 48
NUM_DEFAULT_DOCUMENTS = 3
SPAN_POLICY_NOTES = {
    "inline": "a prompt's spans are prefilled in the same chunks as the rest of it",
    "isps": "spans of waiting prompts are prefilled ahead, in the budget the running requests leave",
    "barrier": "every missing span of the waiting prompts first, their final prefills after",
}
INTRO = (
    "# minipic_lite: watch position-independent caching\nCompose a prompt from documents, generate, then reorder "
    "the documents and generate again: with `block_attention` or `epic` the documents' blocks are cache hits at "
    "their new offsets."
)
HYBRID_INTRO = (
    "# minipic_lite: watch a hybrid model resume from checkpoints\nThis model is a hybrid: its recurrent layers "
    "see every token, so it composes with the `prefix` recipe only (span recipes need attention-only models). "
    "Generate, then ask another question about the same documents: the *Checkpoints* tab shows where the second "
    "request resumed from a saved recurrent state, and the checkpoints each request saved."
)


def build_demo(llm) -> gr.Blocks:
    h = Handlers(llm)
    documents, systems = texts.bundled_documents(), texts.bundled_system_prompts()
    recipes = list(HYBRID_RECIPES) if h.is_hybrid else list(RECIPES)
    default_recipe = recipes[0] if h.is_hybrid else "block_attention"
    with gr.Blocks(title="minipic_lite") as demo:
        gr.Markdown(HYBRID_INTRO if h.is_hybrid else INTRO)
        with gr.Tab("Compose & generate"), gr.Row():
            with gr.Column(scale=3):
                recipe = gr.Radio(recipes, value=default_recipe, label="Recipe", elem_id="recipe")
                system_pick = gr.Dropdown(list(systems), value="default", label="System prompt (bundled)")
                system = gr.Textbox(systems["default"], label="System prompt", lines=2, elem_id="system")
                default_docs = list(documents)[:NUM_DEFAULT_DOCUMENTS]
                doc_pick = gr.Dropdown(
                    list(documents),
                    value=default_docs,
                    multiselect=True,
                    label="Bundled documents (essays; a pick replaces the Documents box)",
                )
                docs = gr.Textbox(
                    compose.join_documents([documents[n] for n in default_docs]),
                    label=f"Documents, separated by a line '{compose.SEPARATOR}' "
                    f"(prompt_cache: a section starting '{compose.PARAM_PREFIX}' is a parameter)",
                    lines=10,
                    max_lines=20,
                    elem_id="documents",
                )
                with gr.Row():
                    reverse_btn = gr.Button("Reverse order", elem_id="reverse", size="sm")
                    rotate_btn = gr.Button("Rotate order", elem_id="rotate", size="sm")
                question = gr.Textbox(texts.DEFAULT_QUESTION, label="Question", elem_id="question")
                with gr.Row():
                    max_tokens = gr.Slider(
                        1, compose.MAX_NEW_TOKENS, DEFAULT_MAX_TOKENS, step=1, label="Max new tokens",
                        elem_id="max-tokens",
                    )  # fmt: skip
                    repetition = gr.Slider(
                        1.0, compose.MAX_REPETITION_PENALTY, 1.0, step=0.05, label="Repetition penalty (1 = none)",
                        elem_id="repetition-penalty",
                    )  # fmt: skip
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary", elem_id="generate")
                    stop_btn = gr.Button("Stop", elem_id="stop")
            with gr.Column(scale=4):
                status = gr.Markdown("", elem_id="status")
                answer = gr.Textbox(label="Answer", lines=6, interactive=False, elem_id="answer")
                summary = gr.Markdown("", elem_id="summary")
                gr.Markdown("#### Your last request's blocks")  # NOTE: gradio 6 draws no label over gr.HTML
                grid = gr.HTML(grid_html([]), elem_id="grid")
        with gr.Tab("Cache view"):
            with gr.Row():
                pool = gr.Markdown("", elem_id="pool")
                with gr.Column():
                    hit_rates = [
                        gr.LinePlot(x="seconds", y="hit rate", y_lim=[0, 1], label=title, elem_id=key.replace("_", "-"))
                        for key, title in HIT_RATES.items()
                    ]
            gr.Markdown(
                "*Block lookups that hit*: the full prompt blocks looked up at every admission attempt (one short of "
                "free blocks, and a re-admission after preemption, included); *prompt blocks hit*: the blocks of each "
                "admission's cache report; *prompt tokens hit*: each prompt's tokens taken from the cache, counted at "
                "its first token.\n\n"
                "#### Requests in flight"
            )
            inflight = gr.HTML("", elem_id="inflight")
        with gr.Tab("Scheduler timeline"):
            gr.Markdown(
                "Tokens per engine step: **span prefill** (SSEP documents), **final prefill** (the rest of the "
                "prompt), **decode**, and **recompute** (answer tokens computed again after a preemption). This "
                f"engine's span policy: **{llm.config.scheduler.span_policy}** "
                f"({SPAN_POLICY_NOTES[llm.config.scheduler.span_policy]}; `minipic-lite ui --span-policy` picks it)."
                "\n\nBoth plots count tokens on a linear scale: a prefill step of hundreds of tokens leaves a decode "
                "step (one token per running request) under a pixel tall, so the second draws decode alone, on its own "
                "scale."
            )
            timeline = gr.BarPlot(
                x="step",
                y="tokens",
                color="kind",
                color_map=KIND_COLORS,
                y_lim=[0, None],  # NOTE: gradio's plots leave zero out of a scale unless told: bars from the least
                label="Scheduler timeline",
                elem_id="timeline",
            )
            decode_timeline = gr.BarPlot(
                x="step",
                y="tokens",
                color="kind",
                color_map=KIND_COLORS,
                y_lim=[0, None],  # NOTE: else steps of one token beside steps of two, or all of one, are 0 px tall
                label="Decode tokens per step (its own scale)",
                elem_id="timeline-decode",
            )
        with gr.Tab("Checkpoints"):
            if h.is_hybrid:
                state_views = hybrid_state_views()
            gr.Markdown(
                "Sparse recurrent-state checkpoints (for hybrid models): an overlap histogram learned from a "
                "request stream, where each policy puts up to M checkpoints, and the tokens a request then "
                "recomputes."
            )
            with gr.Row():
                source = gr.Dropdown([APP_STREAM, *BENCH_STREAMS], value=BENCH_STREAMS[0], label="Requests")
                budget = gr.Slider(1, MAX_BUDGET, 4, step=1, label="Budget M (checkpoints)")
                bin_size = gr.Dropdown([16, DEFAULT_BIN_SIZE], value=DEFAULT_BIN_SIZE, label="Grid (tokens)")
                plan_btn = gr.Button("Plan", elem_id="plan")
            plan_caption = gr.Markdown("", elem_id="plan-caption")
            with gr.Row():
                histogram = gr.BarPlot(
                    x="depth", y="mass", y_lim=[0, None], label="Overlap depth (learned)", elem_id="histogram"
                )
                positions = gr.ScatterPlot(x="position", y="policy", color="policy", label="Checkpoint positions")
            plans = gr.Dataframe(plans_frame([]), label="Policies", elem_id="plans")

        # -- wiring --
        system_pick.change(lambda name: systems.get(name, ""), system_pick, system)
        doc_pick.change(lambda names: compose.join_documents([documents[n] for n in names or []]), doc_pick, docs)
        reverse_btn.click(compose.reverse_documents, docs, docs)
        rotate_btn.click(compose.rotate_documents, docs, docs)

        def on_generate(recipe, system, docs, question, max_tokens, repetition, request: gr.Request):
            # NOTE: closing: a cancelled event aborts the request now, not when the garbage collector gets to it
            frames = h.generate(recipe, system, docs, question, max_tokens, request.session_hash, repetition)
            with closing(frames):
                yield from frames

        generate_btn.click(
            on_generate,
            [recipe, system, docs, question, max_tokens, repetition],
            [answer, summary, grid, status],
            concurrency_limit=MAX_CONCURRENT_REQUESTS,
            show_progress="minimal",
        )

        def on_stop(request: gr.Request):
            return h.stop(request.session_hash)

        def on_close(request: gr.Request):  # the tab was closed: abort its requests
            h.close_session(request.session_hash)

        stop_btn.click(on_stop, None, status, concurrency_limit=None, show_progress="hidden")
        demo.unload(on_close)

        timer = gr.Timer(TICK_SECONDS)

        def on_tick():
            *views, steps = h.tick()
            return *views, steps, decode_frame(steps)

        timer.tick(
            on_tick,
            None,
            [pool, *hit_rates, inflight, timeline, decode_timeline],
            concurrency_limit=None,
            show_progress="hidden",
        )
        if h.is_hybrid:

            def on_state_tick(request: gr.Request):
                return h.state_tick(request.session_hash)

            timer.tick(on_state_tick, None, state_views, concurrency_limit=None, show_progress="hidden")

        def on_plan(source, budget, bin_size):
            masses, *rest = h.plan(source, budget, bin_size)
            if masses is None:  # a refused plan: the plot empty
                return None, *rest
            # NOTE: each bin's mass at its middle, binned back by vega with the grid as its step: a bar spans
            # [start, start + grid) and the axis runs from 0 to the last bin's end. (Bars at the bin starts were thin
            # marks centred on them, on an axis vega padded to -50; binned at the starts, vega's last bin, closed
            # at the largest start, took the last two.)
            middles = masses.assign(depth=masses["depth"] + bin_size / 2)
            return gr.BarPlot(middles, x_bin=bin_size), *rest

        # NOTE: the plot cleared first: gradio 6.31 redraws a plot whose x_bin and data change at once with its old
        # data (the 64-token grid's masses binned by 16); from no data it draws the new data. One queue for both
        # (limit 1): a second click's clear waits for the first's plan
        plan_btn.click(lambda: None, None, histogram, show_progress="hidden", concurrency_id="plan").then(
            on_plan, [source, budget, bin_size], [histogram, positions, plans, plan_caption], concurrency_id="plan"
        )
    return demo


def hybrid_state_views() -> list:
    """The served hybrid's checkpoints: the store's table, your last request's token axis, those in flight."""
    gr.Markdown(
        "### This model's recurrent-state checkpoints\nEach prompt on its token axis: green was resumed from a "
        "saved state, amber computed; blue lines are checkpoints (solid: saved by this request), red where it resumed."
    )
    with gr.Row():
        table = gr.Markdown("", elem_id="state-stats")
        with gr.Column(scale=3):
            last = gr.HTML("", label="Your last request", elem_id="state-last")
            in_flight = gr.HTML("", label="Requests in flight", elem_id="state-inflight")
    gr.Markdown("### Planning: where each policy would place checkpoints")
    return [table, last, in_flight]
