"""One MOQT session's view of the transport: a raw QUIC connection or a WT session.

:class:`Connection` is the application's; :class:`StreamTable` holds the session's streams
and is what the streams (:class:`~relay.transport.port.StreamPort`) and the endpoint (its
``on_*`` events) talk to. Both reach the QUIC connection only through the endpoint's
:class:`~relay.transport.port.EndpointPort`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from .errors import ConnectionClosed
from .h3wire import app_to_wt_error, wt_to_app_error
from .streams import IncomingStream, RecvStream, SendStream

if TYPE_CHECKING:
    from .config import QuicSettings
    from .port import EndpointPort

NetworkAddress = tuple[str, int] | tuple[str, int, int, int]

# Datagrams not yet taken by receive_datagram(); older ones are dropped beyond this
# (datagrams are unreliable by definition, and MOQT's KVCS profile does not use them).
_DATAGRAM_QUEUE = 256
# Bytes of QUIC packet overhead around a DATAGRAM frame in a 1-RTT packet: short header
# (1 + 8-byte CID + up to 4-byte packet number), AEAD tag (16), frame type + length (1+4).
_DATAGRAM_OVERHEAD = 1 + 8 + 4 + 16 + 1 + 4


class RequestStreams(NamedTuple):
    out_in_use: int
    out_granted: int
    in_in_use: int
    in_granted: int


class StreamTable:
    """One session's streams, incoming queue and datagrams: the streams' port onto the
    session (:class:`~relay.transport.port.StreamPort`) and the endpoint's sink for the
    session's events. Maps MOQT stream codes to WebTransport's range and back."""

    def __init__(self, port: EndpointPort, session_id: int | None) -> None:
        self._port = port
        self._view = port.view  # one per QUIC connection, for good: kept for the hot paths
        # asked or called for every write: the view's and the endpoint's own methods, one
        # call each (StreamPort.has_room, send, send_parts)
        self.has_room: Callable[[int], bool] = self._view.has_room
        self.send: Callable[[int, Any, bool], None] = port.send_stream_data
        self.send_parts: Callable[[int, Any, Any, bool], None] = port.send_stream_parts
        self.loop = port.loop
        self.settings: QuicSettings = port.settings
        self.session_id = session_id
        self.send_streams: dict[int, SendStream] = {}
        self.recv_streams: dict[int, RecvStream] = {}
        self._incoming: deque[IncomingStream] = deque()
        self._accept_waiter: asyncio.Future[None] | None = None
        self._blocked: set[SendStream] = set()
        self.close_exc: ConnectionClosed | None = None
        self.closed_event = asyncio.Event()
        self._datagrams: deque[bytes] = deque(maxlen=_DATAGRAM_QUEUE)
        self._dgram_waiter: asyncio.Future[None] | None = None
        # bidirectional streams open now (until both halves are done here), ours and the
        # peer's: MOQT's request streams, the resource a peer's MAX_STREAMS bounds
        self.bidi_open = [0, 0]  # [ours, theirs]
        self._local_bit = 0 if port.is_client else 1

    @property
    def closed(self) -> bool:
        return self.close_exc is not None

    # -- for Connection ----------------------------------------------------------------

    async def open(self, *, uni: bool) -> tuple[SendStream, RecvStream | None]:
        sid = await self._port.open_stream(self, uni=uni)
        s = SendStream(self, sid)
        self.send_streams[sid] = s
        if uni:
            return s, None
        r = RecvStream(self, sid)
        self.recv_streams[sid] = r
        self.bidi_open[0] += 1
        return s, r

    async def accept(self) -> IncomingStream:
        while not self._incoming:
            if self.close_exc is not None:
                raise self.close_exc
            # Several tasks may accept at once: they share one future (shielded, so a
            # cancelled acceptor does not cancel the others' wait).
            if self._accept_waiter is None or self._accept_waiter.done():
                self._accept_waiter = self.loop.create_future()
            await asyncio.shield(self._accept_waiter)
        inc = self._incoming.popleft()
        self._view.stream_accepted(inc.send is None)
        self._port.transmit_soon()  # the stream credit it held may now be announced
        return inc

    async def receive_datagram(self) -> bytes:
        while not self._datagrams:
            if self.close_exc is not None:
                raise self.close_exc
            if self._dgram_waiter is None or self._dgram_waiter.done():
                self._dgram_waiter = self.loop.create_future()
            await asyncio.shield(self._dgram_waiter)
        return self._datagrams.popleft()

    # -- StreamPort: called by streams -------------------------------------------------

    def unsent(self, sid: int) -> int:
        return self._view.unsent(sid)

    def connection_unsent(self) -> int:
        return self._view.unsent_total()

    def _wire_code(self, code: int) -> int:
        return code if self.session_id is None else app_to_wt_error(code)

    def _app_code(self, code: int) -> int:
        if self.session_id is None:
            return code
        mapped = wt_to_app_error(code)
        return code if mapped is None else mapped

    def reset(self, sid: int, code: int) -> None:
        self._port.reset_stream(sid, self._wire_code(code))

    def stop(self, sid: int, code: int) -> None:
        self._port.stop_stream(sid, self._wire_code(code))

    def buffered(self, sid: int, n: int) -> bool:
        """Account received bytes; True if they overflow the receive bound and the stream
        must be stopped (a backend whose credit does not follow reads, on a server; a client
        pauses its socket instead: docs/transport.md)."""
        return self._view.buffered(sid, n) and not self._port.receive_overflow()

    def consumed(self, sid: int, n: int) -> None:
        port = self._port
        if self._view.consumed(sid, n):
            port.transmit_soon()
        port.receive_relieved()

    def blocked(self, stream: SendStream, waiting: bool) -> None:
        if waiting:
            self._blocked.add(stream)
        else:
            self._blocked.discard(stream)

    def send_done(self, s: SendStream) -> None:
        sid = s.stream_id
        if self.send_streams.pop(sid, None) is not None and sid not in self.recv_streams:
            self._retire(sid)

    def recv_done(self, r: RecvStream) -> None:
        sid = r.stream_id
        if self.recv_streams.pop(sid, None) is not None and sid not in self.send_streams:
            self._retire(sid)

    def _retire(self, sid: int) -> None:
        if not sid & 2:
            self.bidi_open[(sid & 1) != self._local_bit] -= 1
        self._port.retire(sid)

    # -- events: called by the endpoint ------------------------------------------------

    def on_new_stream(self, sid: int, uni: bool) -> RecvStream:
        r = RecvStream(self, sid)
        self.recv_streams[sid] = r
        s = None
        if not uni:
            s = SendStream(self, sid)
            self.send_streams[sid] = s
            self.bidi_open[1] += 1
        self._incoming.append(IncomingStream(r, s))
        self._view.stream_arrived(uni)
        w = self._accept_waiter
        if w is not None and not w.done():
            w.set_result(None)
        return r

    def on_stream_data(self, sid: int, data: bytes, fin: bool) -> None:
        r = self.recv_streams.get(sid)
        if r is not None:
            r.on_data(data, fin)

    def on_stream_reset(self, sid: int, code: int) -> None:
        r = self.recv_streams.get(sid)
        if r is not None:
            r.on_reset(self._app_code(code))

    def on_stop_sending(self, sid: int, code: int) -> None:
        s = self.send_streams.get(sid)
        if s is not None:
            # QUIC answered with RESET_STREAM: the queued data will never be sent
            self._view.forget_unsent(sid, reset_by_peer=True)
            s.on_stop_sending(self._app_code(code))
            self.send_done(s)

    def on_datagram(self, data: bytes) -> None:
        self._datagrams.append(data)
        w = self._dgram_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def wake_writers(self) -> None:
        """Writers waiting for room get it if there is some (after every transmit)."""
        if self._blocked:
            for s in list(self._blocked):
                s.wake_if_room()

    def on_closed(self, exc: ConnectionClosed) -> list[int]:
        """Mark the session closed; return the stream IDs it still had open."""
        if self.close_exc is not None:
            return []
        self.close_exc = exc
        for w in (self._accept_waiter, self._dgram_waiter):
            if w is not None and not w.done():
                w.set_result(None)
        for s in list(self.send_streams.values()):
            s.on_session_closed(exc)
        for r in list(self.recv_streams.values()):
            r.on_session_closed(exc)
        sids = sorted(set(self.send_streams) | set(self.recv_streams))
        self.send_streams.clear()
        self.recv_streams.clear()
        self.bidi_open = [0, 0]
        self.closed_event.set()
        return sids


class Connection:
    """A MOQT session's transport: open/accept streams, datagrams, close.

    Created by :func:`relay.transport.connect` (client) or handed to the server's
    handler. The API is identical for ``transport == "quic"`` (one QUIC connection,
    ALPN ``moqt-22``) and ``transport == "webtransport"`` (one WebTransport session over
    HTTP/3; stream error codes are mapped to and from the WT code space here).
    """

    def __init__(self, port: EndpointPort, *, transport: Literal["quic", "webtransport"],
                 session_id: int | None = None, path: str = "", authority: str = "") -> None:
        self._port = port
        self.transport: Literal["quic", "webtransport"] = transport
        self.session_id = session_id
        """The CONNECT stream's ID for WebTransport, None for raw QUIC."""
        self.is_client: bool = port.is_client
        self.path = path
        """For WebTransport the CONNECT ``:path``; for raw QUIC what the client dialled
        (the server learns the path from the MOQT PATH setup option instead)."""
        self.authority = authority
        self.streams = StreamTable(port, session_id)
        """The transport's own (the endpoint routes this session's events to it)."""

    def __repr__(self) -> str:
        role = "client" if self.is_client else "server"
        return f"<Connection {self.transport} {role} {self.remote_address} {self.path!r}>"

    # -- properties --------------------------------------------------------------------

    @property
    def remote_address(self) -> NetworkAddress | None:
        """The peer's current UDP address."""
        addr: Any = self._port.view.peer_address()
        return addr  # type: ignore[no-any-return]

    @property
    def closed(self) -> bool:
        return self.streams.close_exc is not None

    @property
    def credit_follows_reads(self) -> bool:
        """True if the peer gets receive credit only as this side reads (aioquic): not
        reading holds a sender back by flow control. False (qh3): credit is granted before
        the application reads, and a stream whose unread bytes pass its window is stopped
        (server) or the socket is no longer read (client)."""
        return self._port.credit_follows_reads

    @property
    def max_datagram_payload(self) -> int:
        """Largest payload :meth:`send_datagram` can send in one packet."""
        size = self._port.view.datagram_size() - _DATAGRAM_OVERHEAD
        if self.session_id is not None:
            size -= 8  # quarter stream ID varint prefix
        peer = self._port.view.peer_max_datagram_frame_size()
        return max(0, min(size, peer - 8) if peer is not None else 0)

    # -- streams -----------------------------------------------------------------------

    async def open_uni(self) -> SendStream:
        """Open a unidirectional stream (waits while the peer's stream limit is reached)."""
        s, _ = await self.streams.open(uni=True)
        return s

    async def open_bi(self) -> tuple[SendStream, RecvStream]:
        """Open a bidirectional stream (waits while the peer's stream limit is reached)."""
        s, r = await self.streams.open(uni=False)
        assert r is not None
        return s, r

    async def accept(self) -> IncomingStream:
        """Return the next stream opened by the peer, in order of arrival.

        Streams that arrived before the session's SETUP was processed are kept, so
        nothing is lost by accepting late. Raises :class:`ConnectionClosed` once the
        session has ended and every stream that arrived before has been accepted.
        """
        return await self.streams.accept()

    def __aiter__(self) -> Connection:
        return self

    async def __anext__(self) -> IncomingStream:
        try:
            return await self.accept()
        except ConnectionClosed:
            raise StopAsyncIteration from None

    def request_streams(self) -> RequestStreams:
        """Bidirectional (request) streams open now and granted, each way: ``out`` are
        ours, bounded by the peer's MAX_STREAMS; ``in`` the peer's, bounded by ours."""
        t = self.streams
        if t.close_exc is not None:
            return RequestStreams(0, 0, 0, 0)
        ours, theirs = t.bidi_open
        return RequestStreams(ours, ours + self._port.streams_openable(uni=False),
                              theirs, self._port.view.granted_to_peer(False))

    # -- datagrams ---------------------------------------------------------------------

    def send_datagram(self, data: bytes) -> bool:
        """Send a QUIC/WT datagram; returns False (dropped) if it does not fit a packet."""
        if self.streams.close_exc is not None:
            raise self.streams.close_exc
        if len(data) > self.max_datagram_payload:
            return False
        self._port.send_datagram(self.session_id, bytes(data))
        return True

    async def receive_datagram(self) -> bytes:
        """Wait for the next datagram of this session."""
        return await self.streams.receive_datagram()

    # -- closing -----------------------------------------------------------------------

    def close(self, code: int = 0, reason: str = "") -> None:
        """Close the session with a MOQT Session Termination code and a short reason.

        Raw QUIC: CONNECTION_CLOSE (application) with ``code``. WebTransport:
        CLOSE_WEBTRANSPORT_SESSION capsule (32-bit code) and FIN on the CONNECT stream.
        Idempotent; pending reads/writes/accepts raise :class:`ConnectionClosed`.
        """
        if self.streams.close_exc is not None:
            return
        if self.session_id is not None and not 0 <= code <= 0xFFFFFFFF:
            raise ValueError("WebTransport session codes are 32-bit")
        self._port.close_session(self.streams, code, reason)

    async def wait_closed(self) -> tuple[int, str]:
        """Wait until the session has ended and return ``(code, reason)``."""
        await self.streams.closed_event.wait()
        exc = self.streams.close_exc
        assert exc is not None
        return exc.code, exc.reason

    async def drain(self, timeout: float = 2.0) -> bool:
        """Wait (at most ``timeout``) until everything written has been sent and acknowledged,
        so that a close right after cannot drop it. True if drained."""
        port = self._port
        loop = port.loop
        deadline = loop.time() + timeout
        while not port.view.drained():
            remaining = deadline - loop.time()
            if remaining <= 0 or self.streams.close_exc is not None:
                return False
            # woken on every transmit, which follows every packet received (ACKs included)
            try:
                await asyncio.wait_for(port.next_transmit(), remaining)
            except TimeoutError:
                return False
        return True

    async def aclose(self, code: int = 0, reason: str = "", timeout: float = 2.0) -> None:
        """Close and, on a client, wait (bounded) until the socket is released."""
        self.close(code, reason)
        if self.is_client:
            await self._port.wait_terminated(timeout)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
