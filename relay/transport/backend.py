"""The QUIC library under the transport: aioquic (the default) or qh3 (the ``fast`` extra).

Both libraries have the same shape (a sans-IO ``QuicConnection`` fed datagrams and a clock,
an ``H3Connection`` with WebTransport, a ``QuicServer`` demultiplexing by connection ID),
so the endpoint drives either through the public calls they share. What differs lives
behind :class:`QuicView`, one small object per connection: how many bytes are still
unsent, whether everything was acknowledged, the peer's stream limit, and receive credit.

Receive credit is where the two differ in kind (see ``docs/transport.md``): aioquic's
credit is raised only as the application reads (``_aioquic.py``), so a stalled reader
holds the peer back; qh3's native core grants credit when it hands data over, so a
stalled reader is bounded by stopping the stream instead (``_qh3.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import TransportError

BACKENDS = ("aioquic", "qh3")
DEFAULT_BACKEND = "aioquic"
_EXTRA = {"qh3": "fast"}


class BackendUnavailable(TransportError):
    """The requested QUIC backend is not installed."""


class QuicView(Protocol):
    """Per-connection answers the endpoint needs beyond the libraries' shared calls."""

    def unsent(self, stream_id: int) -> int:
        """Bytes written to ``stream_id`` and not yet sent."""

    def unsent_total(self) -> int:
        """Bytes written to any stream and not yet sent."""

    def has_room(self, stream_id: int) -> bool:
        """Both ``unsent`` and ``unsent_total`` are below their high-water marks
        (``send_buffer_high``, ``connection_send_buffer_high``): a write may go on. Asked
        before every write, so it is one call where a backend can answer in one."""

    def note_queued(self, n: int) -> None:
        """``n`` application bytes were handed to the library."""

    def note_stream_header(self, stream_id: int) -> None:
        """The library queued a header on a new stream (WebTransport) by itself."""

    def forget_unsent(self, stream_id: int, *, reset_by_peer: bool = False) -> None:
        """A stream was reset: its unsent bytes will never be sent."""

    def drained(self) -> bool:
        """Everything written was sent and acknowledged."""

    def openable(self, stream_id: int) -> int:
        """How many streams of ``stream_id``'s kind, from ``stream_id`` on, the peer's
        stream limit admits now (0: the next one must wait for MAX_STREAMS)."""

    def granted_to_peer(self, uni: bool) -> int:
        """How many streams of that kind we let the peer have open at once."""

    def peer_address(self) -> Any:
        """The peer's current UDP address."""

    def peer_max_datagram_frame_size(self) -> int | None:
        """The peer's max_datagram_frame_size transport parameter."""

    def datagram_size(self) -> int:
        """The largest UDP payload the connection sends: its own ``max_datagram_size``,
        capped by the peer's max_udp_payload_size once known."""

    def peer_close(self) -> Any:
        """The peer's CONNECTION_CLOSE as a ConnectionTerminated, before draining ends."""

    def stream_arrived(self, uni: bool) -> None:
        """A peer stream was surfaced but not yet accepted."""

    def stream_accepted(self, uni: bool) -> None:
        """The application accepted a peer stream."""

    def buffered(self, stream_id: int, n: int) -> bool:
        """``n`` received bytes wait in the application's buffer; True if that exceeds
        the receive bound, so the stream must be stopped."""

    def consumed(self, stream_id: int, n: int) -> bool:
        """The application took ``n`` bytes; True if a credit update should be sent."""

    def relieved(self) -> bool:
        """Unread bytes are back to half the windows (a paused reader may resume)."""

    @property
    def unread_total(self) -> int:
        """Received bytes not yet read by the application, over all streams: the receive
        bound both backends must keep, observed by the transport tests on each."""


class UnreadBytes:
    """Received bytes waiting in the application's stream buffers, per stream and in all:
    what both backends measure their receive bound against."""

    __slots__ = ("per_stream", "total")

    def __init__(self) -> None:
        self.per_stream: dict[int, int] = {}
        self.total = 0

    def add(self, stream_id: int, n: int) -> int:
        """``n`` more bytes wait on ``stream_id``; returns how many wait there now."""
        left = self.per_stream.get(stream_id, 0) + n
        self.per_stream[stream_id] = left
        self.total += n
        return left

    def take(self, stream_id: int, n: int) -> int:
        """The application read ``n`` bytes of ``stream_id``; returns how many still wait."""
        left = self.per_stream[stream_id] - n
        if left:
            self.per_stream[stream_id] = left
        else:
            del self.per_stream[stream_id]
        self.total -= n
        return left


