"""The per-QUIC-connection protocol: aioquic events in, sessions and streams out.

One :class:`Endpoint` exists per QUIC connection. With ALPN ``moqt-22`` it carries
exactly one :class:`Connection`; with ALPN ``h3`` it hands HTTP/3 to a
:class:`~relay.transport.webtransport.WebTransport`, which carries one Connection per
WebTransport session (normally one). Sessions reach it through
:class:`~relay.transport.port.EndpointPort`, WebTransport through its ``WebTransportHost``.

Routing rule for stream events: a stream we know (``_owner``) is handled directly, so
WebTransport stream data bypasses the HTTP/3 layer after its header. Unknown streams go
to HTTP/3 only if HTTP/3 is tracking them or they are new peer streams; anything else is
late data for a stream we already finished and is dropped (feeding it to HTTP/3 would
be parsed as a fresh stream and could kill the connection).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .backend import QuicBackend, QuicView
from .burst import ReaderControl
from .config import H3_ALPN, QuicSettings, application_of
from .connection import Connection, StreamTable
from .driver import QuicDriver
from .errors import ConnectionClosed, ProtocolNegotiationError
from .gso import DatagramSender
from .port import StreamTablePort
from .webtransport import WebTransport

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger(__name__)

# TLS alert no_application_protocol (120) as a QUIC CRYPTO_ERROR (0x100 + alert).
_ALPN_ALERT = 0x100 + 120


class Endpoint(QuicDriver):
    """The protocol for one QUIC connection (client or server side), on either backend.

    It drives the backend's sans-IO ``QuicConnection`` itself (datagrams in, events,
    datagrams out, one timer: :class:`~relay.transport.driver.QuicDriver`), through the
    calls aioquic and qh3 share; a backend's ``QuicServer`` creates it per connection and
    feeds it datagrams. This class routes what the library reports to sessions and streams.
    """

    def __init__(self, quic: Any, stream_handler: Any = None, *, backend: QuicBackend,
                 settings: QuicSettings, server: Server | None = None,
                 path: str = "", authority: str = "") -> None:
        super().__init__(quic, backend)
        self._view: QuicView = backend.view(quic, settings)
        self._send = backend.send_stream
        # a client's own socket reader (client.py): paused while the application lets
        # more pile up unread than the receive windows allow, on a backend whose credit
        # does not follow reads (qh3); None on a server's shared socket
        self._reader: ReaderControl | None = None
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._settings = settings
        self._server = server
        self._is_client = quic.configuration.is_client
        self._local_bit = 0 if self._is_client else 1
        self._path = path
        self._authority = authority
        self._wt: WebTransport | None = None  # ALPN h3
        self._raw: Connection | None = None  # ALPN moqt-22
        self._owner: dict[int, StreamTable] = {}
        self._peer_next = {0: 0, 1: 1, 2: 2, 3: 3}
        self._gaps: set[int] = set()
        self._credit_waiters: list[asyncio.Future[None]] = []
        self._quic_closed = False
        self._terminated = asyncio.Event()
        self._ready: asyncio.Future[Connection] = self._loop.create_future()
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- EndpointPort: what a session's Connection and StreamTable call (port.py) ----------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def settings(self) -> QuicSettings:
        return self._settings

    @property
    def view(self) -> QuicView:
        return self._view

    @property
    def is_client(self) -> bool:
        return self._is_client

    @property
    def credit_follows_reads(self) -> bool:
        return self._b.credit_on_read

    async def open_stream(self, table: StreamTablePort, *, uni: bool) -> int:
        q = self._quic
        while True:
            if table.close_exc is not None:
                raise table.close_exc
            nxt = q.get_next_available_stream_id(is_unidirectional=uni)
            if self._view.openable(nxt) > 0:
                break
            # Peer's MAX_STREAMS reached: wait for it to raise the limit (re-checked
            # after every transmit) rather than let aioquic queue a blocked stream.
            await self.next_transmit()
        if table.session_id is None:
            q.send_stream_data(nxt, b"")  # allocates the stream ID now
            sid = nxt
        else:
            assert self._wt is not None
            sid = self._wt.open_stream(table.session_id, uni=uni)
        self._owner[sid] = table  # type: ignore[assignment]  # the StreamTable itself
        return sid

    def streams_openable(self, *, uni: bool) -> int:
        return self._view.openable(
            self._quic.get_next_available_stream_id(is_unidirectional=uni))

    def send_stream_data(self, sid: int, data: Any, fin: bool) -> None:
        self._send(self._quic, sid, data, fin)
        self._view.note_queued(len(data))
        self.transmit_soon()

    def send_stream_parts(self, sid: int, head: Any, data: Any, fin: bool) -> None:
        send, q = self._send, self._quic
        send(q, sid, head, False)
        send(q, sid, data, fin)
        self._view.note_queued(len(head) + len(data))
        self.transmit_soon()

    def reset_stream(self, sid: int, wire_code: int) -> None:
        self._view.forget_unsent(sid)
        self._quic.reset_stream(sid, wire_code)
        self.transmit_soon()

    def stop_stream(self, sid: int, wire_code: int) -> None:
        try:
            self._quic.stop_stream(sid, wire_code)
        except ValueError:
            return  # the library already discarded the stream: nothing left to stop
        self.transmit_soon()

    def retire(self, sid: int) -> None:
        self._owner.pop(sid, None)
        if self._wt is not None:
            self._wt.forget_stream(sid)

    def send_datagram(self, session_id: int | None, data: bytes) -> None:
        if session_id is None:
            self._quic.send_datagram_frame(data)
        else:
            self._quic.send_datagram_frame(WebTransport.frame_datagram(session_id, data))
        self.transmit_soon()

    def close_session(self, table: StreamTablePort, code: int, reason: str) -> None:
        exc = ConnectionClosed(code, reason)
        if table.session_id is None:
            self._quic.close(error_code=code, reason_phrase=reason)
            for sid in table.on_closed(exc):
                self.retire(sid)
            self.wake_credit_waiters()
        else:
            assert self._wt is not None
            self._wt.close(table.session_id, code, reason)
        self.transmit()

    def next_transmit(self) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self._loop.create_future()
        self._credit_waiters.append(fut)
        return fut

    def receive_overflow(self) -> bool:
        if self._reader is None:
            return False
        self._reader.pause()
        return True

    def receive_relieved(self) -> None:
        if self._reader is not None and self._reader.paused and self._view.relieved():
            self._reader.resume()

    # -- for client.py and server.py ---------------------------------------------------

    def use_socket(self, sender: DatagramSender, reader: ReaderControl | None = None) -> None:
        """Send through ``sender`` (GSO batching); ``reader``: a client's own socket reader,
        paused while the application lets more pile up unread than the windows allow."""
        self._sender = sender
        self._reader = reader

    @property
    def transport(self) -> asyncio.DatagramTransport | None:
        return self._transport

    async def ready(self) -> Connection:
        """The client's session once the handshake (and a WebTransport CONNECT) is done."""
        return await asyncio.shield(self._ready)

    @property
    def terminated(self) -> asyncio.Event:
        """Set once the QUIC connection is gone."""
        return self._terminated

    async def wait_terminated(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._terminated.wait(), timeout)
        except TimeoutError:
            self.abort()

    # -- sessions ----------------------------------------------------------------------

    def _sessions_all(self) -> list[Connection]:
        if self._raw is not None:
            return [self._raw]
        return list(self._wt.sessions.values()) if self._wt is not None else []

    def abort(self) -> None:
        """Drop the client socket without waiting for QUIC's closing period."""
        if self._is_client and self._transport is not None:
            self._transport.close()
        self._terminated.set()

    # -- aioquic events ------------------------------------------------------------------

    def is_new_peer_stream(self, sid: int) -> bool:
        if (sid & 1) == self._local_bit:
            return False
        kind = sid & 3
        nxt = self._peer_next[kind]
        if sid >= nxt:
            # aioquic enforces our stream limit, so this range is bounded.
            self._gaps.update(range(nxt, sid, 4))
            self._peer_next[kind] = sid + 4
            return True
        if sid in self._gaps:
            self._gaps.discard(sid)
            return True
        return False

    def quic_event_received(self, event: Any) -> None:
        t, e = type(event), self._ev
        if t is e.StreamDataReceived:
            owner = self._owner.get(event.stream_id)
            if owner is not None:
                owner.on_stream_data(event.stream_id, event.data, event.end_stream)
            elif self._wt is not None:
                self._wt.on_event(event, event.stream_id)
            elif self._raw is not None and self.is_new_peer_stream(event.stream_id):
                table = self._owner[event.stream_id] = self._raw.streams
                table.on_new_stream(event.stream_id, uni=bool(event.stream_id & 2))
                table.on_stream_data(event.stream_id, event.data, event.end_stream)
        elif t is e.StreamReset:
            owner = self._owner.get(event.stream_id)
            if owner is not None:
                owner.on_stream_reset(event.stream_id, event.error_code)
            elif self._wt is not None:
                self._wt.on_stream_reset(event)
            elif self._raw is not None and self.is_new_peer_stream(event.stream_id):
                # Reset before any data: still surfaced, so accept() order is lossless.
                table = self._owner[event.stream_id] = self._raw.streams
                table.on_new_stream(event.stream_id, uni=bool(event.stream_id & 2))
                table.on_stream_reset(event.stream_id, event.error_code)
        elif t is e.StopSendingReceived:
            owner = self._owner.get(event.stream_id)
            if owner is not None:
                owner.on_stop_sending(event.stream_id, event.error_code)
            elif self._wt is not None:
                self._wt.on_event(event, event.stream_id)
        elif t is e.DatagramFrameReceived:
            if self._raw is not None:
                self._raw.streams.on_datagram(event.data)
            elif self._wt is not None:
                self._wt.on_datagram(event.data)
        elif t is e.ProtocolNegotiated:
            self._on_alpn(event.alpn_protocol)
        elif t is e.HandshakeCompleted:
            if self._raw is None and self._wt is None:
                self._on_alpn(event.alpn_protocol)  # qh3 reports the ALPN only here
            self._on_handshake()
        elif t is e.ConnectionTerminated:
            self._on_quic_closed(event)
            self._terminated.set()
            if self._is_client and self._transport is not None:
                self._transport.close()

    def _on_alpn(self, alpn: str | None) -> None:
        if alpn == H3_ALPN:
            self._wt = WebTransport(
                self, wt_path=self._server.wt_path if self._server is not None else None)
        elif alpn == application_of(self._settings).alpn:
            self._raw = Connection(self, transport="quic", path=self._path,
                                   authority=self._authority)

    def _keepalive(self) -> None:
        self._keepalive_timer = None
        if self._quic_closed:
            return
        try:
            self._quic.send_ping(0)
        except self._b.closed_error as e:
            # Closing (our close, or the library's after a protocol error) but not yet
            # reported closed: qh3 refuses new frames then. Nothing is left to keep alive.
            log.debug("%s: keepalive stopped (%s)", self._b.name, e)
            return
        self.transmit()
        self._schedule_keepalive()

    def _schedule_keepalive(self) -> None:
        if self._settings.keepalive_interval and not self._quic_closed:
            self._keepalive_timer = self._loop.call_later(self._settings.keepalive_interval,
                                                          self._keepalive)

    def _on_handshake(self) -> None:
        self._schedule_keepalive()
        if self._is_client:
            if self._raw is not None:
                self.session_ready(self._raw)
            elif self._wt is not None:
                self._wt.send_connect(self._path, self._authority)
            else:
                self.session_failed(ProtocolNegotiationError("server selected no known ALPN"))
        elif self._raw is not None and self._server is not None:
            self._server.spawn_handler(self._raw)

    def _on_quic_closed(self, ev: Any) -> None:
        if self._quic_closed:
            return
        self._quic_closed = True
        for timer in (self._keepalive_timer, self._retry):
            if timer is not None:
                timer.cancel()  # nothing more to send; don't keep the endpoint alive
        self._keepalive_timer = self._retry = None
        app = ev.frame_type is None
        for conn in self._sessions_all():
            if not conn.closed:
                exc = ConnectionClosed(ev.error_code, ev.reason_phrase,
                                       application=app and conn.session_id is None)
                for sid in conn.streams.on_closed(exc):
                    self.retire(sid)
        if ev.error_code == _ALPN_ALERT and not app:
            self.session_failed(ProtocolNegotiationError(
                f"server refused ALPN ({ev.reason_phrase or 'no_application_protocol'})"))
        else:
            self.session_failed(ConnectionClosed(ev.error_code, ev.reason_phrase,
                                              application=app))
        self.wake_credit_waiters()
        if self._wt is not None:
            self._wt.quic_closed()

    def _check_peer_close(self) -> None:
        # Libraries report a peer's CONNECTION_CLOSE only after the draining period
        # (3 PTO); surface the peer's code and reason now.
        close = self._view.peer_close()
        if close is not None and not self._quic_closed:
            self._on_quic_closed(close)

    def _after_transmit(self) -> None:
        # Everything that unblocks writers (ACKs, MAX_STREAM_DATA, MAX_STREAMS) is
        # processed right before a transmit, and transmit moves queued bytes to the wire.
        if self._credit_waiters:
            self.wake_credit_waiters()
        if self._raw is not None:
            self._raw.streams.wake_writers()
        elif self._wt is not None:
            self._wt.wake_writers()

    # -- WebTransportHost: what WebTransport (webtransport.py) calls --------------------

    @property
    def quic(self) -> Any:
        return self._quic

    @property
    def backend(self) -> QuicBackend:
        return self._b

    @property
    def quic_closed(self) -> bool:
        return self._quic_closed

    def adopt(self, sid: int, table: StreamTable) -> None:
        self._owner[sid] = table

    def is_local(self, sid: int) -> bool:
        return (sid & 1) == self._local_bit

    def wake_credit_waiters(self) -> None:
        waiters, self._credit_waiters = self._credit_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def new_session(self, session_id: int, path: str, authority: str) -> Connection:
        return Connection(self, transport="webtransport", session_id=session_id, path=path,
                          authority=authority)

    def session_ready(self, conn: Connection) -> None:
        if not self._ready.done():
            self._ready.set_result(conn)

    def session_failed(self, exc: BaseException) -> None:
        if not self._ready.done():
            self._ready.set_exception(exc)
            self._ready.exception()  # server endpoints never await it: no "never retrieved"

    def accept_session(self, conn: Connection) -> None:
        assert self._server is not None
        self._server.spawn_handler(conn)
