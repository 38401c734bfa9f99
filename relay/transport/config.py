"""Transport settings (each backend translates them into its own ``QuicConfiguration``)."""

from __future__ import annotations

from dataclasses import dataclass

from .backend import BACKENDS
from .pathmtu import AUTO, SAFE_DATAGRAM_SIZE, path_datagram_size

H3_ALPN = "h3"

CONGESTION_CONTROLS = ("bbr", "reno", "cubic")
"""aioquic's congestion controllers we offer (bbr is ours, relay/transport/congestion.py)."""



@dataclass(frozen=True, slots=True)
class Application:
    """The protocol the transport carries, as its caller gives it (relay/session/wire.py
    for MOQT): the transport itself knows only QUIC and WebTransport."""

    alpn: str
    """Raw QUIC's ALPN, and the WebTransport protocol offered and selected
    (``WT-Available-Protocols`` / ``WT-Protocol``)."""

    receive_overflow_code: int
    """STOP_SENDING code for a stream past its receive bound (``max_stream_data``)."""

    negotiation_failed_code: int
    """Session close code when a WebTransport server selected another protocol."""

KiB = 1024
MiB = 1024 * KiB

MAX_DATAGRAM_SIZE_LIMIT = 16384
"""Largest ``max_datagram_size`` we accept. aioquic writes the Length of every STREAM
and CRYPTO frame as a 2-byte varint (``push_uint16(len | 0x4000)``), so a frame carrying
more than 16383 bytes gets a corrupt length and the peer closes the connection with
FRAME_ENCODING_ERROR ("Failed to parse frame", type 0x0a) — the handshake or the first
full-size packet dies, which looks like a hang at 30000/60000. Measured on loopback:
16384 works, 16440 fails. Beyond loopback, stay at or below the path MTU anyway."""

UDP_PAYLOAD_MAX = 65507
"""The largest UDP payload over IPv4 (65535 - 20 - 8): ``auto``'s limit on a library
whose frames carry any length (qh3), reached on loopback (MTU 65536)."""