@dataclass(frozen=True, slots=True)
class QuicBackend:
    """One QUIC library, as the endpoint uses it."""

    name: str
    configuration: Callable[..., Any]
    """(settings, is_client, alpn, datagram_size) -> the library's QuicConfiguration, sending
    at most ``datagram_size`` bytes per UDP datagram (the setting resolved: ``auto`` is a
    number per connection)."""
    connection: Callable[..., Any]
    """(configuration) -> a client QuicConnection."""
    server: Callable[..., Any]
    """(configuration, create_protocol) -> an asyncio DatagramProtocol (the QuicServer)."""
    h3: Callable[[Any], Any]
    """(quic) -> an H3Connection with WebTransport enabled."""
    view: Callable[[Any, Any], QuicView]
    """(quic, settings) -> the connection's QuicView; called before the handshake."""
    events: Any
    """The library's ``quic.events`` module."""
    h3_events: Any
    """The library's ``h3.events`` module."""
    forget_h3_stream: Callable[[Any, int], None]
    """Make the H3Connection forget a stream the endpoint routes itself."""
    h3_knows_stream: Callable[[Any, int], bool]
    route: Callable[[Any, bytes], Any]
    """(QuicServer, destination connection ID) -> the connection's protocol, or None."""
    use_configuration: Callable[[Any, Any], None]
    """(QuicServer, configuration): the connections it makes from now on take this one
    (``auto`` datagram size per client: server.py)."""
    receive_many: Callable[[Any, list[bytes], Any, float], None]
    """(quic, datagrams, addr, now): feed several datagrams of one peer at once."""
    receive_gro: Callable[[Any, bytes, int, Any, float], None] | None
    """(quic, buffer, segment size, addr, now): feed one GRO read of one peer uncut (the
    library cuts it natively); None: the burst reader cuts it (burst.py)."""
    take_events: Callable[[Any], None] | None
    """(quic): make what ``receive_many`` and ``receive_gro`` fed available to
    ``next_event``; called once per burst, before its events are read. None: they are
    available at once."""
    send_stream: Callable[[Any, int, Any, bool], None]
    """(quic, stream ID, data, fin): queue ``data`` on a stream (``send_stream_data``, the
    hot path's one library call per write)."""
    poll_datagrams: Callable[[Any, float], tuple[list[tuple[bytes, Any]], Exception | None]]
    """(quic, now) -> the datagrams to send now, and the error that stopped the library
    building more (None if it built everything due). The datagrams come first even when
    building failed midway: the library counted them as sent (loss recovery, and a
    server's anti-amplification budget), so they must reach the wire."""
    closed_error: type[Exception]
    """What the library raises when asked to queue a frame (a PING) on a connection it is
    already closing; the endpoint then stops asking."""
    trust: Callable[[Any, str], None]
    """(client configuration, CA file) -> verify the server against that file."""
    auto_datagram_limit: int
    """The largest datagram ``auto`` picks on this library: what its frames can carry.
    aioquic writes a frame's Length in 2 bytes (16383 at most); qh3's core has no such
    limit, so on loopback (MTU 65536) a qh3 connection sends datagrams of up to 65507 bytes
    (the largest UDP payload over IPv4). A number in the settings stays within 16384 on
    both, so a configuration moves between libraries."""
    credit_on_read: bool
    """Receive credit is granted only as the application reads (aioquic here): a peer can
    never run further ahead of a slow reader than its windows, so a server socket may hold
    a long round trip's burst (burst.UDP_BUFFER_BYTES). Without it (qh3), a server's only
    brake on a sender that outruns the relay is the kernel dropping what its default-sized
    buffer cannot hold; with 4 MiB, a qh3 relay's unread bytes outgrew the windows and it
    stopped a fast publisher's streams (EXCESSIVE_LOAD)."""


