"""atomlite: a small, fast, ROCm-first LLM inference runtime."""
from atomlite.llm import LLM
from atomlite.outputs import CompletionOutput, RequestOutput
from atomlite.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput"]
