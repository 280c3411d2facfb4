"""The engine on its own thread, fed by asyncio handlers.

HTTP handlers validate a request, then `generate()` hands it to the engine thread and yields deltas (new tokens,
new text, finish) as they come. A handler that stops listening (client gone, task cancelled) aborts its request,
which returns its KV blocks at once. `shutdown()` aborts whatever is left and stops the thread.
"""
import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from atomlite.engine.llm_engine import LLMEngine
from atomlite.engine.sequence import Sequence
from atomlite.sampling_params import SamplingParams

logger = logging.getLogger("atomlite.async_engine")


class QueueFull(RuntimeError):
    pass


class EngineStopped(RuntimeError):
    pass


@dataclass
class Delta:
    token_ids: list[int]
    text: str
    logprobs: list[dict[int, float]]
    finished: bool = False
    finish_reason: str | None = None
    prompt_logprobs: list | None = None
    num_prompt_tokens: int = 0


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival: float = field(default_factory=time.monotonic)
    sent_tokens: int = 0
    sent_text: int = 0
    last_token_time: float | None = None
    finished: bool = False


class Generation:
    """One sequence's deltas, as an async iterator; aclose() aborts the sequence unless it finished. Callers must
    aclose it (contextlib.aclosing) even when they never iterate: the sequence is queued from the start."""

    def __init__(self, engine: "AsyncEngine", request_id: str, stream: _Stream):
        self._engine, self.request_id, self._stream = engine, request_id, stream
        self._done = self._closed = False

    def __aiter__(self) -> "Generation":
        return self

    async def __anext__(self) -> Delta:
        if self._done:
            raise StopAsyncIteration
        item = await self._stream.queue.get()
        if isinstance(item, Exception):
            self._done = True
            raise item
        self._done = item.finished
        return item

    async def aclose(self) -> None:
        """Idempotent; never waits (it only queues the abort), so it runs to its end inside a cancelled task."""
        if self._closed:
            return
        self._done = self._closed = True
        if not self._stream.finished:
            self._engine._send(("abort", self.request_id))


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_waiting: int = 1024, metrics=None):
        self.engine = engine
        self.max_waiting = max_waiting
        self.metrics = metrics
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="atomlite-engine", daemon=True)

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout)

    # -- requests ---------------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + self._commands.qsize()

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    def admit(self, count: int) -> None:
        """Raise unless `count` more sequences may wait: checked once per HTTP request, for all its sequences,
        so a request is either admitted whole or refused whole."""
        if not self.is_running:
            raise EngineStopped("the server is shutting down")
        if self.num_waiting + count > self.max_waiting:
            raise QueueFull(f"the waiting queue is full ({self.max_waiting} requests); retry later")

    def generate(self, request_id: str, token_ids: list[int], params: SamplingParams) -> "Generation":
        """Call admit() first. Queues the sequence now, so that the next admit() counts it (a burst of requests
        cannot all pass admission before any is queued), and returns its deltas until it finishes; closing the
        Generation early (aclose) aborts it."""
        if not self.is_running:  # its commands would never be read: fail now rather than hang
            raise EngineStopped("the server is shutting down")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream
        self._send(("add", request_id, token_ids, params))
        return Generation(self, request_id, stream)

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wakeup.set()

    # -- engine thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands()
                if not self.engine.has_unfinished():
                    self._update_gauges()
                    self._wakeup.wait(0.5)
                    self._wakeup.clear()
                    continue
                self._step()
        finally:
            self._stopping = True
            self._abort_all()

    def _step(self) -> None:
        try:
            self._publish(self.engine.step())
        except Exception as e:  # a bug, not user input: fail the open requests, keep serving new ones
            logger.exception("engine step failed; aborting the requests in flight")
            for request_id in list(self.engine.requests):
                self._deliver(request_id, RuntimeError(f"engine failure: {type(e).__name__}: {e}"))
                self._abort(request_id)
        self._update_gauges()

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                self._add(*command[1:])
            else:
                self._abort(command[1])

    def _add(self, request_id: str, token_ids: list[int], params: SamplingParams) -> None:
        if request_id not in self._streams:
            return  # its client left before the engine saw it
        try:
            self.engine.add_request(request_id, token_ids, params)
        except ValueError as e:
            self._deliver(request_id, e)
            return
        except Exception as e:  # a bug, not user input: this request fails, the engine keeps serving
            logger.exception("could not add request %s", request_id)
            self._deliver(request_id, RuntimeError(f"engine failure: {type(e).__name__}: {e}"))
            return
        if self.metrics:
            self.metrics.prompt_tokens.inc(len(token_ids))

    def _abort(self, request_id: str) -> None:
        self._finish_stream(request_id)
        if request_id in self.engine.requests:
            self.engine.abort(request_id)
            if self.metrics:
                self.metrics.finished.labels(reason="abort").inc()

    def _abort_all(self) -> None:
        while True:
            try:
                self._commands.get_nowait()
            except queue.Empty:
                break
        for request_id in list(self.engine.requests):
            self._abort(request_id)
        for request_id in list(self._streams):
            self._deliver(request_id, EngineStopped("the server shut down before this request finished"))

    def _publish(self, seqs: list[Sequence]) -> None:
        now = time.monotonic()
        for seq in seqs:
            stream = self._streams.get(seq.request_id)
            if stream is None:
                continue
            delta = self._delta(seq, stream)
            self._observe_latency(stream, now, len(delta.token_ids), delta)
            self._deliver(seq.request_id, delta)

    def _delta(self, seq: Sequence, stream: _Stream) -> Delta:
        new_tokens = seq.output_token_ids_from(stream.sent_tokens)
        logprobs = seq.logprobs[stream.sent_tokens:] if seq.params.logprobs is not None else []
        first = stream.sent_tokens == 0
        stream.sent_tokens += len(new_tokens)
        text, safe = self._text_so_far(seq)
        new_text = text[stream.sent_text:max(safe, stream.sent_text)]
        stream.sent_text = max(safe, stream.sent_text)
        return Delta(new_tokens, new_text, logprobs, seq.is_finished, seq.finish_reason,
                     seq.prompt_logprobs if first and seq.params.prompt_logprobs is not None else None,
                     seq.num_prompt_tokens)

    @staticmethod
    def _text_so_far(seq: Sequence) -> tuple[str, int]:
        """seq's text, and how much of it may be sent: while it runs, a stop string may still complete in the
        tail (the engine would then cut it), so that tail waits."""
        if seq.is_finished:
            return seq.text, len(seq.text)
        seq.detokenize()
        text = seq.detokenizer.text
        held = max(map(len, seq.params.stop)) - 1 if seq.params.stop else 0
        return text, len(text) - held

    def _observe_latency(self, stream: _Stream, now: float, num_tokens: int, delta: Delta) -> None:
        if not self.metrics:
            return
        self.metrics.generation_tokens.inc(num_tokens)
        if stream.last_token_time is None:
            self.metrics.ttft.observe(now - stream.arrival)
        else:
            self.metrics.itl.observe(now - stream.last_token_time)
        stream.last_token_time = now
        if delta.finished:
            self.metrics.finished.labels(reason=delta.finish_reason).inc()

    def _deliver(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        if isinstance(item, Exception) or item.finished:
            self._finish_stream(request_id)
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:
            pass  # its event loop is closed: nobody is listening any more

    def _finish_stream(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.finished = True

    def _update_gauges(self) -> None:
        if self.metrics:
            self.metrics.update_engine(self.num_running, self.num_waiting, self.engine.kv.usage())
