"""The engine as the API server sees it: the one atomlite.engine module that atomlite.server imports.

AsyncEngine is the engine core's client in the API process: launch(config) runs the core in a process of its own,
over(engine) runs an LLMEngine of this process on a thread. A handler validates a prompt (validate_prompt), admits
its sequences (admit: QueueFull when the queue has no room, EngineStopped while draining or once stopped), then
reads each sequence's Deltas from generate(); closing that Generation aborts the sequence. The server checks a
structured-outputs constraint before queueing it (check_structured_outputs; preload_structured_outputs imports
xgrammar as the server starts) and shows logprobs with their tokens' texts (logprobs_with_texts, token_text)."""
from atomlite.engine.ipc.async_engine import AsyncEngine, EngineDead, EngineStopped, Generation, QueueFull
from atomlite.engine.output_processor import Delta, TokenLogprob, logprobs_with_texts, token_text
from atomlite.engine.sampling.structured import check_structured_outputs
from atomlite.engine.sampling.structured import preload as preload_structured_outputs

__all__ = ["AsyncEngine", "Delta", "EngineDead", "EngineStopped", "Generation", "QueueFull", "TokenLogprob",
           "check_structured_outputs", "logprobs_with_texts", "preload_structured_outputs", "token_text"]
