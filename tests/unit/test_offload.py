"""Request preparation runs on the preparation threads, bounded: the event loop's thread never runs it, and
beyond max_pending a request is refused with a 503 rather than queued without end."""
import asyncio
import threading

import pytest

from atomlite.server.errors import APIError
from atomlite.server.offload import Offload


def test_work_runs_off_the_loop_thread_and_its_errors_come_back():
    offload = Offload(threads=1)

    def fail():
        raise APIError(400, "bad", "field")

    async def main():
        ran_on = await offload.run(lambda: threading.get_ident())
        assert ran_on != threading.get_ident()
        with pytest.raises(APIError, match="bad"):
            await offload.run(fail)
    try:
        asyncio.run(main())
    finally:
        offload.close()


def test_beyond_max_pending_a_request_is_a_503_and_the_rest_finish():
    offload, release = Offload(threads=1, max_pending=2), threading.Event()

    async def main():
        first = asyncio.create_task(offload.run(release.wait))
        second = asyncio.create_task(offload.run(lambda: "queued"))
        await asyncio.sleep(0.05)
        with pytest.raises(APIError) as e:
            await offload.run(lambda: "refused")
        assert e.value.status == 503
        release.set()
        assert await first is True and await second == "queued"
        assert await offload.run(lambda: "again") == "again"  # the count went back down
    try:
        asyncio.run(main())
    finally:
        offload.close()
