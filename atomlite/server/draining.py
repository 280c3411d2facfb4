"""SIGTERM (or Ctrl-C) as a drain: the server keeps listening, answers /health and new requests with 503, lets the
requests in flight finish for up to the shutdown timeout, ends the rest with an error event (streams) or a 503,
and only then stops uvicorn. A second signal stops at once, as uvicorn's own handling does."""
import logging
import threading
import time

import uvicorn

from atomlite.engine.client import AsyncEngine, EngineStopped

logger = logging.getLogger("atomlite.server")
FLUSH_S = 0.5  # for the error events of the requests ended at the timeout to reach their clients


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, timeout: float):
        super().__init__(config)
        self.engine, self.timeout = engine, timeout
        self._draining = False

    def handle_exit(self, sig, frame) -> None:
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
        while self.engine.num_open and time.monotonic() < deadline:
            time.sleep(0.05)
        ended = self.engine.fail_open(EngineStopped("the server shut down before this request finished "
                                                    "(--shutdown-timeout)"))
        if ended:
            logger.warning("shutdown timeout: ended %d requests with an error", ended)
            time.sleep(FLUSH_S)
        self.should_exit = True
