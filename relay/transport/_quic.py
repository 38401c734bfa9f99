"""aioquic's QuicConnection with receive credit tied to what the application has read.

aioquic grants flow-control credit eagerly: it doubles a stream's MAX_STREAM_DATA (and
the connection's MAX_DATA) whenever the peer has *sent* half of it, whether or not
anyone read the data. A consumer that stops reading therefore buffers without bound.
Here credit is granted only for bytes the application has taken out of
:class:`~relay.transport.streams.RecvStream` buffers: a stream's limit is
``consumed + window`` and the connection's is ``received - unread + window``. Both are
raised in half-window steps so updates are batched.

This overrides two private methods of aioquic 1.x (``_write_stream_limits`` and
``_write_connection_limits``); the test suite's backpressure tests fail loudly if a
future aioquic renames them.
"""

from __future__ import annotations

from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicFrameType
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.stream import QuicStream

from .config import QuicSettings

# one frame type byte plus two varints (stream id, maximum)
_MAX_STREAM_DATA_FRAME_CAPACITY = 1 + 2 * 8


class CreditedQuicConnection(QuicConnection):
    """QuicConnection whose receive windows follow application reads (see module doc)."""

    # Set by adopt(); class-level defaults keep a bare instance usable.
    kv_unread: dict[int, int]
    kv_unaccepted: list[int]  # peer streams not yet accept()ed: [bidi, uni]
    kv_unread_total: int = 0
    kv_stream_window: int = 1 << 20
    kv_conn_window: int = 1 << 24

    def kv_consumed(self, stream_id: int, n: int) -> bool:
        """Account ``n`` bytes read by the application; True if a credit update is due."""
        left = self.kv_unread[stream_id] - n
        if left:
            self.kv_unread[stream_id] = left
        else:
            del self.kv_unread[stream_id]
        self.kv_unread_total -= n
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.receiver.is_finished:
            target = stream.receiver.starting_offset() - left + self.kv_stream_window
            if target - stream.max_stream_data_local >= self.kv_stream_window >> 1:
                return True
        lim = self._local_max_data
        return (lim.used - self.kv_unread_total + self.kv_conn_window - lim.value
                >= self.kv_conn_window >> 1)

    def kv_buffered(self, stream_id: int, n: int) -> None:
        """Account ``n`` bytes handed to the application's buffer but not yet read."""
        self.kv_unread[stream_id] = self.kv_unread.get(stream_id, 0) + n
        self.kv_unread_total += n

    def _write_stream_limits(self, builder: QuicPacketBuilder, space: object,
                             stream: QuicStream) -> None:
        # Called for every stream for every packet built: keep it lean.
        local = stream.max_stream_data_local
        if not local:
            return  # our own unidirectional stream: nothing to grant
        if not stream.receiver.is_finished:
            window = self.kv_stream_window
            target = (stream.receiver.starting_offset()
                      - self.kv_unread.get(stream.stream_id, 0) + window)
            if target - local >= window >> 1:
                stream.max_stream_data_local = local = target
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
        target = lim.used - self.kv_unread_total + self.kv_conn_window
        if target - lim.value >= self.kv_conn_window >> 1:
            lim.value = target
        # aioquic doubles MAX_DATA when used*2 > value; hide `used` so it cannot, and let
        # it handle sending MAX_DATA / MAX_STREAMS as usual.
        used, lim.used = lim.used, 0
        # aioquic returns a stream credit as soon as a peer stream finishes, even if the
        # application never accepted it; hide one credit per unaccepted stream so a peer
        # cannot pile up FIN-only streams faster than they are accepted. (Conservative:
        # an unaccepted stream that is still open is counted twice.) The limit we
        # enforce stays aioquic's, which is never below what we announced.
        hide_b, hide_u = self.kv_unaccepted
        if not (hide_b or hide_u):  # the common case, once per packet: keep it cheap
            try:
                super()._write_connection_limits(builder, space)  # type: ignore[arg-type]
            finally:
                lim.used = used
            return
        bidi, uni = self._local_max_streams_bidi, self._local_max_streams_uni
        vb, vu = bidi.value, uni.value
        bidi.value = max(bidi.sent, vb - hide_b)
        uni.value = max(uni.sent, vu - hide_u)
        try:
            super()._write_connection_limits(builder, space)  # type: ignore[arg-type]
        finally:
            lim.used = used
            bidi.value, uni.value = vb, vu


def adopt(quic: QuicConnection, settings: QuicSettings) -> CreditedQuicConnection:
    """Turn a freshly created QuicConnection into a :class:`CreditedQuicConnection`.

    Must run before the handshake so the stream limits go out in the transport
    parameters. aioquic's server constructs QuicConnection itself, hence adoption by
    class swap rather than construction (the subclass adds no ``__init__`` state).
    """
    quic.__class__ = CreditedQuicConnection
    q: CreditedQuicConnection = quic  # type: ignore[assignment]
    q.kv_unread = {}
    q.kv_unaccepted = [0, 0]
    q.kv_unread_total = 0
    q.kv_stream_window = settings.max_stream_data
    q.kv_conn_window = settings.max_data
    # aioquic hard-codes 128/128 initial stream limits; it returns one credit per closed
    # peer stream afterwards (RFC 9000 4.6), so these are concurrency limits.
    for lim, value in ((q._local_max_streams_bidi, settings.max_streams_bidi),
                       (q._local_max_streams_uni, settings.max_streams_uni)):
        lim.value = lim.sent = value
    return q
