"""minipic_lite: a compact, teachable LLM inference engine with position-independent KV caching."""

from minipic_lite.async_llm import AsyncLLM
from minipic_lite.cache_report import BlockReport, format_report, report_totals
from minipic_lite.config import ControlTokens
from minipic_lite.llm import LLM, generate, get_default_llm
from minipic_lite.outputs import RequestMetrics, RequestOutput
from minipic_lite.prompts import RECIPES, Module, Param, Piece, Prompt, PromptComposer
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.spans import SegmentKind

__all__ = [
    "RECIPES",
    "LLM",
    "AsyncLLM",
    "BlockReport",
    "ControlTokens",
    "Module",
    "Param",
    "Piece",
    "Prompt",
    "PromptComposer",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "SegmentKind",
    "format_report",
    "generate",
    "get_default_llm",
    "report_totals",
]
