"""SIGTERM (or Ctrl-C) as a drain: the server keeps listening, answers /health and new requests with 503, lets the
requests in flight finish for up to the shutdown timeout, ends the rest with an error event (streams) or a 503,
and only then stops uvicorn. A second signal ends the drain at once: the requests still open end the same way
(an error event and [DONE], or an OpenAI-shaped 503) rather than being cut. A third stops as uvicorn's own
handling does."""
import logging
import threading
import time

import uvicorn

from atomlite.engine.ipc.client import AsyncEngine, EngineStopped

logger = logging.getLogger("atomlite.server")
FLUSH_S = 0.5  # for the error events of the requests ended at the timeout to reach their clients


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, timeout: float):
        super().__init__(config)
        self.engine, self.timeout = engine, timeout
        self._draining = False
        self._hurry = threading.Event()

    def handle_exit(self, sig, frame) -> None:
        if self._draining and not self._hurry.is_set():
            logger.warning("second signal: ending the %d requests in flight now", self.engine.num_open)
            self._hurry.set()
            return
        if self._draining or not self.started:
            return super().handle_exit(sig, frame)
        self._draining = True
        self._captured_signals.append(sig)  # uvicorn raises it again once it has stopped (the CLI exits 0)
        self.engine.drain()
        logger.warning("draining: %d requests in flight, up to %.0f s; /health answers 503", self.engine.num_open,
                       self.timeout)
        threading.Thread(target=self._stop_after_drain, name="atomlite-drain", daemon=True).start()

    def _stop_after_drain(self) -> None:
        deadline = time.monotonic() + self.timeout
        while self.engine.num_open and time.monotonic() < deadline and not self._hurry.wait(0.05):
            pass
        why = "a second signal" if self._hurry.is_set() else "--shutdown-timeout"
        ended = self.engine.fail_open(EngineStopped(f"the server shut down before this request finished ({why})"))
        if ended:
            logger.warning("shutdown timeout: ended %d requests with an error (%s)", ended, why)
            time.sleep(FLUSH_S)
        self.should_exit = True
