"""The aioquic backend, with receive credit tied to what the application has read.

aioquic grants flow-control credit eagerly: it doubles a stream's MAX_STREAM_DATA (and
the connection's MAX_DATA) whenever the peer has *sent* half of it, whether or not
anyone read the data. A consumer that stops reading therefore buffers without bound.
Here credit is granted only for bytes the application has taken out of
:class:`~relay.transport.streams.RecvStream` buffers: a stream's limit is
``consumed + window`` and the connection's is ``received - unread + window``. Both are
raised in half-window steps so updates are batched.

aioquic has no public hook for any of this, so this module is the one place that reaches
into its privates: the two overridden methods (``_write_stream_limits``,
``_write_connection_limits``) and the fields read in :class:`AioquicView`. Each is named
in ``tests/transport/test_transport_backend.py``, which fails loudly if aioquic renames one.
"""

from __future__ import annotations

from typing import Any

from aioquic.asyncio.server import QuicServer
from aioquic.buffer import Buffer
from aioquic.h3 import events as h3_events
from aioquic.h3.connection import H3Connection
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.congestion.base import create_congestion_control, register_congestion_control
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import (
    QuicFrameType,
    pull_quic_transport_parameters,
    push_quic_transport_parameters,
)
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketPacer, QuicPacketRecovery
from aioquic.quic.stream import QuicStream, QuicStreamSender
from aioquic.tls import Epoch

from .backend import UnreadBytes, aioquic_shaped
from .config import MAX_DATAGRAM_SIZE_LIMIT, QuicSettings
from .congestion import BbrCongestionControl

# one frame type byte plus two varints (stream id, maximum)
_MAX_STREAM_DATA_FRAME_CAPACITY = 1 + 2 * 8

# The private aioquic members this module depends on (checked by a test).
PRIVATE_MEMBERS = {
    QuicConnection: ("_write_stream_limits", "_write_connection_limits", "_streams",
                     "_local_max_data", "_local_max_streams_bidi", "_local_max_streams_uni",
                     "_remote_max_streams_bidi", "_remote_max_streams_uni",
                     "_remote_max_data_used", "_remote_max_datagram_frame_size",
                     "_close_event", "_loss", "_on_max_stream_data_delivery", "_cryptos",
                     "_spaces", "_probe_pending", "_max_datagram_size",
                     "_parse_transport_parameters", "_serialize_transport_parameters"),
    QuicStreamSender: ("_buffer_stop", "_reset_error_code"),
    H3Connection: ("_stream",),
    QuicServer: ("_protocols", "_configuration"),
    QuicPacketRecovery: ("_cc", "_pacer"),
}

# aioquic makes its controller by name from the configuration (congestion_control_algorithm)
register_congestion_control("bbr", BbrCongestionControl)

# Pacing bursts: at least this long at the pacing rate. asyncio's selector sleeps in whole
# milliseconds, so a bucket of aioquic's 16 packets caps the rate at 16 packets per wake-up
# (19 MB/s at 1200 bytes) however fast the model says the path is.
_PACING_BURST_TIME = 0.002


