"""The engine core's client in the API process, fed by asyncio handlers.

HTTP handlers validate a request, then `generate()` sends it to the engine core (core.py: its own process under
`atomlite serve`, or a thread for an engine built in this process) and yields deltas (new tokens, new text,
finish) as they come. A receiver thread takes the core's one message per step, turns it into deltas through the
OutputProcessor (text, stop strings: those requests it aborts in the core), records metrics and hands each event
loop its deltas in one call. A handler that stops listening (client gone, task cancelled) aborts its request, which
returns its KV blocks at once. A core that dies fails every open request and marks the engine stopped;
`shutdown()` stops the core and fails whatever is left.
"""
import asyncio
import logging
import multiprocessing
import os
import pickle
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import zmq

from atomlite.engine.ipc.core import core_process_main, pickled_frames, serve_engine
from atomlite.engine.llm_engine import check_prompt
from atomlite.engine.output_processor import Delta, OutputProcessor, is_last
from atomlite.engine.updates import EngineStats, SeqUpdate
from atomlite.errors import ConfigError
from atomlite.sampling_params import SamplingParams

logger = logging.getLogger("atomlite.async_engine")
POLL_MS = 100  # how often the receiver, with nothing to read, checks that the core lives

__all__ = ["AsyncEngine", "Delta", "EngineDead", "EngineStopped", "Generation", "QueueFull"]


class QueueFull(RuntimeError):
    """The waiting queue has no room for the request: a 503 to retry later."""


class EngineStopped(RuntimeError):
    """The engine takes no new requests (draining, shutting down), or ended an open one before it finished."""


class EngineDead(EngineStopped):
    """The engine core died: nothing more can be served."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    last_token_time: float | None = None


class Generation:
    """One sequence's deltas, as an async iterator; aclose() aborts the sequence unless it finished. Callers must
    aclose it (contextlib.aclosing) even when they never iterate: the sequence is queued from the start."""

    def __init__(self, engine: "AsyncEngine", request_id: str, stream: _Stream):
        self._engine, self.request_id, self._stream = engine, request_id, stream
        self._done = self._closed = False
        self._held = None  # an error that came behind the deltas just merged

    def __aiter__(self) -> "Generation":
        return self

    async def __anext__(self) -> Delta:
        """The next delta; deltas that queued up while the caller was busy come merged into one (a loaded server
        then sends fewer, larger chunks instead of falling further behind)."""
        if self._done:
            raise StopAsyncIteration
        queue = self._stream.queue
        item = self._held or await queue.get()
        self._held = None
        while not isinstance(item, Exception) and not item.finished and not queue.empty():
            following = queue.get_nowait()
            if isinstance(following, Exception):
                self._held = following
                break
            item = item.merged(following)
        if isinstance(item, Exception):
            self._done = True
            raise item
        self._done = item.finished
        return item

    async def aclose(self) -> None:
        """Idempotent; never waits (it only sends the abort), so it runs to its end inside a cancelled task."""
        if self._closed:
            return
        self._done = self._closed = True
        self._engine._abort(self.request_id)


class CoreThread:
    """The core over an engine built in this process, on a thread (tests, and servers made from an LLMEngine).
    One core at a time per engine (engine.served_by says which thread serves it), and LLM.generate refuses an engine
    a running core steps: each would step the engine and take updates the other's requests wait for."""
    _claim_lock = threading.Lock()

    def __init__(self, engine):
        self.engine = engine
        self._thread: threading.Thread | None = None

    def start(self, commands_addr: str, outputs_addr: str) -> None:
        with self._claim_lock:
            if self.engine.served():
                raise ConfigError("this LLMEngine already runs under another engine client (its core thread is "
                                  "alive); shut that client (its server) down before starting another over it")
            self._thread = threading.Thread(target=serve_engine, args=(self.engine, commands_addr, outputs_addr),
                                            name="atomlite-engine-core", daemon=True)
            self.engine.served_by = self._thread
            self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def exit_note(self) -> str:
        return "the engine core thread ended"