def aioquic_shaped(name: str, *, configuration_class: Any, connection_class: Any,
                   server_class: Any, h3_class: Any, events: Any, h3_events: Any,
                   view: Callable[[Any, Any], QuicView],
                   receive_many: Callable[[Any, list[bytes], Any, float], None],
                   poll_datagrams: Callable[[Any, float],
                                            tuple[list[tuple[bytes, Any]], Exception | None]],
                   closed_error: type[Exception], trust: Callable[[Any, str], None],
                   credit_on_read: bool, auto_datagram_limit: int,
                   send_stream: Callable[[Any, int, Any, bool], None] | None = None,
                   receive_gro: Callable[[Any, bytes, int, Any, float], None] | None = None,
                   take_events: Callable[[Any], None] | None = None,
                   configuration_extra: Callable[[Any], dict[str, Any]] = lambda s: {}
                   ) -> QuicBackend:
    """A backend for a library with aioquic's shape (both of ours): what they share is
    written once here, what differs is passed in. Reaches ``H3Connection._stream`` and
    ``QuicServer._protocols``, which both keep (tests/transport/test_transport_backend.py)."""

    def configuration(settings: Any, is_client: bool, alpn: list[str],
                      datagram_size: int) -> Any:
        return configuration_class(
            alpn_protocols=list(alpn), is_client=is_client,
            idle_timeout=settings.idle_timeout, max_datagram_size=datagram_size,
            max_datagram_frame_size=settings.max_datagram_frame_size,
            max_data=settings.max_data, max_stream_data=settings.max_stream_data,
            **configuration_extra(settings))

    return QuicBackend(
        name=name,
        configuration=configuration,
        connection=lambda config: connection_class(configuration=config),
        server=lambda config, create_protocol: server_class(configuration=config,
                                                            create_protocol=create_protocol),
        h3=lambda quic: h3_class(quic, enable_webtransport=True),
        view=view,
        events=events,
        h3_events=h3_events,
        forget_h3_stream=lambda h3, sid: h3._stream.pop(sid, None),
        h3_knows_stream=lambda h3, sid: sid in h3._stream,
        route=lambda server, cid: server._protocols.get(cid),
        use_configuration=_use_configuration,
        receive_many=receive_many,
        receive_gro=receive_gro,
        take_events=take_events,
        send_stream=send_stream or _send_stream_data,
        poll_datagrams=poll_datagrams,
        closed_error=closed_error,
        trust=trust,
        credit_on_read=credit_on_read,
        auto_datagram_limit=auto_datagram_limit,
    )


def _send_stream_data(quic: Any, stream_id: int, data: Any, fin: bool) -> None:
    quic.send_stream_data(stream_id, data, fin)


def _use_configuration(server: Any, config: Any) -> None:
    server._configuration = config  # read whenever a datagram makes a connection


_defaults = {"server": DEFAULT_BACKEND, "client": DEFAULT_BACKEND}


def set_default_backend(*, server: str | None = None, client: str | None = None) -> None:
    """The backend used where :class:`QuicSettings` names none (``backend=None``), per
    role; lets one process (a test run, an embedding program) switch wholesale."""
    for role, name in (("server", server), ("client", client)):
        if name is not None:
            if name not in BACKENDS:
                raise ValueError(f"unknown QUIC backend {name!r}")
            _defaults[role] = name


def default_backend(role: str) -> str:
    """The backend for ``role`` ("server" or "client") when settings name none."""
    return _defaults[role]


def get_backend(name: str = DEFAULT_BACKEND) -> QuicBackend:
    """The backend called ``name``; :class:`BackendUnavailable` if it is not installed."""
    if name not in BACKENDS:
        raise ValueError(f"unknown QUIC backend {name!r} (choose from {', '.join(BACKENDS)})")
    try:
        module = importlib.import_module(f"relay.transport._{name}")
    except ImportError as e:
        extra = _EXTRA.get(name)
        hint = f" (pip install 'kvcs-relay[{extra}]')" if extra else ""
        raise BackendUnavailable(f"QUIC backend {name!r} is not installed{hint}: {e}") from None
    backend: QuicBackend = module.BACKEND
    return backend
