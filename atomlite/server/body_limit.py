"""Request bodies over a size limit get a 413 at once: by their Content-Length before a byte is read, or once a
chunked body passes the limit; nothing big reaches JSON parsing or validation, which run on the event loop that
also answers /health."""
import asyncio
import json

from atomlite.server.errors import error_body
from atomlite.server.timeouts import BODY_TIMEOUT_S

DEFAULT_MAX_REQUEST_SIZE = 4 * 2**20  # a 128k-token prompt as ids is about 1 MiB of JSON


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._too_large(send, int(length))
        body, chunks, more = 0, [], True
        deadline = asyncio.get_running_loop().time() + BODY_TIMEOUT_S
        while more:  # the body whole, at most max_bytes of it, then replayed to the app
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except TimeoutError:
                return await self._error(send, 408, f"the request body did not arrive within {BODY_TIMEOUT_S:g} s")
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message]), send)
            body += len(message.get("body", b""))
            if body > self.max_bytes:
                return await self._too_large(send, None)
            chunks.append(message)
            more = message.get("more_body", False)
        await self.app(scope, _replay(chunks, receive), send)

    async def _too_large(self, send, length: int | None) -> None:
        size = f"{length} bytes" if length is not None else "more"
        await self._error(send, 413, f"the request body has {size}; this server takes at most {self.max_bytes} bytes "
                                     f"(--max-request-size)")

    async def _error(self, send, status: int, message: str) -> None:
        payload = json.dumps(error_body(status, message)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


def _replay(messages: list, then=None):
    """A receive() that gives back the messages already read, then waits on the real one (a disconnect)."""
    queue = list(messages)

    async def receive():
        if queue:
            return queue.pop(0)
        return await then() if then is not None else {"type": "http.disconnect"}
    return receive
