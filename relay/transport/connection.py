"""One MOQT session's view of the transport: a raw QUIC connection or a WT session."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Literal

from .errors import ConnectionClosed
from .streams import IncomingStream, RecvStream, SendStream
from .webtransport import app_to_wt_error, wt_to_app_error

if TYPE_CHECKING:
    from .config import QuicSettings
    from .endpoint import Endpoint

NetworkAddress = tuple[str, int] | tuple[str, int, int, int]

# Datagrams not yet taken by receive_datagram(); older ones are dropped beyond this
# (datagrams are unreliable by definition, and MOQT's KVCS profile does not use them).
_DATAGRAM_QUEUE = 256
# Bytes of QUIC packet overhead around a DATAGRAM frame in a 1-RTT packet: short header
# (1 + 8-byte CID + up to 4-byte packet number), AEAD tag (16), frame type + length (1+4).
_DATAGRAM_OVERHEAD = 1 + 8 + 4 + 16 + 1 + 4


class Connection:
    """A MOQT session's transport: open/accept streams, datagrams, close.

    Created by :func:`relay.transport.connect` (client) or handed to the server's
    handler. The API is identical for ``transport == "quic"`` (one QUIC connection,
    ALPN ``moqt-22``) and ``transport == "webtransport"`` (one WebTransport session over
    HTTP/3; stream error codes are mapped to and from the WT code space here).
    """

    def __init__(self, endpoint: Endpoint, *, transport: Literal["quic", "webtransport"],
                 session_id: int | None = None, path: str = "", authority: str = "") -> None:
        self._ep = endpoint
        self._loop = endpoint._loop
        self._settings: QuicSettings = endpoint._settings
        self.transport: Literal["quic", "webtransport"] = transport
        self.session_id = session_id
        """The CONNECT stream's ID for WebTransport, None for raw QUIC."""
        self.is_client: bool = endpoint._quic.configuration.is_client
        self.path = path
        """For WebTransport the CONNECT ``:path``; for raw QUIC what the client dialled
        (the server learns the path from the MOQT PATH setup option instead)."""
        self.authority = authority
        self._send: dict[int, SendStream] = {}
        self._recv: dict[int, RecvStream] = {}
        self._incoming: deque[IncomingStream] = deque()
        self._accept_waiter: asyncio.Future[None] | None = None
        self._blocked: set[SendStream] = set()
        self._close_exc: ConnectionClosed | None = None
        self._closed_event = asyncio.Event()
        self._datagrams: deque[bytes] = deque(maxlen=_DATAGRAM_QUEUE)
        self._dgram_waiter: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        role = "client" if self.is_client else "server"
        return f"<Connection {self.transport} {role} {self.remote_address} {self.path!r}>"

    # -- properties --------------------------------------------------------------------

    @property
    def remote_address(self) -> NetworkAddress | None:
        """The peer's current UDP address."""
        return self._ep._view.peer_address()

    @property
    def closed(self) -> bool:
        return self._close_exc is not None

    @property
    def close_info(self) -> ConnectionClosed | None:
        """Why the session ended (code, reason, application), or None while open."""
        return self._close_exc

    @property
    def max_datagram_payload(self) -> int:
        """Largest payload :meth:`send_datagram` can send in one packet."""
        size = self._settings.max_datagram_size - _DATAGRAM_OVERHEAD
        if self.session_id is not None:
            size -= 8  # quarter stream ID varint prefix
        peer = self._ep._view.peer_max_datagram_frame_size()
        return max(0, min(size, peer - 8) if peer is not None else 0)

    # -- streams -----------------------------------------------------------------------

    async def open_uni(self) -> SendStream:
        """Open a unidirectional stream (waits while the peer's stream limit is reached)."""
        sid = await self._ep._open_stream(self, uni=True)
        s = SendStream(self, sid)
        self._send[sid] = s
        return s

    async def open_bi(self) -> tuple[SendStream, RecvStream]:
        """Open a bidirectional stream (waits while the peer's stream limit is reached)."""
        sid = await self._ep._open_stream(self, uni=False)
        s, r = SendStream(self, sid), RecvStream(self, sid)
        self._send[sid] = s
        self._recv[sid] = r
        return s, r

    async def accept(self) -> IncomingStream:
        """Return the next stream opened by the peer, in order of arrival.

        Streams that arrived before the session's SETUP was processed are kept, so
        nothing is lost by accepting late. Raises :class:`ConnectionClosed` once the
        session has ended and every stream that arrived before has been accepted.
        """
        while not self._incoming:
            if self._close_exc is not None:
                raise self._close_exc
            # Several tasks may accept at once: they share one future (shielded, so a
            # cancelled acceptor does not cancel the others' wait).
            if self._accept_waiter is None or self._accept_waiter.done():
                self._accept_waiter = self._loop.create_future()
            await asyncio.shield(self._accept_waiter)
        inc = self._incoming.popleft()
        self._ep._view.stream_accepted(inc.send is None)
        self._ep._transmit_soon()  # the stream credit it held may now be announced
        return inc

    def __aiter__(self) -> Connection:
        return self

    async def __anext__(self) -> IncomingStream:
        try:
            return await self.accept()
        except ConnectionClosed:
            raise StopAsyncIteration from None

    # -- datagrams ---------------------------------------------------------------------

    def send_datagram(self, data: bytes) -> bool:
        """Send a QUIC/WT datagram; returns False (dropped) if it does not fit a packet."""
        if self._close_exc is not None:
            raise self._close_exc
        if len(data) > self.max_datagram_payload:
            return False
        self._ep._send_datagram(self, bytes(data))
        return True

    async def receive_datagram(self) -> bytes:
        """Wait for the next datagram of this session."""
        while not self._datagrams:
            if self._close_exc is not None:
                raise self._close_exc
            if self._dgram_waiter is None or self._dgram_waiter.done():
                self._dgram_waiter = self._loop.create_future()
            await asyncio.shield(self._dgram_waiter)
        return self._datagrams.popleft()

    # -- closing -----------------------------------------------------------------------

    def close(self, code: int = 0, reason: str = "") -> None:
        """Close the session with a MOQT Session Termination code and a short reason.

        Raw QUIC: CONNECTION_CLOSE (application) with ``code``. WebTransport:
        CLOSE_WEBTRANSPORT_SESSION capsule (32-bit code) and FIN on the CONNECT stream.
        Idempotent; pending reads/writes/accepts raise :class:`ConnectionClosed`.
        """
        if self._close_exc is not None:
            return
        if self.session_id is not None and not 0 <= code <= 0xFFFFFFFF:
            raise ValueError("WebTransport session codes are 32-bit")
        self._ep._close_session(self, code, reason)

    async def wait_closed(self) -> tuple[int, str]:
        """Wait until the session has ended and return ``(code, reason)``."""
        await self._closed_event.wait()
        assert self._close_exc is not None
        return self._close_exc.code, self._close_exc.reason

    async def drain(self, timeout: float = 2.0) -> bool:
        """Wait (at most ``timeout``) until everything written has been sent and acknowledged,
        so that a close right after cannot drop it. True if drained."""
        loop, ep = self._loop, self._ep
        deadline = loop.time() + timeout
        while not self._drained():
            remaining = deadline - loop.time()
            if remaining <= 0 or self._close_exc is not None:
                return False
            # woken on every transmit, which follows every packet received (ACKs included)
            fut: asyncio.Future[None] = loop.create_future()
            ep._credit_waiters.append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                return False
        return True

    def _drained(self) -> bool:
        return self._ep._view.drained()

    async def aclose(self, code: int = 0, reason: str = "", timeout: float = 2.0) -> None:
        """Close and, on a client, wait (bounded) until the socket is released."""
        self.close(code, reason)
        if self.is_client:
            try:
                await asyncio.wait_for(self._ep._terminated.wait(), timeout)
            except TimeoutError:
                self._ep._abort()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- called by streams -------------------------------------------------------------

    def _send_data(self, sid: int, data: bytes | bytearray | memoryview, fin: bool) -> None:
        ep = self._ep
        ep._quic.send_stream_data(sid, data, fin)
        ep._view.note_queued(len(data))
        ep._transmit_soon()

    def _unsent(self, sid: int) -> int:
        return self._ep._view.unsent(sid)

    def _conn_unsent(self) -> int:
        return self._ep._view.unsent_total()

    def _wire_code(self, code: int) -> int:
        return code if self.session_id is None else app_to_wt_error(code)

    def _app_code(self, code: int) -> int:
        if self.session_id is None:
            return code
        mapped = wt_to_app_error(code)
        return code if mapped is None else mapped

    def _reset_stream(self, sid: int, code: int) -> None:
        self._ep._view.forget_unsent(sid)
        self._ep._quic.reset_stream(sid, self._wire_code(code))
        self._ep._transmit_soon()

    def _stop_stream(self, sid: int, code: int) -> None:
        try:
            self._ep._quic.stop_stream(sid, self._wire_code(code))
        except ValueError:
            return  # the library already discarded the stream: nothing left to stop
        self._ep._transmit_soon()

    def _buffered(self, sid: int, n: int) -> bool:
        """Account received bytes; True if they overflow the receive bound and the stream
        must be stopped (a backend whose credit does not follow reads, on a server; a client
        pauses its socket instead: docs/transport.md)."""
        return self._ep._view.buffered(sid, n) and not self._ep._receive_overflow()

    def _consumed(self, sid: int, n: int) -> None:
        ep = self._ep
        if ep._view.consumed(sid, n):
            ep._transmit_soon()
        if ep._reader is not None and ep._reader.paused:
            ep._receive_relieved()

    def _send_done(self, s: SendStream) -> None:
        if self._send.pop(s.stream_id, None) is not None and s.stream_id not in self._recv:
            self._ep._retire(s.stream_id)

    def _recv_done(self, r: RecvStream) -> None:
        if self._recv.pop(r.stream_id, None) is not None and r.stream_id not in self._send:
            self._ep._retire(r.stream_id)

    # -- called by the endpoint --------------------------------------------------------

    def _on_new_stream(self, sid: int, uni: bool) -> RecvStream:
        r = RecvStream(self, sid)
        self._recv[sid] = r
        s = None
        if not uni:
            s = SendStream(self, sid)
            self._send[sid] = s
        self._incoming.append(IncomingStream(r, s))
        self._ep._view.stream_arrived(uni)
        w = self._accept_waiter
        if w is not None and not w.done():
            w.set_result(None)
        return r

    def _on_stream_data(self, sid: int, data: bytes, fin: bool) -> None:
        r = self._recv.get(sid)
        if r is not None:
            r._feed(data, fin)

    def _on_stream_reset(self, sid: int, code: int) -> None:
        r = self._recv.get(sid)
        if r is not None:
            r._on_reset(self._app_code(code))

    def _on_stop_sending(self, sid: int, code: int) -> None:
        s = self._send.get(sid)
        if s is not None:
            # QUIC answered with RESET_STREAM: the queued data will never be sent
            self._ep._view.forget_unsent(sid, reset_by_peer=True)
            s._on_stop_sending(self._app_code(code))
            self._send_done(s)

    def _on_datagram(self, data: bytes) -> None:
        self._datagrams.append(data)
        w = self._dgram_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _wake_writers(self) -> None:
        for s in list(self._blocked):
            if s._has_room():
                s._wake()

    def _on_closed(self, exc: ConnectionClosed) -> list[int]:
        """Mark the session closed; return the stream IDs it still had open."""
        if self._close_exc is not None:
            return []
        self._close_exc = exc
        for w in (self._accept_waiter, self._dgram_waiter):
            if w is not None and not w.done():
                w.set_result(None)
        for s in list(self._send.values()):
            s._on_session_closed(exc)
        for r in list(self._recv.values()):
            r._on_session_closed(exc)
        sids = sorted(set(self._send) | set(self._recv))
        self._send.clear()
        self._recv.clear()
        self._closed_event.set()
        return sids