@dataclass(frozen=True, slots=True)
class QuicSettings:
    """Everything an operator may tune about QUIC for one endpoint.

    ``max_datagram_size`` is the biggest single throughput lever with aioquic (per-packet
    Python cost dominates): its default, ``auto``, follows the route to each peer.
    """

    max_datagram_size: int | str = AUTO
    """UDP payload size of the QUIC packets we send, or ``"auto"``: per connection, the MTU
    of the route to the peer minus the IP and UDP headers (on loopback 16384 on aioquic and
    65507 on qh3: ``QuicBackend.auto_datagram_limit``; 1472 over a 1500-byte IPv4 link),
    1200 where the route tells nothing (``pathmtu.py``). A number (1200 is always safe)
    fixes it. Either way it is also advertised as our ``max_udp_payload_size``, and we
    never send more than the peer's (docs/transport.md, "Datagram size"). A number is
    capped at :data:`MAX_DATAGRAM_SIZE_LIMIT` (aioquic cannot encode bigger frames) on
    both libraries, so a configuration moves between them."""

    max_datagram_frame_size: int = 65536
    """Advertised DATAGRAM frame size; negotiating RFC 9221 is mandatory for MOQT."""

    idle_timeout: float = 30.0
    """Seconds without any packet from the peer before the connection is dropped."""

    max_streams_bidi: int = 256
    """Peer-initiated bidirectional streams allowed at once (request streams)."""

    max_streams_uni: int = 1024
    """Peer-initiated unidirectional streams allowed at once (subgroup/fetch streams).
    aioquic returns one credit per closed stream, so these are concurrency limits."""

    max_stream_data: int = 4 * MiB
    """Receive window per stream: how many bytes the peer may send ahead of what the
    application has read from that stream. This is the per-stream receive buffer bound."""

    max_data: int = 32 * MiB
    """Receive window per connection: bytes the peer may send ahead of what the
    application has read, summed over all streams. Bounds total receive buffering."""

    send_buffer_high: int = 1 * MiB
    """Per stream: ``write()`` waits while more than this many bytes are queued but not
    yet sent (flow control or congestion control holding them back)."""

    connection_send_buffer_high: int = 16 * MiB
    """Per connection: ``write()`` on any stream waits while the unsent bytes of all
    streams exceed this."""

    application: Application | None = None
    """Set by :func:`~relay.transport.serve` and :func:`~relay.transport.connect` from their
    ``application`` argument, for the endpoint and its streams; not an operator setting."""

    keepalive_interval: float | None = 10.0
    """Send a PING after this many seconds so idle MOQT sessions (a subscriber waiting
    for a publication) outlive ``idle_timeout``; None disables. aioquic sends none."""

    connect_timeout: float = 10.0
    """Seconds for the QUIC handshake plus, for WebTransport, the CONNECT exchange."""

    congestion_control: str = "bbr"
    """aioquic congestion controller: "bbr" (``congestion.py``: paces at a model of the
    path's bandwidth and RTT, so random loss does not slow it down), or aioquic's loss-based
    "reno" or "cubic". qh3's native core has its own and no choice: ignored there.
    docs/transport.md has the measurements behind the default."""

    backend: str | None = None
    """The QUIC library: "aioquic" or "qh3" (the ``fast`` extra; a native core, several
    times faster); None means the process default (:func:`~relay.transport.backend.
    default_backend`, aioquic unless changed). Both ends of a connection choose
    independently."""

    def __post_init__(self) -> None:
        size = self.max_datagram_size
        if size != AUTO and (isinstance(size, bool) or not isinstance(size, int)
                             or not SAFE_DATAGRAM_SIZE <= size <= MAX_DATAGRAM_SIZE_LIMIT):
            raise ValueError(
                f"max_datagram_size must be auto or in [{SAFE_DATAGRAM_SIZE}, "
                f"{MAX_DATAGRAM_SIZE_LIMIT}], got {size!r}")
        if self.max_streams_bidi < 1 or self.max_streams_uni < 4:
            raise ValueError("stream limits too small (HTTP/3 needs 3 uni streams itself)")
        if self.max_stream_data < 16 * KiB or self.max_data < self.max_stream_data:
            raise ValueError("need max_data >= max_stream_data >= 16 KiB")
        if self.keepalive_interval is not None and not (
                0 < self.keepalive_interval < self.idle_timeout):
            raise ValueError("keepalive_interval must be in (0, idle_timeout)")
        if self.send_buffer_high < 1:
            raise ValueError("send_buffer_high must be positive")
        if self.congestion_control not in CONGESTION_CONTROLS:
            raise ValueError(f"unknown congestion controller {self.congestion_control!r} "
                             f"(choose from {', '.join(CONGESTION_CONTROLS)})")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"unknown QUIC backend {self.backend!r} "
                             f"(choose from {', '.join(BACKENDS)})")


def parse_datagram_size(v: object) -> int | str:
    """A ``max_datagram_size`` as written in a flag, env or TOML value: "auto" or a number
    of bytes in [1200, 16384]; ValueError (one line) otherwise."""
    text = str(v).strip().lower()
    if text == AUTO:
        return AUTO
    try:
        n = int(text, 0) if isinstance(v, str) else int(v)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        n = -1
    if isinstance(v, bool) or not SAFE_DATAGRAM_SIZE <= n <= MAX_DATAGRAM_SIZE_LIMIT:
        raise ValueError(f"expected auto or {SAFE_DATAGRAM_SIZE}..{MAX_DATAGRAM_SIZE_LIMIT} "
                         f"bytes, got {v!r}")
    return n


def datagram_size_towards(settings: QuicSettings, addr: object,
                          auto_limit: int = MAX_DATAGRAM_SIZE_LIMIT) -> int:
    """The ``max_datagram_size`` of a connection to ``addr``: the setting's number, or for
    ``auto`` what the route to ``addr`` allows (:func:`~relay.transport.pathmtu.
    path_datagram_size`), at most ``auto_limit`` (the library's:
    ``QuicBackend.auto_datagram_limit``)."""
    size = settings.max_datagram_size
    if size == AUTO:
        return path_datagram_size(addr, auto_limit)
    assert isinstance(size, int)
    return size


def application_of(settings: QuicSettings) -> Application:
    """The protocol an endpoint carries (``serve()``/``connect()`` always set it)."""
    if settings.application is None:
        raise ValueError("no application protocol: serve() and connect() set one")
    return settings.application
