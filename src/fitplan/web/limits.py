"""Connection limits of ``fitplan serve``: uvicorn's HTTP/1.1 protocol (h11) with a request-read timeout and a
cap on open connections.

uvicorn 0.55 has neither: its ``timeout_keep_alive`` starts only once a response is complete
(``uvicorn/protocols/http/h11_impl.py``, ``on_response_complete``) and is cancelled by the next byte, so a
client that sends half a request line holds the connection forever; its ``limit_concurrency`` answers 503 only
once a request's headers have arrived (``handle_events``), so such connections are never counted against it.
:class:`LimitedH11Protocol` closes a connection whose request (headers and body) has not fully arrived
``read_timeout`` seconds after the connection opened or after the previous response, and answers 503 and
closes a connection opened while ``max_connections`` are open. The header size is bounded by uvicorn's own
``h11_max_incomplete_event_size`` (:func:`fitplan.web.server.make_server`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

READ_TIMEOUT_S = 10.0
"""A request must arrive within this long of the connection opening (or of the previous response)."""
MAX_CONNECTIONS = 64
"""Open connections at most; one more is answered 503 and closed."""
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
           b"content-length: 34\r\n\r\ntoo many connections to the server")


def limited_protocol(read_timeout: float = READ_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS) -> type:
    """An :class:`LimitedH11Protocol` class with these limits (uvicorn's ``http=`` takes a class)."""
    return type("LimitedH11Protocol", (LimitedH11Protocol,), {"read_timeout": read_timeout,
                                                              "max_connections": max_connections})


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the module's two limits."""

    read_timeout: float = READ_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(REFUSED)
            transport.close()
            return
        self.arm_read_timer()

    def arm_read_timer(self) -> None:
        if self.read_timer is not None:
            self.read_timer.cancel()
        self.read_timer = self.loop.call_later(self.read_timeout, self.read_timed_out)

    def read_timed_out(self) -> None:
        """Close the connection unless its request has been read entirely (h11: the client's state is DONE)."""
        self.read_timer = None
        if self.transport.is_closing() or self.conn.their_state is h11.DONE:
            return
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self.arm_read_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.read_timer is not None:
            self.read_timer.cancel()
            self.read_timer = None
        super().connection_lost(exc)
