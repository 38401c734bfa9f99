"""WebTransport over HTTP/3: what aioquic and qh3 leave to the application.

Their H3Connection parses WebTransport streams and datagrams, but the session protocol on
top is ours: the extended CONNECT and its version negotiation headers, capsules on the
CONNECT stream, closing and lingering, the stream error-code mapping, datagram framing.
:class:`WebTransport` runs it for one QUIC connection whose ALPN is ``h3``; the endpoint
hands it what HTTP/3 must see and it asks the endpoint for the rest through
:class:`WebTransportHost`. The wire formats it speaks (error codes, capsules, structured
fields) are the pure functions of ``h3wire.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from .config import QuicSettings, application_of
from .errors import ConnectionClosed, ProtocolNegotiationError, TransportError
from .h3wire import (
    CAPSULE_CLOSE_WEBTRANSPORT_SESSION,
    H3_NO_ERROR,
    HDR_AVAILABLE_PROTOCOLS,
    HDR_PROTOCOL,
    WT_SESSION_GONE,
    CapsuleParser,
    decode_close_capsule,
    encode_close_capsule,
    encode_uint_var,
    parse_sf_item,
    pull_uint_var,
    select_protocol,
    sf_string,
)

if TYPE_CHECKING:
    from .backend import QuicBackend, QuicView
    from .connection import Connection, StreamTable

log = logging.getLogger(__name__)

# How long an endpoint whose last WebTransport session ended waits for the peer to
# finish the CONNECT stream before closing the QUIC connection underneath.
_WT_LINGER = 1.0


class WebTransportHost(Protocol):
    """What :class:`WebTransport` asks of the endpoint it runs in."""

    @property
    def quic(self) -> Any:
        """The library's QuicConnection."""

    @property
    def backend(self) -> QuicBackend: ...

    @property
    def view(self) -> QuicView: ...

    @property
    def settings(self) -> QuicSettings: ...

    @property
    def is_client(self) -> bool: ...

    @property
    def quic_closed(self) -> bool: ...

    def transmit(self) -> None: ...

    def transmit_soon(self) -> None: ...

    def adopt(self, stream_id: int, table: StreamTable) -> None:
        """Route the stream's events to ``table`` from now on."""

    def retire(self, stream_id: int) -> None: ...

    def is_new_peer_stream(self, stream_id: int) -> bool: ...

    def is_local(self, stream_id: int) -> bool: ...

    def wake_credit_waiters(self) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    def new_session(self, session_id: int, path: str, authority: str) -> Connection: ...

    def session_ready(self, conn: Connection) -> None:
        """A client's session is established."""

    def session_failed(self, exc: BaseException) -> None:
        """A client's session could not be established."""

    def accept_session(self, conn: Connection) -> None:
        """A server's new session: hand it to the application."""


