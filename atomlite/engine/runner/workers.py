"""The ranks after rank 0 under tensor parallelism, one process per GPU, started by rank 0's engine (no torchrun).

Each worker builds its EngineRank (its shards, its KV cache, its graphs) exactly as rank 0 builds its own, joined to
rank 0 by torch.distributed (nccl, which is RCCL on ROCm; gloo on CPU). Then it follows: rank 0's runner sends it
every step's inputs (a RunnerStep, over a ZeroMQ socket), and it runs the same forward on its shards, the
collectives joining the ranks. Rank 0 alone schedules, samples and talks to the API server.

A worker stops when told (close), when rank 0's process is gone, or never by a signal: Ctrl-C and SIGTERM are rank
0's to handle, which then stops every rank. Told to stop, a worker releases its graphs, leaves the group and exits;
rank 0, whose process holds the group's store, leaves last. A worker that dies would leave rank 0 waiting in a
collective for ever, so rank 0 exits too, saying which rank died and how (while starting, only if it has not failed
on its own by then).
"""
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import zmq

from atomlite.distributed import TensorParallel
from atomlite.distributed.local import free_port
from atomlite.lifetime import die_with_parent

logger = logging.getLogger("atomlite.workers")
POLL_MS = 500  # how often an idle worker checks that rank 0's process still lives
STOP_WAIT_S = 30  # how long close waits for the workers to exit before killing them
LEAVE_WAIT_S = 20  # leave_group
STARTUP_GRACE_S = 10  # Workers._exit_after
STARTUP_TIMEOUT = timedelta(minutes=30)  # joining the group: a large checkpoint loads first on every rank


def join_group(rank: int, size: int, port: int, device: torch.device) -> TensorParallel:
    """This process as rank `rank` of the tensor-parallel group (the default process group)."""
    if device.type == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=STARTUP_TIMEOUT)
    return TensorParallel(rank, size)


def leave_group() -> None:
    """Leaves the process group, so that the process may join another. nccl's graceful shutdown waits on the other
    ranks and on the graphs that captured its kernels (it was seen to hang for good), so an nccl group is aborted:
    each rank frees its own communicator. Gives up after LEAVE_WAIT_S, saying so."""
    if not dist.is_initialized():
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    leave = abort if dist.get_backend() == "nccl" and abort is not None else dist.destroy_process_group
    leaving = threading.Thread(target=leave, name="atomlite-tp-leave", daemon=True)
    leaving.start()
    leaving.join(LEAVE_WAIT_S)
    if leaving.is_alive():
        logger.warning("the tensor-parallel group did not shut down in %d s; leaving it as it is", LEAVE_WAIT_S)


