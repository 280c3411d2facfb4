"""Grammars compile in a process of their own, one at a time, at a lower CPU priority than the engine.

In the engine core's process, a compile ran on xgrammar's own threads (eight by default): on the 2-core CPU
machine a 100,000-value enum pushed every running stream's gap between tokens from ~100 ms to 0.7-3 s for the
30 s it ran, and went on for as long again after its limit, unseen, since a compile cannot be stopped. Here it runs
on GRAMMAR_THREADS threads at niceness GRAMMAR_NICENESS, and a compile past its limit, or whose request was dropped,
ends by killing the process (the next compile starts a new one), as does one that leaves it over MAX_WORKER_RSS_MB
(what large grammars grew stays with this process, not the engine's). A compiled grammar comes back as xgrammar's
JSON (serialize_json; the engine side reads it with the tokenizer's TokenizerInfo): for small grammars a few ms.
The process costs ~270 MB (xgrammar imports torch) once a request has asked for a grammar."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from atomlite.lifetime import die_with_parent

GRAMMAR_NICENESS = 10  # a nice-0 thread busy beside it gets ~90% of a shared core
GRAMMAR_THREADS = 1
POLL_S = 0.05  # how often a wait checks its limit and whether the request is still wanted
START_TIMEOUT_S = 120.0  # the process's imports (xgrammar brings torch) on a loaded machine
MAX_WORKER_RSS_MB = 1024  # a process grown past this (large grammars compiled) is replaced by the next compile
WORKER_MAIN = ("import sys; from multiprocessing.connection import Connection; "
               "from atomlite.engine.sampling.grammar_worker import _serve; "
               "_serve(Connection(int(sys.argv[1])), *map(int, sys.argv[2:]))")


class CompileTimeout(Exception):
    pass


class CompileDropped(Exception):
    pass


class _Died(Exception):
    pass


def _serve(conn: Connection, parent_pid: int, niceness: int, threads: int) -> None:
    """The worker: (skip_special_tokens, TokenizerInfo JSON or None once sent, kind, text, field) in, ("ok",
    compiled JSON) or ("error", message) out, until the engine's end of the socket closes."""
    die_with_parent(parent_pid)
    import xgrammar as xgr

    from atomlite.engine.sampling.structured import compile_spec
    # after the imports (at a lower priority they took 40 s on the loaded 2-core machine, and nothing else waits on
    # them), before the compiler's threads start: Linux threads take their creator's niceness
    os.nice(niceness)
    conn.send(("ready", None))
    compilers: dict[bool, xgr.GrammarCompiler] = {}
    while True:
        try:
            skip, info_json, kind, text, field = conn.recv()
        except EOFError:
            return
        if info_json is not None:
            info = xgr.TokenizerInfo.deserialize_json(info_json)
            compilers[skip] = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        try:
            conn.send(("ok", compile_spec(compilers[skip], kind, text, field).serialize_json()))
        except ValueError as e:
            conn.send(("error", str(e)))


def _rss_mb(pid: int) -> float:
    """A process's resident memory (Linux; 0 where /proc does not say)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class GrammarWorker:
    """The engine's end of the worker process; used from one thread (the engine's grammar thread)."""

    def __init__(self, niceness: int = GRAMMAR_NICENESS, threads: int = GRAMMAR_THREADS):
        self.niceness, self.threads = niceness, threads
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._infos_sent: set[bool] = set()

    def start(self) -> None:
        """The process, started and its imports done (not counted against any compile's limit)."""
        if self._process is not None:
            return
        # a plain child process: the engine core is a daemonic multiprocessing process, which may not start one
        ours, theirs = socket.socketpair()
        args = [str(theirs.fileno()), str(os.getpid()), str(self.niceness), str(self.threads)]
        self._process = subprocess.Popen([sys.executable, "-c", WORKER_MAIN, *args], pass_fds=[theirs.fileno()])
        theirs.close()
        self._conn = Connection(ours.detach())
        try:
            started = self._conn.poll(START_TIMEOUT_S) and self._conn.recv()[0] == "ready"
        except (EOFError, OSError):
            started = False
        if not started:
            self.stop()
            raise RuntimeError(f"the grammar process did not start within {START_TIMEOUT_S:g} s")

    def compile(self, skip_special_tokens: bool, tokenizer_info, kind: str, text: str, field: str,
                deadline: float, dropped: Callable[[], bool]) -> str:
        """The compiled grammar's JSON; a ValueError naming field if the spec makes no grammar, CompileTimeout past
        deadline (time.monotonic()), CompileDropped once dropped() says the request is gone; either kills the
        process. A process found dead (killed while idle, say) is replaced once."""
        for attempt in range(2):
            try:
                return self._compile_once(skip_special_tokens, tokenizer_info, kind, text, field, deadline, dropped)
            except _Died:
                if attempt:
                    raise ValueError(f"{field} could not be compiled: the grammar process died (out of memory?)") \
                        from None

    def _compile_once(self, skip_special_tokens: bool, tokenizer_info, kind: str, text: str, field: str,
                      deadline: float, dropped: Callable[[], bool]) -> str:
        self.start()
        info_json = None if skip_special_tokens in self._infos_sent else tokenizer_info.serialize_json()
        try:
            self._conn.send((skip_special_tokens, info_json, kind, text, field))
            self._infos_sent.add(skip_special_tokens)
            while not self._conn.poll(POLL_S):
                gone, late, alive = dropped(), time.monotonic() > deadline, self._process.poll() is None
                if gone or late or not alive:
                    self.stop()
                    if gone:
                        raise CompileDropped()
                    if late:
                        raise CompileTimeout()
                    raise _Died()
            status, value = self._conn.recv()
        except (EOFError, OSError):
            self.stop()
            raise _Died() from None
        if _rss_mb(self._process.pid) > MAX_WORKER_RSS_MB:
            self.stop()
        if status == "error":
            raise ValueError(value)
        return value

    def stop(self) -> None:
        """Kills the process, whatever it is doing."""
        if self._process is None:
            return
        self._process.kill()
        self._process.wait(5)
        self._conn.close()
        self._process, self._conn, self._infos_sent = None, None, set()