class WebTransport:
    """The WebTransport sessions of one QUIC connection (normally one)."""

    def __init__(self, host: WebTransportHost, *, wt_path: str | None = None) -> None:
        self._host = host
        self._app = application_of(host.settings)
        self._b = host.backend
        self.h3: Any = self._b.h3(host.quic)
        self._wt_path = wt_path  # a server's CONNECT path; None on a client
        self.sessions: dict[int, Connection] = {}
        self._capsules: dict[int, CapsuleParser] = {}
        self._peer_finished: dict[int, asyncio.Event] = {}
        self._connect_sid: int | None = None
        self._connect_to = ("", "")  # a client's CONNECT (:path, :authority)

    # -- for the endpoint ----------------------------------------------------------------

    def open_stream(self, session_id: int, *, uni: bool) -> int:
        sid: int = self.h3.create_webtransport_stream(session_id, is_unidirectional=uni)
        self._host.view.note_stream_header(sid)
        self._host.transmit_soon()
        return sid

    def forget_stream(self, sid: int) -> None:
        # H3 never forgets bidi WebTransport streams by itself.
        self._b.forget_h3_stream(self.h3, sid)

    @staticmethod
    def frame_datagram(session_id: int, data: bytes) -> bytes:
        # RFC 9297 HTTP Datagram: quarter stream ID, then the payload. Framed here, not
        # by H3Connection: qh3's still uses the older flow-ID form.
        return encode_uint_var(session_id // 4) + data

    def close(self, session_id: int, code: int, reason: str) -> None:
        conn = self.sessions[session_id]
        self._send_close(session_id, encode_close_capsule(code, reason))
        self._session_closed(conn, ConnectionClosed(code, reason))

    def on_event(self, event: Any, sid: int) -> None:
        """A QUIC stream event for a stream HTTP/3 may own."""
        if self._b.h3_knows_stream(self.h3, sid) or self._host.is_new_peer_stream(sid):
            for h3ev in self.h3.handle_event(event):
                self._on_h3_event(h3ev)

    def on_stream_reset(self, event: Any) -> None:
        self.on_event(event, event.stream_id)
        if event.stream_id in self.sessions:
            self._peer_finished_session(event.stream_id, event.error_code,
                                        "CONNECT stream reset", application=False)

    def on_datagram(self, data: bytes) -> None:
        head = pull_uint_var(data, 0)
        if head is None:
            return  # no quarter stream ID: not a datagram of ours (RFC 9297 says drop)
        conn = self.sessions.get(head[0] * 4)
        if conn is not None and not conn.closed:
            conn.streams.on_datagram(data[head[1]:])

    def send_connect(self, path: str, authority: str) -> None:
        """The client's extended CONNECT."""
        sid = self._host.quic.get_next_available_stream_id()
        self._connect_sid = sid
        self._connect_to = (path, authority)
        self.h3.send_headers(sid, [
            (b":method", b"CONNECT"),
            (b":protocol", b"webtransport"),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
            (HDR_AVAILABLE_PROTOCOLS, sf_string(self._app.alpn)),
            (b"sec-webtransport-http3-draft02", b"1"),
        ])
        self._host.transmit()

    def wake_writers(self) -> None:
        for conn in self.sessions.values():
            conn.streams.wake_writers()

    def quic_closed(self) -> None:
        for ev in self._peer_finished.values():
            ev.set()

    # -- closing -------------------------------------------------------------------------

    def _send_close(self, session_id: int, capsule: bytes) -> None:
        try:
            self.h3.send_data(session_id, capsule, end_stream=True)
        except Exception:  # stream already ended or reset: nothing more to say
            log.debug("could not send on CONNECT stream %d", session_id, exc_info=True)

    def _session_closed(self, conn: Connection, exc: ConnectionClosed) -> None:
        host = self._host
        q = host.quic
        for sid in conn.streams.on_closed(exc):
            # The WT draft: streams of a terminated session are reset/stopped with
            # WT_SESSION_GONE.
            local = host.is_local(sid)
            try:
                if local or not sid & 2:
                    host.view.forget_unsent(sid)
                    q.reset_stream(sid, WT_SESSION_GONE)
                if not local or not sid & 2:
                    q.stop_stream(sid, WT_SESSION_GONE)
            except ValueError:
                pass  # aioquic already discarded that direction
            host.retire(sid)
        host.wake_credit_waiters()
        if all(c.closed for c in self.sessions.values()):
            host.spawn(self._linger(list(self.sessions)))

    async def _linger(self, session_ids: list[int]) -> None:
        # One event after the other, in this task: no gather. A gather's child tasks are
        # cancelled on their own at shutdown (asyncio.run cancels every task), which sets a
        # CancelledError on the gather that nobody retrieves any more ("_GatheringFuture
        # exception was never retrieved", logged at ERROR after WebTransport sessions).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_WT_LINGER):
                for s in session_ids:
                    await self._peer_finished.setdefault(s, asyncio.Event()).wait()
        host = self._host
        if not host.quic_closed and all(c.closed for c in self.sessions.values()):
            host.quic.close(error_code=H3_NO_ERROR, reason_phrase="")
            host.transmit()

    def _peer_finished_session(self, session_id: int, code: int, reason: str,
                               application: bool = True) -> None:
        self._peer_finished.setdefault(session_id, asyncio.Event()).set()
        conn = self.sessions.get(session_id)
        if conn is not None and not conn.closed:
            # Answer with our own FIN on the CONNECT stream, as the WT draft asks.
            self._send_close(session_id, b"")
            self._session_closed(conn, ConnectionClosed(code, reason,
                                                        application=application))
            self._host.transmit()

    def _on_capsule_data(self, session_id: int, data: bytes, ended: bool) -> None:
        parser = self._capsules.setdefault(session_id, CapsuleParser())
        for ctype, value in parser.feed(data):
            if ctype == CAPSULE_CLOSE_WEBTRANSPORT_SESSION:
                try:
                    code, reason = decode_close_capsule(value)
                except ValueError:
                    code, reason = 0, ""
                self._peer_finished_session(session_id, code, reason)
        if ended:
            # FIN without a CLOSE capsule means code 0 (WT draft).
            self._peer_finished_session(session_id, 0, "")

    # -- HTTP/3 events -------------------------------------------------------------------

    def _on_h3_event(self, ev: Any) -> None:
        e = self._b.h3_events
        if isinstance(ev, e.WebTransportStreamDataReceived):
            sid = ev.stream_id
            self.forget_stream(sid)  # from now on the endpoint routes it itself
            conn = self.sessions.get(ev.session_id)
            if conn is None or conn.closed:
                self._reject_stream(sid)
                return
            self._host.adopt(sid, conn.streams)
            conn.streams.on_new_stream(sid, uni=bool(sid & 2))
            conn.streams.on_stream_data(sid, ev.data, ev.stream_ended)
        elif isinstance(ev, e.DataReceived):
            if ev.stream_id in self.sessions:
                self._on_capsule_data(ev.stream_id, ev.data, ev.stream_ended)
        elif isinstance(ev, e.HeadersReceived):
            if self._host.is_client:
                if ev.stream_id == self._connect_sid and ev.stream_id not in self.sessions:
                    self._on_connect_response(ev.stream_id, ev.headers)
            elif ev.stream_id not in self.sessions:
                self._on_connect_request(ev.stream_id, ev.headers)

    def _reject_stream(self, sid: int) -> None:
        q = self._host.quic
        try:
            q.stop_stream(sid, WT_SESSION_GONE)
            if not sid & 2:
                q.reset_stream(sid, WT_SESSION_GONE)
        except ValueError:
            pass

    def _on_connect_response(self, sid: int, headers: list[tuple[bytes, bytes]]) -> None:
        host = self._host
        h = dict(headers)
        status = h.get(b":status", b"")
        if status.startswith(b"1"):
            return  # interim response
        if status != b"200":
            host.session_failed(TransportError(f"WebTransport CONNECT to "
                                               f"{self._connect_to[0]!r} refused: HTTP "
                                               f"{status.decode()}"))
            host.quic.close(error_code=H3_NO_ERROR, reason_phrase="")
            host.transmit()
            return
        proto = parse_sf_item(h.get(HDR_PROTOCOL, b""))
        conn = self.sessions[sid] = host.new_session(sid, *self._connect_to)
        if proto != self._app.alpn:
            host.session_failed(ProtocolNegotiationError(
                f"server selected WT-Protocol {proto!r}, not {self._app.alpn!r}"))
            conn.close(self._app.negotiation_failed_code, "version negotiation failed")
            return
        host.session_ready(conn)

    def _on_connect_request(self, sid: int, headers: list[tuple[bytes, bytes]]) -> None:
        h = dict(headers)
        path = h.get(b":path", b"").decode("utf-8", "replace")
        if h.get(b":method") != b"CONNECT" or h.get(b":protocol") != b"webtransport":
            self._respond(sid, b"400")
            return
        if path.split("?", 1)[0] != self._wt_path:
            self._respond(sid, b"404")
            return
        proto = select_protocol(h.get(HDR_AVAILABLE_PROTOCOLS), self._app.alpn)
        if proto is None:
            # No common MOQT version: refuse rather than guess (WT draft allows either).
            self._respond(sid, b"400")
            return
        self.h3.send_headers(sid, [
            (b":status", b"200"),
            (b"sec-webtransport-http3-draft", b"draft02"),
            (HDR_PROTOCOL, sf_string(proto)),
        ])
        conn = self.sessions[sid] = self._host.new_session(
            sid, path, h.get(b":authority", b"").decode("utf-8", "replace"))
        self._host.transmit()
        self._host.accept_session(conn)

    def _respond(self, sid: int, status: bytes) -> None:
        self.h3.send_headers(sid, [(b":status", status)], end_stream=True)
        self._host.transmit()
