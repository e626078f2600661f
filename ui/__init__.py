"""The minipic_lite web app: compose span prompts, stream answers, and watch the KV cache, the scheduler and
checkpoint placement live. `python -m ui` (or `minipic-lite ui`) serves it; `build_demo(llm)` embeds it.

Gradio is an optional dependency (`pip install -e '.[ui]'`): it is imported when `build_demo` is first used.
"""

from __future__ import annotations


def build_demo(llm):
    """The app over `llm` (a `minipic_lite.LLM`) as a `gr.Blocks`; `.launch()` serves it."""
    from ui.app import build_demo as build

    return build(llm)


__all__ = ["build_demo"]
