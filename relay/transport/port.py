"""The two seams inside the transport, as the calls that cross them.

::

    Endpoint (endpoint.py, driver.py: one QUIC connection, drives the library)
       ^  EndpointPort: open/send/reset/stop a stream, datagrams, close, transmit soon, view
       |
    StreamTable (connection.py: one session's streams; Connection is its public face)
       ^  StreamPort: unsent bytes, send, reset, stop, receive accounting, retire
       |
    SendStream / RecvStream (streams.py)

Each layer holds the one below it only through these protocols, so a stream cannot reach
the QUIC connection and a session cannot reach the endpoint's internals; the endpoint and
WebTransport (``webtransport.py``) call the table's ``on_*`` events going the other way.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .backend import QuicView
    from .config import QuicSettings
    from .errors import ConnectionClosed
    from .streams import RecvStream, SendStream


class EndpointPort(Protocol):
    """What one session (raw QUIC, or one WebTransport session) asks of its QUIC
    connection. Stream error codes crossing it are on the wire already (WebTransport's
    mapped range where it applies)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def settings(self) -> QuicSettings: ...

    @property
    def view(self) -> QuicView:
        """The library's per-connection answers (unsent bytes, credit, addresses)."""

    @property
    def is_client(self) -> bool: ...

    @property
    def credit_follows_reads(self) -> bool:
        """Receive credit is returned only as the application reads (aioquic): a reader
        that pauses holds the peer back (``QuicBackend.credit_on_read``)."""

    async def open_stream(self, table: StreamTablePort, *, uni: bool) -> int:
        """A new local stream of the session (waits for the peer's stream limit)."""

    def streams_openable(self, *, uni: bool) -> int:
        """How many more local streams of that kind the peer's limit admits now."""

    def send_stream_data(self, stream_id: int, data: Any, fin: bool) -> None: ...

    def send_stream_parts(self, stream_id: int, head: Any, data: Any, fin: bool) -> None:
        """``head`` then ``data`` on the stream: ``send_stream_data`` twice, accounted and
        transmitted once."""

    def reset_stream(self, stream_id: int, wire_code: int) -> None: ...

    def stop_stream(self, stream_id: int, wire_code: int) -> None: ...

    def retire(self, stream_id: int) -> None:
        """Both halves of the stream are done: stop routing its events."""

    def send_datagram(self, session_id: int | None, data: bytes) -> None: ...

    def close_session(self, table: StreamTablePort, code: int, reason: str) -> None: ...

    def transmit_soon(self) -> None:
        """Send what is queued at the next turn of the loop (one transmit for many calls)."""

    def next_transmit(self) -> asyncio.Future[None]:
        """Resolved after the next transmit (ACKs and credit are processed right before)."""

    def receive_overflow(self) -> bool:
        """The application holds more unread than the windows allow: True if the socket
        was paused (a client's own), False if the caller must stop the stream."""

    def receive_relieved(self) -> None:
        """Reading went on: resume a paused socket once the unread bytes are low enough."""

    async def wait_terminated(self, timeout: float) -> None:
        """Until the QUIC connection is gone (its socket released on a client); on timeout
        the client socket is dropped at once."""


class StreamTablePort(Protocol):
    """A session's streams, as the endpoint's calls above name them (the endpoint itself
    holds the concrete ``StreamTable``)."""

    @property
    def session_id(self) -> int | None:
        """The WebTransport CONNECT stream's ID; None for raw QUIC."""

    @property
    def close_exc(self) -> ConnectionClosed | None: ...

    def on_closed(self, exc: ConnectionClosed) -> list[int]:
        """Mark the session closed; the stream IDs it still had open."""


class StreamPort(Protocol):
    """What a stream asks of its session. Codes are MOQT's (the session maps them)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def settings(self) -> QuicSettings: ...

    @property
    def close_exc(self) -> ConnectionClosed | None:
        """Why the session ended, or None while it is open."""

    def unsent(self, stream_id: int) -> int: ...

    def connection_unsent(self) -> int: ...

    def has_room(self, stream_id: int) -> bool:
        """Below both send high-water marks (``QuicView.has_room``)."""

    def send(self, stream_id: int, data: Any, fin: bool) -> None: ...

    def send_parts(self, stream_id: int, head: Any, data: Any, fin: bool) -> None:
        """``head`` then ``data``, as one send (``EndpointPort.send_stream_parts``)."""

    def reset(self, stream_id: int, code: int) -> None: ...

    def stop(self, stream_id: int, code: int) -> None: ...

    def buffered(self, stream_id: int, n: int) -> bool:
        """Account received bytes; True if the stream must be stopped (receive bound)."""

    def consumed(self, stream_id: int, n: int) -> None: ...

    def blocked(self, stream: SendStream, waiting: bool) -> None:
        """``stream`` waits for room (True) or no longer does (False)."""

    def send_done(self, stream: SendStream) -> None: ...

    def recv_done(self, stream: RecvStream) -> None: ...
