"""A request's preparation (chat rendering, tokenizing, bad_words, the structured-outputs check) runs on a small
thread pool, never on the event loop that answers /health and feeds every stream.

Threads, not a process: measured on the 2-core CPU machine (bench/hostile_load.py), the loop's longest stall beside
a worker thread was 140 ms while it tokenized a 3.9 MB prompt (7 s of work), 100 ms beside 20,000 bad_words and
8 ms beside a schema nested 300 deep (xgrammar releases the GIL); on the loop itself each stalled it for the whole
time. A process would need the tokenizer and chat template loaded twice and its results pickled back; the longest
GIL-holding calls left (tokenizers turning ids into a Python list) are bounded by the prompt's length, which
max_chars_per_token bounds before anything is tokenized (Server.check_prompt_chars)."""
import asyncio
import concurrent.futures

from atomlite.server.errors import APIError

PREPARE_THREADS = 2
MAX_PREPARING = 256  # requests being prepared or queued for it; beyond, a 503
PREPARE_TIMEOUT_S = 60.0


class Offload:
    def __init__(self, threads: int = PREPARE_THREADS, max_pending: int = MAX_PREPARING,
                 timeout_s: float = PREPARE_TIMEOUT_S):
        self.max_pending, self.timeout_s = max_pending, timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="atomlite-prepare")
        self._pending = 0

    async def run(self, fn, *args):
        """fn(*args) on the pool; its APIError (or any exception) raised here."""
        if self._pending >= self.max_pending:
            raise APIError(503, f"{self._pending} requests are being prepared; retry later")
        self._pending += 1
        try:
            future = self._pool.submit(fn, *args)
            return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except TimeoutError:
            raise APIError(503, f"preparing this request took over {self.timeout_s:.0f} s; retry later") from None
        finally:
            self._pending -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
