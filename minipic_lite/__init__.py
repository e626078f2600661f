"""minipic_lite: a compact, teachable LLM inference engine with position-independent KV caching.

The public names below are imported on first use (PEP 562), not with the package: `import minipic_lite`
and `minipic-lite --help` must not pay for torch and transformers (seconds) before they are needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it
_EXPORTS = {
    "AsyncLLM": "minipic_lite.async_llm",
    "BlockReport": "minipic_lite.cache_report",
    "format_report": "minipic_lite.cache_report",
    "report_totals": "minipic_lite.cache_report",
    "ControlTokens": "minipic_lite.config",
    "LLM": "minipic_lite.llm",
    "generate": "minipic_lite.llm",
    "get_default_llm": "minipic_lite.llm",
    "CompletionOutput": "minipic_lite.outputs",
    "Logprob": "minipic_lite.outputs",
    "RequestMetrics": "minipic_lite.outputs",
    "RequestOutput": "minipic_lite.outputs",
    "RECIPES": "minipic_lite.prompts",
    "Module": "minipic_lite.prompts",
    "Param": "minipic_lite.prompts",
    "Piece": "minipic_lite.prompts",
    "Prompt": "minipic_lite.prompts",
    "PromptComposer": "minipic_lite.prompts",
    "RequestOutputKind": "minipic_lite.sampling_params",
    "SamplingParams": "minipic_lite.sampling_params",
    "SegmentKind": "minipic_lite.spans",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'minipic_lite' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # NOTE: cached, so __getattr__ runs once per name
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # for editors and type checkers: the same names, eagerly
    from minipic_lite.async_llm import AsyncLLM  # noqa: F401
    from minipic_lite.cache_report import BlockReport, format_report, report_totals  # noqa: F401
    from minipic_lite.config import ControlTokens  # noqa: F401
    from minipic_lite.llm import LLM, generate, get_default_llm  # noqa: F401
    from minipic_lite.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput  # noqa: F401
    from minipic_lite.prompts import RECIPES, Module, Param, Piece, Prompt, PromptComposer  # noqa: F401
    from minipic_lite.sampling_params import RequestOutputKind, SamplingParams  # noqa: F401
    from minipic_lite.spans import SegmentKind  # noqa: F401
