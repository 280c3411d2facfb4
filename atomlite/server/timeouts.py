"""Read deadlines, so a client cannot hold a connection (and its share of the server) by sending slowly: a
request's headers must arrive within HEADER_TIMEOUT_S of the connection opening (or of the previous response on a
kept-alive one), its body within BODY_TIMEOUT_S of the headers (body_limit.py answers 408 past it). uvicorn has a
keep-alive timeout for idle connections, but none for a request sent halfway."""
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are late."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._awaited_cycle = None
        self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and self.cycle is not self._awaited_cycle:  # a request's headers came in full
            self._awaited_cycle = self.cycle
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self.transport.close()
