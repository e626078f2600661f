"""minipic_lite: a compact, teachable LLM inference engine with position-independent KV caching."""

from minipic_lite.llm import LLM, generate
from minipic_lite.outputs import RequestMetrics, RequestOutput
from minipic_lite.sampling_params import SamplingParams

__all__ = ["LLM", "RequestMetrics", "RequestOutput", "SamplingParams", "generate"]
