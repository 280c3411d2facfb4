"""Run the real app under uvicorn on a free 127.0.0.1 port, in a thread of the test process."""
import contextlib
import threading
import time

import httpx
import uvicorn

from atomlite.accuracy.runner import free_port
from atomlite.server.timeouts import TimedH11Protocol


@contextlib.contextmanager
def running(app):
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=5, http=TimedH11Protocol))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("server did not become healthy")
        time.sleep(0.05)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(15)


def metric(text: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name) and (not labels or f"{{{want}}}" in line):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def wait_for_idle(base: str, timeout: float = 20.0) -> str:
    """/metrics once nothing runs or waits and every KV block is back."""
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{base}/metrics").text
        used = [float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith("atomlite:kv_blocks_used")]
        if (metric(text, "atomlite:num_requests_running") == 0 and metric(text, "atomlite:num_requests_waiting") == 0
                and used and not any(used)):
            return text
        if time.monotonic() > deadline:
            return text
        time.sleep(0.1)