class Workers:
    """Rank 0's handle on ranks 1..size-1: starts them and joins the group (tp), sends them each step (send),
    stops them (close)."""

    def __init__(self, config):
        size = config.tensor_parallel_size
        port, self._context = free_port(), zmq.Context()
        self._sockets, self._processes = [], []
        self._closing = False
        self.started = False  # set once every rank is built (LLMEngine): until then a worker's exit may be the
        try:                  # same error rank 0 is about to raise itself
            for rank in range(1, size):
                socket = self._context.socket(zmq.PUSH)
                socket.setsockopt(zmq.LINGER, 0)
                address = f"tcp://127.0.0.1:{socket.bind_to_random_port('tcp://127.0.0.1')}"
                self._sockets.append(socket)
                self._processes.append(_spawn(config, rank, size, port, address))
            threading.Thread(target=self._watch, name="atomlite-tp-watch", daemon=True).start()
            self.tp = join_group(0, size, port, config.torch_device)
        except BaseException:
            self.close()
            raise

    def send(self, step) -> None:
        data = pickle.dumps(step, protocol=5)
        for socket in self._sockets:
            socket.send(data, copy=False)

    def close(self) -> None:
        """Stops every worker (killing those that do not stop in time) and leaves the group. Once every rank is
        built, rank 0 leaves last: its process holds the group's TCPStore, and a worker whose store vanished
        before it left the group prints c10d tracebacks (nccl's monitor threads poll the store). A rank 0 that
        fails while starting leaves first instead: a worker may be waiting in a startup collective, which only
        ends once rank 0 has left."""
        if self._closing:
            return
        self._closing = True
        for socket in self._sockets:
            try:
                socket.send(pickle.dumps(None), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # a worker still starting reads nothing: it is killed below
        if not self.started:
            leave_group()
        self._wait_for_workers()
        leave_group()
        for socket in self._sockets:
            socket.close(0)
        self._context.term()

    def _wait_for_workers(self) -> None:
        for process in self._processes:
            try:
                process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def death(self, wait_s: float = 1.0) -> str | None:
        """How a worker that exited ended ("tensor-parallel rank 1 was killed by SIGKILL"), or None if every
        worker still lives after wait_s: a collective that failed for a dead peer may fail before its exit is seen."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, process in enumerate(self._processes, start=1):
                if process.poll() is not None:
                    return f"tensor-parallel rank {rank} {exit_cause(process.returncode)}"
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_MS / 10000)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    def _watch(self) -> None:
        while not self._closing:
            for rank, process in enumerate(self._processes, start=1):
                code = process.poll()
                if code is not None and not self._closing:
                    self._exit_after(rank, code)
            threading.Event().wait(POLL_MS / 1000)

    def _exit_after(self, rank: int, code: int) -> None:
        """A worker died: this process exits too, since its next collective would wait for ever. While starting,
        rank 0 gets STARTUP_GRACE_S to fail with the same error itself (a config or memory error every rank meets),
        which the caller then sees instead of an exit."""
        if not self.started:
            deadline = time.monotonic() + STARTUP_GRACE_S
            while not self._closing and time.monotonic() < deadline:
                threading.Event().wait(POLL_MS / 1000)
            if self._closing:
                return
        logger.error("tensor-parallel rank %d %s: the ranks left cannot go on, so this process exits too", rank,
                     exit_cause(code))
        os._exit(1)


def exit_cause(code: int) -> str:
    """How a worker ended, from its Popen return code (minus a signal's number where a signal ended it)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}" + (" (the kernel's out-of-memory killer sends it too)"
                                          if -code == signal.SIGKILL else "")
    return f"exited with code {code} (its log above says why)"


def _spawn(config, rank: int, size: int, port: int, address: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "atomlite.engine.runner.workers"], stdin=subprocess.PIPE)
    process.stdin.write(pickle.dumps((config, rank, size, port, address, os.getpid(),
                                      logging.getLogger().level)))
    process.stdin.close()
    return process


def follow(runner, socket: zmq.Socket, parent_pid: int) -> bool:
    """Runs rank 0's steps until told to stop (True) or rank 0's process is gone (False)."""
    while True:
        if not socket.poll(POLL_MS):
            if os.getppid() != parent_pid:
                return False
            continue
        step = pickle.loads(socket.recv())
        if step is None:
            return True
        runner.follow(step)


def worker_main() -> None:
    config, rank, size, port, address, parent_pid, log_level = pickle.loads(sys.stdin.buffer.read())
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=f"%(name)s (rank {rank}): %(message)s")
    device = config.torch_device
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))  # the ranks share the cores
    from atomlite.engine.runner.rank import EngineRank
    from atomlite.errors import ConfigError
    from atomlite.heap import freeze_startup_heap
    context = zmq.Context()
    socket = context.socket(zmq.PULL)
    socket.connect(address)  # before the build: rank 0's first steps wait here, not in its send
    try:
        try:
            engine_rank = EngineRank(config, join_group(rank, size, port, device))
        except ConfigError as e:  # rank 0 meets it too and says it; this rank only stops
            logger.debug("stopped: %s", e)
            sys.exit(2)
        freeze_startup_heap()  # a collector's pause on one rank holds up every rank at the next collective
        if not follow(engine_rank.runner, socket, parent_pid):
            os._exit(1)  # rank 0 is gone: its GPU work may never end, so nothing waits for it
        engine_rank.runner.release_graphs()
    finally:
        socket.close(0)
        context.term()
        leave_group()


if __name__ == "__main__":
    worker_main()
