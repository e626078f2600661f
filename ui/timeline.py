"""The scheduler timeline: tokens of span prefill, final prefill, decode and recompute per engine step (step_log.py).

With the inline policy (the default) a request's SSEP documents are prefilled in the same chunks as the rest of
its prompt, so span and final prefill share steps; isps and barrier (`--span-policy`) show them apart.

Both plots are linear: a prefill step of hundreds of tokens would flatten a decode step of one token per running
request to under a pixel, so decode is drawn again on a plot of its own scale (`decode_frame`).
"""

from __future__ import annotations

import pandas as pd

KINDS = {
    "span prefill": "num_span_prefill_tokens",
    "final prefill": "num_final_prefill_tokens",
    "decode": "num_decode_tokens",
    "recompute": "num_recompute_tokens",
}
KIND_COLORS = {  # NOTE: fixed, so a kind has one colour on both plots (vega's category colours follow the data)
    "span prefill": "#4c78a8",
    "final prefill": "#f58518",
    "decode": "#e45756",
    "recompute": "#72b7b2",
}
TIMELINE_STEPS = 120  # the most recent steps drawn
FRAME_DTYPES = {"step": "int64", "kind": str, "tokens": "int64"}


def timeline_frame(records, num_steps: int = TIMELINE_STEPS) -> pd.DataFrame:
    """Long form, one row per (step, kind): columns step, kind, tokens (for a stacked bar plot)."""
    rows = [
        {"step": r.index, "kind": kind, "tokens": getattr(r, field)}
        for r in records[-num_steps:]
        for kind, field in KINDS.items()
    ]
    # NOTE: typed, also when empty: gradio types a plot's fields from the first frame it draws (an empty frame's
    # object columns as nominal) and keeps them, and the bars' labels then read "tokens: undefined"
    return pd.DataFrame(rows, columns=["step", "kind", "tokens"]).astype(FRAME_DTYPES)


def decode_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The timeline's decode rows only (one token per running request and step), for a plot on their own scale."""
    return frame[frame["kind"] == "decode"].reset_index(drop=True)
