"""The engine core: the loop that owns an LLMEngine (scheduler, forward passes, sampling, KV cache) and talks to
its client over two ZeroMQ sockets. Commands come in (add, abort, stop); one message goes out per step, carrying
every sequence's new tokens and the engine's stats. It runs in a process of its own under `atomlite serve`, so
the API process's HTTP, tokenizing and streaming never hold the engine's interpreter; tests may run it in a
thread. Messages are pickled Python data (updates.py)."""
import logging
import os
import pickle
import shutil
import signal
import traceback

import zmq

from atomlite.engine.updates import SeqUpdate

logger = logging.getLogger("atomlite.core")
IDLE_POLL_MS = 500  # how often an idle core checks that its parent still lives (else it stops, freeing the GPU)


SEND_TIMEOUT_MS = 1000  # a send with nobody reading waits this long before the core checks on its parent


def parent_gone(parent_pid: int | None) -> bool:
    """Whether the API process that started this core (None: a core on a thread) has died: the core was
    re-parented."""
    return parent_pid is not None and os.getppid() != parent_pid


def pickled_frames(message) -> list:
    """message as zmq frames: its pickle, then the buffers protocol 5 keeps out of band (numpy arrays: an image's
    pixels), sent as they are rather than copied into the pickle."""
    buffers = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    return [data, *(buffer.raw() for buffer in buffers)]


def unpickled_frames(frames: list[zmq.Frame]):
    return pickle.loads(frames[0].buffer, buffers=[frame.buffer for frame in frames[1:]])


def send(socket: zmq.Socket, message, parent_pid: int | None = None) -> bool:
    """Sends message; False if the API process (parent_pid) is gone, since a socket with no reader would block for
    ever."""
    data = pickle.dumps(message, protocol=5)
    while True:
        try:
            socket.send(data, copy=False)
            return True
        except zmq.Again:
            if parent_gone(parent_pid):
                return False


class EngineCore:
    def __init__(self, engine, commands: zmq.Socket, outputs: zmq.Socket, parent_pid: int | None = None):
        self.engine, self.commands, self.outputs = engine, commands, outputs
        self.parent_pid = parent_pid
        self.num_added = 0
        self._stopping = False

    def run(self) -> None:
        while not self._stopping:
            busy = self.engine.has_unfinished()
            took = self.commands.poll(0 if busy else IDLE_POLL_MS) and self._apply_commands()
            if self._stopping or (not busy and not took and parent_gone(self.parent_pid)):
                break
            updates = self._step() if self.engine.has_unfinished() else []
            if took or updates or busy:
                stats = self.engine.stats()
                stats.num_added = self.num_added
                if not self._send(("step", updates, stats)):
                    break
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)

    def _send(self, message) -> bool:
        return send(self.outputs, message, self.parent_pid)

    def _apply_commands(self) -> bool:
        while True:
            try:
                command = unpickled_frames(self.commands.recv_multipart(zmq.NOBLOCK, copy=False))
            except zmq.Again:
                return True
            kind = command[0]
            if kind == "add":
                self._add(*command[1:])
            elif kind == "abort":
                for request_id in command[1]:
                    self.engine.abort(request_id)
            elif kind == "stop":
                self._stopping = True
                return True

    def _add(self, request_id: str, token_ids: list[int], params, priority: int = 0, multimodal=None,
             lora=None) -> None:
        """multimodal: the prompt's MultiModalPrompt (its pixel tensors pickled with the command), or None; lora: its
        LoRARequest, or None."""
        self.num_added += 1
        try:
            self.engine.add_request(request_id, token_ids, params, priority, multimodal, lora_request=lora)
        except ValueError as e:
            self._send(("step", [SeqUpdate(request_id, [], error=str(e), invalid=True)], None))
        except Exception as e:  # a bug, not user input: this request fails, the engine keeps serving
            logger.exception("could not add request %s", request_id)
            self._send(("step", [SeqUpdate(request_id, [], error=f"engine failure: {type(e).__name__}: {e}")],
                        None))

    def _step(self) -> list[SeqUpdate]:
        try:
            return self.engine.step()
        except Exception as e:  # a bug, not user input: fail the requests in flight, keep serving new ones
            logger.exception("engine step failed; aborting the requests in flight")
            if getattr(self.engine, "workers", None) is not None:
                # the other ranks may have run collectives this rank did not: they no longer pair up
                raise RuntimeError("a step failed under tensor parallelism, leaving the ranks out of step; the "
                                   "engine stops") from e
            failed = list(self.engine.requests)
            for request_id in failed:
                self.engine.abort(request_id)
            return [SeqUpdate(r, [], error=f"engine failure: {type(e).__name__}: {e}") for r in failed]


def connect(context: zmq.Context, commands_addr: str, outputs_addr: str) -> tuple[zmq.Socket, zmq.Socket]:
    commands = context.socket(zmq.PULL)
    commands.connect(commands_addr)
    outputs = context.socket(zmq.PUSH)
    outputs.setsockopt(zmq.LINGER, 2000)
    outputs.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    outputs.connect(outputs_addr)
    return commands, outputs


def serve_engine(engine, commands_addr: str, outputs_addr: str) -> None:
    """A thread's core over an engine already built (tests; the offline engine of a test process)."""
    context = zmq.Context()
    commands, outputs = connect(context, commands_addr, outputs_addr)
    try:
        send(outputs, ("ready", [], os.getpid()))
        EngineCore(engine, commands, outputs).run()
    finally:
        commands.close(0)
        outputs.close()
        context.term()


def core_process_main(config, commands_addr: str, outputs_addr: str, parent_pid: int, log_level: int) -> None:
    """The core process: build the engine from config, say ready (with the startup report) or why not, then run.
    Signals are the API process's to handle: Ctrl-C reaches the whole process group, and the API process drains
    its requests first, then stops the core with a command."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(name)s: %(message)s")
    from atomlite.lifetime import exit_with_parent
    ipc_dir = os.path.dirname(commands_addr.removeprefix("ipc://"))
    # the API process gone (any signal, SIGKILL too): stop within a moment, and take its socket folder along
    exit_with_parent(parent_pid, lambda: os.path.basename(ipc_dir).startswith("atomlite-") and shutil.rmtree(
        ipc_dir, ignore_errors=True))
    from atomlite.engine.llm_engine import LLMEngine
    from atomlite.engine.sampling.structured import preload as preload_structured_outputs
    from atomlite.errors import ConfigError
    from atomlite.heap import freeze_startup_heap
    context = zmq.Context()
    commands, outputs = connect(context, commands_addr, outputs_addr)
    try:
        try:
            engine = LLMEngine(config)
        except (ConfigError, ValueError) as e:
            send(outputs, ("failed", str(e)), parent_pid)
            return
        except BaseException as e:
            send(outputs, ("failed", f"the engine could not start: {type(e).__name__}: {e}\n"
                                     f"{traceback.format_exc()}"), parent_pid)
            raise
        try:
            preload_structured_outputs()  # not on the step loop at the first grammar
            engine.structured.start_grammar_process()
            freeze_startup_heap()
            if send(outputs, ("ready", engine.describe(), os.getpid()), parent_pid):
                EngineCore(engine, commands, outputs, parent_pid).run()
        finally:
            engine.close()
    finally:
        commands.close(0)
        outputs.close()
        context.term()