class ModelPacer(QuicPacketPacer):
    """aioquic's pacer, pacing at the controller's :meth:`~relay.transport.congestion.
    BbrCongestionControl.pacing_rate`. aioquic's own paces at window / smoothed RTT, which
    suits Reno (window ~ BDP) but is 2x too fast for a model whose window is 2 x BDP, and
    whose STARTUP and probing phases pace above or below the delivery rate on purpose."""

    def __init__(self, cc: BbrCongestionControl, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self._cc = cc
        self._mss = max_datagram_size

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        rate = self._cc.pacing_rate(smoothed_rtt)
        mss = self._mss
        if rate == float("inf"):
            self.packet_time = None  # no RTT yet: nothing to pace by
            return
        self.packet_time = max(1e-6, min(mss / rate, 1.0))
        burst = max(2 * mss, min(congestion_window // 4,
                                 max(16 * mss, int(rate * _PACING_BURST_TIME))))
        self.bucket_max = burst / rate
        if self.bucket_time > self.bucket_max:
            self.bucket_time = self.bucket_max


def use_model_pacer(quic: QuicConnection) -> None:
    """Pace ``quic`` by its controller's model when it has one (bbr); a no-op for reno and
    cubic. Must run before the first packet is acknowledged (the endpoint does it when it
    adopts the connection; benchmarks on plain aioquic call it themselves)."""
    loss = quic._loss
    if isinstance(loss._cc, BbrCongestionControl) and not isinstance(loss._pacer, ModelPacer):
        loss._pacer = ModelPacer(loss._cc, quic._max_datagram_size)


def _shrink_datagrams(quic: QuicConnection, size: int) -> None:
    """Send datagrams of at most ``size`` bytes from now on (the peer's
    max_udp_payload_size, which aioquic itself ignores). The packet builder reads
    ``_max_datagram_size`` for every datagram; the pacer and, while nothing is in flight (a
    server: the client's parameters come before its first flight), the congestion
    controller are made again for the new size. With packets in flight (a client) the
    controller keeps its window, in bytes, as it is."""
    quic._max_datagram_size = size
    loss = quic._loss
    if loss.bytes_in_flight == 0:
        loss._cc = create_congestion_control(quic.configuration.congestion_control_algorithm,
                                             max_datagram_size=size)
    loss._pacer = QuicPacketPacer(max_datagram_size=size)
    use_model_pacer(quic)


def with_max_udp_payload_size(data: bytes, size: int) -> bytes:
    """Encoded transport parameters ``data`` with max_udp_payload_size set to ``size``."""
    params = pull_quic_transport_parameters(Buffer(data=data))
    params.max_udp_payload_size = size
    buf = Buffer(capacity=len(data) + 16)
    push_quic_transport_parameters(buf, params)
    return buf.data


class CreditedQuicConnection(QuicConnection):
    """QuicConnection whose receive windows follow application reads (see module doc)."""

    # Set by AioquicView; class-level defaults keep a bare instance usable.
    credit_unread: UnreadBytes
    credit_unaccepted: list[int]  # peer streams not yet accept()ed: [bidi, uni]
    credit_stream_window: int = 1 << 20
    credit_conn_window: int = 1 << 24

    def _serialize_transport_parameters(self) -> bytes:
        # aioquic advertises no max_udp_payload_size (65527: anything): ours is the
        # datagram size we chose for this path, so the peer sends no larger (qh3 obeys it)
        return with_max_udp_payload_size(super()._serialize_transport_parameters(),
                                         self._max_datagram_size)

    def _parse_transport_parameters(self, data: bytes,
                                    from_session_ticket: bool = False) -> None:
        super()._parse_transport_parameters(data, from_session_ticket)
        # aioquic validates the peer's max_udp_payload_size (>= 1200) but never applies it
        peer = pull_quic_transport_parameters(Buffer(data=data)).max_udp_payload_size
        if peer is not None and peer < self._max_datagram_size:
            _shrink_datagrams(self, peer)

    def _write_stream_limits(self, builder: QuicPacketBuilder, space: object,
                             stream: QuicStream) -> None:
        # Called for every stream for every packet built, so it only sends: the limit is
        # raised by AioquicView.consumed, when the application reads. A stream's target
        # (bytes handed over - unread + window) moves only then, since bytes handed over
        # and unread grow together when data arrives. (Our own unidirectional streams keep
        # 0 and 0: nothing to grant.)
        local = stream.max_stream_data_local
        if stream.max_stream_data_local_sent != local:
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA,
                capacity=_MAX_STREAM_DATA_FRAME_CAPACITY,
                handler=self._on_max_stream_data_delivery,
                handler_args=(stream,),
            )
            buf.push_uint_var(stream.stream_id)
            buf.push_uint_var(local)
            stream.max_stream_data_local_sent = local

    def _write_connection_limits(self, builder: QuicPacketBuilder, space: object) -> None:
        lim = self._local_max_data
        target = lim.used - self.credit_unread.total + self.credit_conn_window
        if target - lim.value >= self.credit_conn_window >> 1:
            lim.value = target
        bidi, uni = self._local_max_streams_bidi, self._local_max_streams_uni
        if lim.value == lim.sent and bidi.value == bidi.sent and uni.value == uni.sent:
            # Nothing to announce (aioquic's own raise of MAX_DATA is hidden below, and it
            # sends a limit only when its value moved): the common case, once per packet.
            return
        # aioquic doubles MAX_DATA when used*2 > value; hide `used` so it cannot, and let
        # it handle sending MAX_DATA / MAX_STREAMS as usual.
        used, lim.used = lim.used, 0
        # aioquic returns a stream credit as soon as a peer stream finishes, even if the
        # application never accepted it; hide one credit per unaccepted stream so a peer
        # cannot pile up FIN-only streams faster than they are accepted. (Conservative:
        # an unaccepted stream that is still open is counted twice.) The limit we
        # enforce stays aioquic's, which is never below what we announced.
        hide_b, hide_u = self.credit_unaccepted
        if not (hide_b or hide_u):  # the common case, once per packet: keep it cheap
            try:
                super()._write_connection_limits(builder, space)  # type: ignore[arg-type]
            finally:
                lim.used = used
            return
        vb, vu = bidi.value, uni.value
        bidi.value = max(bidi.sent, vb - hide_b)
        uni.value = max(uni.sent, vu - hide_u)
        try:
            super()._write_connection_limits(builder, space)  # type: ignore[arg-type]
        finally:
            lim.used = used
            bidi.value, uni.value = vb, vu