class CoreProcess:
    """The core in a process of its own, which builds the engine from the config (spawned: no CUDA state is
    inherited)."""

    def __init__(self, config):
        self.config = config
        self._process = None

    def start(self, commands_addr: str, outputs_addr: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._process = context.Process(
            target=core_process_main, name="atomlite-engine-core", daemon=True,
            args=(self.config, commands_addr, outputs_addr, os.getpid(), logging.getLogger().level))
        self._process.start()

    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def join(self, timeout: float) -> None:
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)

    def exit_note(self) -> str:
        return f"the engine core process exited (exit code {self._process.exitcode})"


class AsyncEngine:
    """The engine as the API server drives it (see atomlite.engine.ipc.client). Model facts: tokenizer, max_model_len,
    vocab_size. Lifecycle: start, started, is_running, drain, fail_open, shutdown, dead, on_death, startup_report,
    core_pid. Requests: validate_prompt, decode, admit, then generate (a Generation of Deltas). Counters: num_open,
    num_waiting, num_running; `metrics` is the ServerMetrics it records into, or None."""

    def __init__(self, core, config, tokenizer, max_waiting: int = 1024, metrics=None):
        self.core, self.config, self.tokenizer = core, config, tokenizer
        self.max_model_len = config.max_model_len
        self.vocab_size = config.model_spec.hf["vocab_size"]
        self.max_waiting = max_waiting
        self.metrics = metrics
        self.startup_report: list[str] = []
        self.core_pid: int | None = None
        self.on_death = None  # called (receiver thread) once the core dies
        self._streams: dict[str, _Stream] = {}  # the open sequences, as are the output processor's requests
        self._output = OutputProcessor(tokenizer)
        self._stats: EngineStats | None = None
        self._num_added = 0
        self._started = self._draining = self._stopping = False
        self._dead: str | None = None
        self._send_lock = threading.Lock()
        self._streams_lock = threading.Lock()  # a sequence ends once: by its last update, its abort or a failure
        self._receiver = threading.Thread(target=self._receive, name="atomlite-engine-client", daemon=True)

    @classmethod
    def launch(cls, config, **kw) -> "AsyncEngine":
        """A client whose core runs in its own process, built from config by start()."""
        from atomlite.tokenizer import load_tokenizer
        return cls(CoreProcess(config), config, load_tokenizer(config.tokenizer_path), **kw)

    @classmethod
    def over(cls, engine, **kw) -> "AsyncEngine":
        """A client whose core runs engine (an LLMEngine of this process) on a thread."""
        return cls(CoreThread(engine), engine.config, engine.tokenizer, **kw)

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the core and wait until it serves; a core that cannot start is a ConfigError saying why."""
        self._dir = tempfile.mkdtemp(prefix="atomlite-")
        self._context = zmq.Context()
        self._commands = self._context.socket(zmq.PUSH)
        self._commands.setsockopt(zmq.SNDHWM, 0)  # a burst during a long step queues; it never blocks the loop
        self._commands.bind(f"ipc://{self._dir}/commands")
        self._outputs = self._context.socket(zmq.PULL)
        self._outputs.bind(f"ipc://{self._dir}/outputs")
        try:
            self.core.start(f"ipc://{self._dir}/commands", f"ipc://{self._dir}/outputs")
        except ConfigError:
            self._close_sockets()
            raise
        self._wait_until_ready()
        self._started = True
        self._receiver.start()

    def _wait_until_ready(self) -> None:
        while not self._outputs.poll(POLL_MS):
            if not self.core.alive():
                self._close_sockets()
                raise ConfigError(f"{self.core.exit_note()} before it was ready; see the log above")
        message = pickle.loads(self._outputs.recv())
        if message[0] == "failed":
            self.core.join(10)
            self._close_sockets()
            raise ConfigError(message[1])
        _, self.startup_report, self.core_pid = message

    @property
    def started(self) -> bool:
        return self._started

    @property
    def dead(self) -> str | None:
        """Why the core died, once it has."""
        return self._dead

    @property
    def is_running(self) -> bool:
        """Taking requests: started, not draining or stopping, its core alive."""
        return self._started and not self._draining and not self._stopping and self._dead is None

    @property
    def num_open(self) -> int:
        """Sequences whose clients still wait for deltas."""
        return len(self._streams)

    def drain(self) -> None:
        """Take no new requests (admit() raises EngineStopped, /health answers 503); open ones run on."""
        self._draining = True

    def fail_open(self, error: Exception) -> int:
        """End every open sequence with error and abort it in the core; returns how many there were."""
        return self._fail_all(error, tell_core=True)

    def shutdown(self, timeout: float = 10.0) -> None:
        if not self._started or self._stopping:
            return
        self._stopping = True
        if self.core.alive():
            self._send(("stop",))
        self.core.join(timeout)
        self._receiver.join(timeout)
        self._fail_all(EngineStopped("the server shut down before this request finished"))
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._commands.close(0)
        self._outputs.close(0)
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- requests ---------------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        """Sequences waiting in the core, and those sent that the core has not taken in yet."""
        if self._stats is None:
            return self._num_added
        return self._stats.num_waiting + self._num_added - self._stats.num_added

    @property
    def num_running(self) -> int:
        return self._stats.num_running if self._stats is not None else 0

    def validate_prompt(self, token_ids: list[int]) -> None:
        """Raises a ValueError unless token_ids is a non-empty prompt of vocabulary ids with room after it."""
        check_prompt(token_ids, self.vocab_size, self.max_model_len)

    def decode(self, token_ids: list[int]) -> str:
        """The text of token_ids, special tokens left out ("" without a tokenizer)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def admit(self, count: int) -> None:
        """Raise unless `count` more sequences may wait: checked once per HTTP request, for all its sequences,
        so a request is either admitted whole or refused whole."""
        if not self.is_running:
            raise EngineDead(self._dead) if self._dead else EngineStopped("the server is shutting down")
        if self.num_waiting + count > self.max_waiting:
            raise QueueFull(f"the waiting queue is full ({self.max_waiting} requests); retry later")

    def generate(self, request_id: str, token_ids: list[int], params: SamplingParams,
                 priority: int = 0, multimodal=None, lora=None) -> Generation:
        """Call admit() first. Sends the sequence now, so that the next admit() counts it (a burst of requests
        cannot all pass admission before any is queued), and returns its deltas until it finishes; closing the
        Generation early (aclose) aborts it. multimodal: the prompt's images and video frames (a MultiModalPrompt
        whose prompt_token_ids are token_ids), sent to the core with the command. lora: the LoRARequest it runs
        with (None: the base model)."""
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._streams_lock:  # registered before a dying core's _fail_all, or refused after it
            if not self.is_running:  # its deltas would never come: fail now rather than hang
                raise EngineDead(self._dead) if self._dead else EngineStopped("the server is shutting down")
            self._streams[request_id] = stream
            self._output.add(request_id, token_ids, params)
        self._num_added += 1
        self._send(("add", request_id, token_ids, params, priority, multimodal, lora))
        if self.metrics:
            self.metrics.prompt_tokens.inc(len(token_ids))
        return Generation(self, request_id, stream)

    def _abort(self, request_id: str) -> None:
        with self._streams_lock:
            if self._streams.pop(request_id, None) is None:
                return  # it finished, failed or was aborted already
            self._output.abort(request_id)
        if self.metrics:
            self.metrics.finished.labels(reason="abort").inc()
        if self._started and not self._stopping and self._dead is None:  # draining too: its blocks come back
            self._send(("abort", [request_id]))

    def _send(self, command: tuple) -> None:
        """Never blocks: with no core connected (it died) a command has nowhere to go and is dropped."""
        with self._send_lock:
            try:
                self._commands.send_multipart(pickled_frames(command), zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass

    # -- receiver thread --------------------------------------------------------------------------------------
    def _receive(self) -> None:
        while True:
            if self._outputs.poll(POLL_MS):
                message = pickle.loads(self._outputs.recv())
                if message[0] == "step":
                    try:
                        self._on_step(message[1], message[2])
                    except Exception as e:  # a bug here would leave every open request waiting forever
                        logger.exception("the engine client failed on a step's outputs")
                        return self._client_failed(e)
            elif self._stopping:
                return
            elif not self.core.alive():
                return self._core_died()

    def _on_step(self, updates: list[SeqUpdate], stats: EngineStats | None) -> None:
        now = time.monotonic()
        by_loop: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
        stopped = []
        try:
            with self._streams_lock:
                step = self._output.process(updates)
                stopped = step.stopped
                for u, item in step.outputs:
                    stream = self._streams[u.request_id]
                    if not isinstance(item, Exception):
                        self._observe(stream, u, item, now)  # first: a stream it fails on is still open to fail
                    if is_last(item):
                        del self._streams[u.request_id]
                    by_loop[stream.loop].append((stream.queue, item))
        finally:  # what the step gave before a failure still reaches its clients (finished ones are no longer open)
            if stopped:
                self._send(("abort", stopped))
            for loop, items in by_loop.items():
                _deliver(loop, items)
        if stats is not None:
            if self.metrics:
                self.metrics.update_engine(stats, self._stats)
            self._stats = stats

    def _observe(self, stream: _Stream, u: SeqUpdate, delta: Delta, now: float) -> None:
        m = self.metrics
        if not m:
            return
        m.generation_tokens.inc(len(u.token_ids))
        if stream.first_token_time is None:
            stream.first_token_time = now
            m.ttft.observe(now - stream.arrival)
            m.queue_time.observe(u.queue_s)
            m.prefill_time.observe(u.prefill_s)
        else:
            m.itl.observe(now - stream.last_token_time)
        stream.last_token_time = now
        if delta.finished:
            m.finished.labels(reason=delta.finish_reason).inc()
            m.e2e_latency.observe(now - stream.arrival)
            m.decode_time.observe(now - stream.first_token_time)

    def _core_died(self) -> None:
        self._dead = f"{self.core.exit_note()} unexpectedly; the server cannot serve"
        logger.error("%s: failing %d open requests", self._dead, len(self._streams))
        self._fail_all(EngineDead(self._dead))
        if self.on_death is not None:
            self.on_death()

    def _client_failed(self, error: Exception) -> None:
        self._dead = f"the engine client failed ({type(error).__name__}: {error}); the server cannot serve"
        self._fail_all(EngineDead(self._dead), tell_core=True)
        if self.on_death is not None:
            self.on_death()

    def _fail_all(self, error: Exception, tell_core: bool = False) -> int:
        by_loop = defaultdict(list)
        with self._streams_lock:
            ended = list(self._streams)
            for request_id, stream in self._streams.items():
                self._output.abort(request_id)
                by_loop[stream.loop].append((stream.queue, error))
            self._streams.clear()
        if self.metrics and ended:
            self.metrics.finished.labels(reason="abort").inc(len(ended))
        if tell_core and ended:
            self._send(("abort", ended))
        for loop, items in by_loop.items():
            _deliver(loop, items)
        return len(ended)


def _deliver(loop: asyncio.AbstractEventLoop, items: list) -> None:
    """Hand an event loop its items in one wake-up (not one per request per token)."""
    def put_all():
        for queue, item in items:
            queue.put_nowait(item)
    try:
        loop.call_soon_threadsafe(put_all)
    except RuntimeError:
        pass  # its event loop is closed: nobody is listening any more
