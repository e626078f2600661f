"""The scheduler timeline: tokens of span prefill, final prefill, decode and recompute per engine step (step_log.py).

With the inline policy (the default) a request's SSEP documents are prefilled in the same chunks as the rest of
its prompt, so span and final prefill share steps; isps and barrier (`--span-policy`) show them apart.
"""

from __future__ import annotations

import pandas as pd

KINDS = {
    "span prefill": "num_span_prefill_tokens",
    "final prefill": "num_final_prefill_tokens",
    "decode": "num_decode_tokens",
    "recompute": "num_recompute_tokens",
}
TIMELINE_STEPS = 120  # the most recent steps drawn


def timeline_frame(records, num_steps: int = TIMELINE_STEPS) -> pd.DataFrame:
    """Long form, one row per (step, kind): columns step, kind, tokens (for a stacked bar plot)."""
    rows = [
        {"step": r.index, "kind": kind, "tokens": getattr(r, field)}
        for r in records[-num_steps:]
        for kind, field in KINDS.items()
    ]
    return pd.DataFrame(rows, columns=["step", "kind", "tokens"])