class AioquicView:
    """aioquic's answers for the endpoint (see :class:`~relay.transport.backend.QuicView`)."""

    __slots__ = ("_conn_high", "_granted", "_high", "_q", "_queued")

    def __init__(self, quic: QuicConnection, settings: QuicSettings) -> None:
        # Must run before the handshake so the stream limits go out in the transport
        # parameters. aioquic's server constructs QuicConnection itself, hence adoption by
        # class swap rather than construction (the subclass adds no ``__init__`` state).
        quic.__class__ = CreditedQuicConnection
        q: CreditedQuicConnection = quic  # type: ignore[assignment]
        q.credit_unread = UnreadBytes()
        q.credit_unaccepted = [0, 0]
        q.credit_stream_window = settings.max_stream_data
        q.credit_conn_window = settings.max_data
        # aioquic hard-codes 128/128 initial stream limits; it returns one credit per
        # closed peer stream afterwards (RFC 9000 4.6), so these are concurrency limits.
        for lim, value in ((q._local_max_streams_bidi, settings.max_streams_bidi),
                           (q._local_max_streams_uni, settings.max_streams_uni)):
            lim.value = lim.sent = value
        use_model_pacer(q)
        self._granted = (settings.max_streams_bidi, settings.max_streams_uni)
        self._q = q
        self._queued = 0  # application bytes handed to aioquic (for the connection HWM)
        self._high = settings.send_buffer_high
        self._conn_high = settings.connection_send_buffer_high

    def unsent(self, stream_id: int) -> int:
        stream = self._q._streams.get(stream_id)
        if stream is None:
            return 0
        sender = stream.sender
        return sender._buffer_stop - sender.highest_offset

    def unsent_total(self) -> int:
        return self._queued - self._q._remote_max_data_used

    def has_room(self, stream_id: int) -> bool:
        return (self.unsent(stream_id) < self._high
                and self._queued - self._q._remote_max_data_used < self._conn_high)

    def note_queued(self, n: int) -> None:
        self._queued += n

    def note_stream_header(self, stream_id: int) -> None:
        self._queued += self._q._streams[stream_id].sender._buffer_stop

    def forget_unsent(self, stream_id: int, *, reset_by_peer: bool = False) -> None:
        # reset_by_peer: aioquic already reset the stream in answer to STOP_SENDING, which
        # otherwise marks it as accounted for.
        stream = self._q._streams.get(stream_id)
        if stream is not None and (reset_by_peer or stream.sender._reset_error_code is None):
            self._queued -= stream.sender._buffer_stop - stream.sender.highest_offset

    def drained(self) -> bool:
        q = self._q
        return (self.unsent_total() <= 0 and not self._in_flight()
                and all(s.sender.buffer_is_empty for s in q._streams.values()))

    def _in_flight(self) -> bool:
        """Packets sent and not yet acknowledged or lost. The congestion controller's count
        alone is not it: after a Retry aioquic starts new packet spaces and never takes the
        first Initial out of that count, so a client retried (a qh3 relay retries aioquic's
        first Initial, docs/transport.md) never looked drained and every close waited out
        ``drain``'s 2 s."""
        loss = self._q._loss
        return loss.bytes_in_flight > 0 and any(
            p.in_flight for space in loss.spaces for p in space.sent_packets.values())

    def openable(self, stream_id: int) -> int:
        q = self._q
        limit = q._remote_max_streams_uni if stream_id & 2 else q._remote_max_streams_bidi
        return max(0, limit - stream_id // 4)

    def granted_to_peer(self, uni: bool) -> int:
        return self._granted[uni]

    def peer_address(self) -> Any:
        return self._q.get_peer_address()

    def peer_max_datagram_frame_size(self) -> int | None:
        return self._q._remote_max_datagram_frame_size

    def datagram_size(self) -> int:
        return self._q._max_datagram_size

    def peer_close(self) -> Any:
        # aioquic reports a peer's CONNECTION_CLOSE only after its draining period.
        return self._q._close_event

    def stream_arrived(self, uni: bool) -> None:
        self._q.credit_unaccepted[uni] += 1

    def stream_accepted(self, uni: bool) -> None:
        self._q.credit_unaccepted[uni] -= 1

    def buffered(self, stream_id: int, n: int) -> bool:
        self._q.credit_unread.add(stream_id, n)
        return False  # QUIC flow control itself keeps the peer within our windows

    def consumed(self, stream_id: int, n: int) -> bool:
        q = self._q
        left = q.credit_unread.take(stream_id, n)
        stream = q._streams.get(stream_id)
        if stream is not None and not stream.receiver.is_finished:
            # raised in half-window steps; the next packet built announces it
            target = stream.receiver.starting_offset() - left + q.credit_stream_window
            if target - stream.max_stream_data_local >= q.credit_stream_window >> 1:
                stream.max_stream_data_local = target
                return True
        lim = q._local_max_data
        return (lim.used - q.credit_unread.total + q.credit_conn_window - lim.value
                >= q.credit_conn_window >> 1)

    def relieved(self) -> bool:
        return True  # never paused: QUIC flow control holds the peer back

    @property
    def unread_total(self) -> int:
        return self._q.credit_unread.total


def _receive_many(quic: QuicConnection, datagrams: list[bytes], addr: Any, now: float
                  ) -> None:
    for data in datagrams:
        quic.receive_datagram(data, addr, now=now)
    if quic.configuration.is_client:
        _nudge_handshake(quic)  # a no-op once the handshake is done (see there)


def _nudge_handshake(quic: QuicConnection) -> None:
    """A client that holds Handshake keys but has had no Handshake packet from the server
    puts a Handshake PING into the datagram that acknowledges the server's Initial, instead
    of sending one at its probe timeout. A qh3 server answering an aioquic client builds
    no Handshake flight after its Initial until a Handshake packet from the client arrives
    (its transmit fails, "packet builder capacity exhausted", however often it is retried):
    the client's probe timeout came first, three round trips late (the QUIC handshake took
    177 ms at 40 ms RTT, 48 ms between any other pair of backends). Any other server only
    gets one small packet more. Once the client has a Handshake packet, or has discarded
    its Handshake keys (the handshake is done), nothing happens here: asked after every
    burst, it needs no flag of the library's to know the handshake is over."""
    if quic._spaces[Epoch.HANDSHAKE].largest_received_packet < 0 \
            and quic._cryptos[Epoch.HANDSHAKE].send.is_valid():
        quic._probe_pending = True


def _poll_datagrams(quic: QuicConnection, now: float
                    ) -> tuple[list[tuple[bytes, Any]], Exception | None]:
    return quic.datagrams_to_send(now=now), None  # builds all or raises a bug: nothing to keep


class _NeverRaised(Exception):
    """aioquic queues a PING on a closing connection without complaint."""


BACKEND = aioquic_shaped(
    "aioquic", configuration_class=QuicConfiguration, connection_class=QuicConnection,
    server_class=QuicServer, h3_class=H3Connection, events=events, h3_events=h3_events,
    view=AioquicView, receive_many=_receive_many,
    poll_datagrams=_poll_datagrams, closed_error=_NeverRaised,
    trust=lambda config, ca_file: config.load_verify_locations(cafile=ca_file),
    configuration_extra=lambda s: {"congestion_control_algorithm": s.congestion_control},
    credit_on_read=True,
    auto_datagram_limit=MAX_DATAGRAM_SIZE_LIMIT,  # its frames' 2-byte Length
)
