"""atomlite: a small, fast, ROCm-first LLM inference runtime."""
from atomlite.llm import LLM
from atomlite.outputs import CompletionOutput, RequestOutput
from atomlite.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
