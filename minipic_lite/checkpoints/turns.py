"""Chat structure: where prompts branch, and plans moved up to those branch points.

A chat prompt is a run of turns, each opened by a turn-start token (`<|im_start|>` in ChatML, SmolLM2's and
Qwen's template). Prompts that share a conversation part where a turn starts: a system prompt followed by
different user turns leaves the cached prompt just before its user turn's `<|im_start|>`. The last turn is
the one this request is about (its own user turn, or the open `<|im_start|>assistant` header the answer
follows): where a later request leaves inside it, or whether it repeats it whole, the turns do not say.

    <|im_start|>system ... <|im_end|> <|im_start|>user ... <|im_end|> <|im_start|>assistant
    ^ 0: the first turn (nothing to resume)   ^ a branch point          ^ the last turn: not one
"""

from __future__ import annotations

import numpy as np


def branch_points(token_ids, turn_start_id: int) -> list[int]:
    """Positions p ≥ 1 (tokens before a turn start) of every turn start of the prompt but its last, ascending."""
    starts = np.flatnonzero(np.asarray(token_ids) == turn_start_id)
    return [int(p) for p in starts[:-1] if p >= 1]


def snap_to_turns(positions, points, bin_size: int) -> list[int]:
    """`positions` with each branch point (rounded down to the grid), deepest first, in the place of the deepest
    position below it (none of them is a branch point already: those placed so far lie deeper); a point that is a
    position already stays, and a point with no position below it is skipped.

    A checkpoint at c serves the requests that leave at depths ≥ c from c; moved up to a branch point s ≥ c, it
    serves those that leave at s or deeper s − c tokens deeper, and those in [c, s) from the next one down.
    """
    if bin_size < 1:
        raise ValueError(f"bin_size must be >= 1 token, got {bin_size}")
    plan = set(positions)
    for point in sorted({bin_size * (p // bin_size) for p in points} - {0}, reverse=True):
        below = [c for c in plan if c < point]
        if point not in plan and below:
            plan.remove(max(below))
            plan.add(point)
    return sorted(plan)
