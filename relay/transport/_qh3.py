"""The qh3 backend: aioquic's API shape over a native QUIC core (the ``fast`` extra).

qh3's ``QuicConnection`` is a facade over ``QuicConnectionCore``: packet protection,
recovery and flow control run natively, and only public calls are needed for sending
(``get_send_buffer_size`` tells what is still unsent). Two things differ from aioquic and
are handled here, each written down in ``docs/transport.md``:

* Receive credit: the core returns flow-control credit as soon as it hands data to the
  application, whether or not it was read; there is no hook to withhold it. So a stalled
  reader is bounded here instead, once a stream holds more unread bytes than its window
  (``max_stream_data``) or the connection more than ``max_data``: a client stops reading its
  own UDP socket until the application has caught up to half the windows (the peer is
  slowed by loss and congestion control), a server, whose socket all its clients share,
  stops the over-full stream (STOP_SENDING, EXCESSIVE_LOAD) and drops its buffer.
* Stream concurrency: the core announces fixed peer stream limits (100 bidirectional,
  103 unidirectional) and returns credit as streams close; ``max_streams_*`` do not apply.
* Sending: the core can fail to build a packet ("packet builder capacity exhausted"), e.g.
  a server whose anti-amplification budget (3x what the client sent) is smaller than its
  next frame, after a lost first Initial. qh3's ``datagrams_to_send`` then raises and drops
  the datagrams it had already built in that call, which the core has counted as sent:
  they were lost, and a server spent its budget on them, so a handshake after a lost first
  Initial never completed. ``_poll_datagrams`` polls the core itself and keeps them.

* Address validation: the core credits a client's datagram toward the anti-amplification
  limit (RFC 9000 8.1: 3x what the client sent) by the QUIC packets in it, not by the whole
  datagram. A client that pads its first Initial datagram to 1200 bytes with bytes after the
  packet (picoquic: a 307-byte Initial packet and 945 zero bytes) gets a server flight of
  3 x 307 = 921 bytes: the ServerHello alone, in an Initial datagram shorter than 1200 bytes,
  which picoquic discards (RFC 9000 14.1), and the handshake only ends, if ever, once enough
  of its retransmissions have raised the budget (never while the relay is busy). Such a
  client is sent a Retry instead (``_Qh3Server``): its second Initial carries the token, the
  path is validated, and no limit applies. aioquic clients pad the same way and are retried
  too; clients whose Initial packet fills the datagram (qh3, moq-rs) are never asked to.

The few private members read (``_core``, ``_remote_addr``, ``_close_event``,
``_remote_max_datagram_frame_size``, ``H3Connection._stream``) are listed in
``PRIVATE_MEMBERS`` and checked by ``tests/transport/test_transport_backend.py``.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

from qh3 import tls as qh3_tls
from qh3._hazmat import Buffer, pull_quic_header
from qh3.asyncio.server import QuicServer
from qh3.h3 import events as h3_events
from qh3.h3.connection import H3Connection
from qh3.quic import events
from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import QuicConnection, QuicConnectionError
from qh3.quic.packet import (
    QuicErrorCode,
    QuicPacketType,
    encode_quic_retry,
    pull_quic_transport_parameters,
    push_quic_transport_parameters,
)
from qh3.quic.retry import QuicRetryTokenHandler

from .backend import UnreadBytes, aioquic_shaped
from .config import UDP_PAYLOAD_MAX, QuicSettings
from .tls import pinned_self_signed

PRIVATE_MEMBERS_INSTANCE = ("_core", "_remote_addr", "_close_event",
                            "_remote_max_datagram_frame_size", "_handshake_complete",
                            "_pre_handshake_state_replayed",
                            "_quic_logger", "_drain_core",
                            "_configuration", "_create_tls", "_tls",
                            "_applied_transport_parameters")
PRIVATE_MEMBERS_H3 = ("_stream",)
# What qh3's core lets a peer open at once (bidirectional, unidirectional), whatever the
# settings say; it returns one credit per closed stream.
QH3_PEER_STREAMS = (100, 103)
PRIVATE_MEMBERS_SERVER = ("_protocols", "_retry", "_transport", "_configuration")
MIN_INITIAL_DATAGRAM = 1200  # RFC 9000 14.1


class SizedQuicConnection(QuicConnection):
    """qh3's QuicConnection advertising its own ``max_datagram_size`` as its
    max_udp_payload_size. qh3 writes 1472 for every client (and nothing for a server)
    whatever its configuration: a qh3 server, which obeys the peer's value, then sent a qh3
    client at most 1472-byte datagrams even on loopback."""

    def _create_tls(self, remote_source_cid: bytes | None) -> Any:
        bridge = super()._create_tls(remote_source_cid)
        own, size = bridge.serialize_transport_parameters, self._configuration.max_datagram_size

        def serialize() -> bytes:
            params = pull_quic_transport_parameters(Buffer(data=own()))
            params.max_udp_payload_size = size
            buf = Buffer(capacity=3 * max(size, MIN_INITIAL_DATAGRAM))
            push_quic_transport_parameters(buf, params)
            return bytes(buf.data)

        # read again by the bridge when the version changes; set now for the first flight
        bridge.serialize_transport_parameters = serialize
        bridge.tls.handshake_extensions = [
            (qh3_tls.ExtensionType.QUIC_TRANSPORT_PARAMETERS, serialize())]
        return bridge


class Qh3View:
    """qh3's answers for the endpoint (see :class:`~relay.transport.backend.QuicView`)."""

    __slots__ = ("_conn_high", "_conn_window", "_high", "_q", "_stream_window", "_unread")

    def __init__(self, quic: QuicConnection, settings: QuicSettings) -> None:
        # before the handshake (a server's connection exists before its first datagram is
        # read): by class swap, as qh3's server constructs the connection itself
        quic.__class__ = SizedQuicConnection
        self._q = quic
        self._stream_window = settings.max_stream_data
        self._conn_window = settings.max_data
        self._unread = UnreadBytes()
        self._high = settings.send_buffer_high
        self._conn_high = settings.connection_send_buffer_high

    def unsent(self, stream_id: int) -> int:
        return self._q.get_send_buffer_size(stream_id)

    def unsent_total(self) -> int:
        return self._q.get_send_buffer_size()

    def has_room(self, stream_id: int) -> bool:
        q = self._q
        core = q._core
        # once the core runs and until closed, the core's counts, as get_send_buffer_size
        # would return them, without its wrapper's checks and error translation twice per
        # write (nothing to translate: a query); before, or closed, the wrapper's own
        # answer (its staged writes; 0 once closed)
        counts: Any = q if core is None or q._close_event is not None \
            or not q._pre_handshake_state_replayed else core
        return (counts.get_send_buffer_size(stream_id) < self._high
                and counts.get_send_buffer_size() < self._conn_high)

    def note_queued(self, n: int) -> None:
        pass  # the core counts its own queue

    def note_stream_header(self, stream_id: int) -> None:
        pass

    def forget_unsent(self, stream_id: int, *, reset_by_peer: bool = False) -> None:
        pass  # a reset stream reports zero unsent bytes

    def drained(self) -> bool:
        q = self._q
        core = q._core
        return (q.get_send_buffer_size() == 0
                and (core is None or core.bytes_in_flight == 0))

    def openable(self, stream_id: int) -> int:
        core = self._q._core
        if core is None:
            return 1
        # (bidi, uni) streams the peer allows us, as stream counts
        limit = core.stream_limits[1 if stream_id & 2 else 0]
        return max(0, limit - stream_id // 4)

    def granted_to_peer(self, uni: bool) -> int:
        return QH3_PEER_STREAMS[uni]

    def peer_address(self) -> Any:
        return self._q._remote_addr

    def peer_max_datagram_frame_size(self) -> int | None:
        return self._q._remote_max_datagram_frame_size

    def datagram_size(self) -> int:
        # the core caps its own at the peer's max_udp_payload_size (and never probes above
        # it: probe_datagram_size is off) but does not say so: the same rule, read here
        q = self._q
        own = q._configuration.max_datagram_size
        peer = q._applied_transport_parameters
        limit = peer.max_udp_payload_size if peer is not None else None
        return own if limit is None else min(own, max(limit, MIN_INITIAL_DATAGRAM))

    def peer_close(self) -> Any:
        return self._q._close_event

    def stream_arrived(self, uni: bool) -> None:
        pass

    def stream_accepted(self, uni: bool) -> None:
        pass

    def buffered(self, stream_id: int, n: int) -> bool:
        left = self._unread.add(stream_id, n)
        return left > self._stream_window or self._unread.total > self._conn_window

    def consumed(self, stream_id: int, n: int) -> bool:
        self._unread.take(stream_id, n)
        return False

    def relieved(self) -> bool:
        u = self._unread
        return (u.total <= self._conn_window // 2
                and max(u.per_stream.values(), default=0) <= self._stream_window // 2)

    @property
    def unread_total(self) -> int:
        return self._unread.total


def _poll_datagrams(quic: QuicConnection, now: float
                    ) -> tuple[list[tuple[bytes, Any]], Exception | None]:
    """qh3's ``datagrams_to_send`` (the core's ``poll_transmit`` until it has nothing left),
    except that a failure returns what was built before it instead of losing it (see the
    module doc). Leaves out that method's qlog calls: our configurations set no
    ``quic_logger``."""
    core = quic._core
    built: list[tuple[bytes, Any]] = []
    if core is None:
        return built, None
    while True:
        try:
            transmit = core.poll_transmit(now)
        except (RuntimeError, ValueError) as e:
            # RuntimeError: what datagrams_to_send turns into QuicConnectionError (a failed
            # build); ValueError: a core bug it lets through ("reserved stream is missing").
            return built, e
        if transmit is None:
            return built, None
        built.append((transmit[0], transmit[1]))


def _core_error(exc: RuntimeError) -> QuicConnectionError:
    """A core call's error as the wrapper translates it (its ``_call_core``), for the calls
    below that go to the core straight."""
    return QuicConnectionError(QuicErrorCode.INTERNAL_ERROR, None, str(exc))


def _send_stream(quic: QuicConnection, stream_id: int, data: Any, fin: bool) -> None:
    """qh3's ``send_stream_data`` once the handshake is done, straight to the core: its
    wrapper records a new local stream (ours are recorded when opened, endpoint.py),
    stages writes made before the handshake, and makes a byte-shaped view of any buffer
    (the core reads a contiguous one's bytes as they are: a cached payload is often a
    memoryview of the chunk it arrived in); the rest is left to it. A core error is
    translated as it does."""
    core = quic._core
    if core is None or not quic._handshake_complete or not (
            type(data) is bytes or (type(data) is memoryview and data.c_contiguous)):
        quic.send_stream_data(stream_id, data, fin)
        return
    try:
        core.send_stream(stream_id, data, fin)
    except RuntimeError as exc:
        raise _core_error(exc) from exc


def _receive_many(quic: QuicConnection, datagrams: list[bytes], addr: Any, now: float
                  ) -> None:
    """qh3's ``receive_many_datagrams`` once the handshake is done, without its qlog call
    per datagram (a Python call each; our configurations set no ``quic_logger``), its
    check of an address the kernel gave, and its drain of the events (``_take_events``,
    once per burst)."""
    core = quic._core
    if core is None or not quic._handshake_complete or quic._quic_logger is not None:
        quic.receive_many_datagrams(datagrams, addr, now=now)
        return
    try:
        core.receive_many_datagrams(datagrams, addr, now)
    except RuntimeError as exc:
        raise _core_error(exc) from exc


def _receive_gro(quic: QuicConnection, buffer: bytes, segment: int, addr: Any, now: float
                 ) -> None:
    """One GRO read, cut by qh3's core (``receive_gro_buffer``) instead of into a bytes
    object per datagram in Python; its Python wrapper also slices out every datagram for a
    qlog call, so it is bypassed like ``_receive_many``'s."""
    core = quic._core
    if core is None or not quic._handshake_complete or quic._quic_logger is not None:
        quic.receive_many_datagrams([buffer[i:i + segment]
                                     for i in range(0, len(buffer), segment)], addr, now=now)
        return
    try:
        core.receive_gro_buffer(buffer, segment, addr, now)
    except RuntimeError as exc:
        raise _core_error(exc) from exc


def _take_events(quic: QuicConnection) -> None:
    """What the core received, as the wrapper's events (its ``_drain_core``): once per
    burst, after every read of it went in (``_receive_many`` and ``_receive_gro`` leave
    them in the core; the wrapper drained after every single read)."""
    if quic._core is not None:
        quic._drain_core()


class _Qh3Server(QuicServer):
    """qh3's server, sending a Retry to a new client whose first Initial packet is shorter
    than the smallest Initial datagram (padded after the packet): the core would count only
    the packet toward the anti-amplification limit (module doc). Every other datagram goes
    through qh3's own handling, without Retry."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._tokens: QuicRetryTokenHandler | None = None  # its RSA key made on first use

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        assert isinstance(data, bytes)
        header = _new_initial(self, data)
        if header is None:
            super().datagram_received(data, addr)
            return
        _version, _t, _l, dcid, scid, token, *_rest, end = header
        tokens = self._tokens
        if token and tokens is not None:
            try:
                tokens.validate_token(addr, token)
            except ValueError:
                pass  # not our Retry's (a NEW_TOKEN, another server's): ignored, as qh3 does
            else:
                # qh3 takes it from here: it validates the token again and creates the
                # connection with the Retry's connection IDs, its path validated
                self._retry = tokens
                try:
                    super().datagram_received(data, addr)
                finally:
                    self._retry = None
                return
        if end >= MIN_INITIAL_DATAGRAM:
            super().datagram_received(data, addr)
            return
        if tokens is None:
            tokens = self._tokens = QuicRetryTokenHandler()
        retry_cid = os.urandom(self._configuration.connection_id_length)
        self._transport.sendto(encode_quic_retry(
            version=header[0], source_cid=retry_cid, destination_cid=scid,
            original_destination_cid=dcid,
            retry_token=tokens.create_token(addr, dcid, retry_cid)), addr)


def _new_initial(server: QuicServer, data: bytes) -> tuple[Any, ...] | None:
    """The header fields of ``data`` if it is an Initial that would open a connection at
    ``server`` (qh3's own conditions), else None."""
    config = server._configuration
    if len(data) < MIN_INITIAL_DATAGRAM or not data[0] & 0x80:
        return None
    try:
        header = pull_quic_header(data, 0, config.connection_id_length)
    except ValueError:
        return None
    if (header[1] != QuicPacketType.INITIAL or header[3] in server._protocols
            or header[0] not in config.supported_versions):
        return None
    return tuple(header)


def _trust(config: QuicConfiguration, ca_file: str) -> None:
    """qh3 takes only CA certificates as trust anchors, so a CA file holding one
    self-signed server certificate (what ``kvcs relay`` makes by default) is pinned by its
    SHA-256 instead: the server must present exactly that certificate. (aioquic accepts
    such a file as an anchor and also checks host name and validity; a pin is an exact
    match, so neither adds anything.)"""
    pinned = pinned_self_signed(ca_file)
    if pinned is None:
        config.load_verify_locations(cafile=ca_file)
    else:
        config.verify_mode = ssl.CERT_NONE
        config.assert_fingerprint = pinned


BACKEND = aioquic_shaped(
    "qh3", configuration_class=QuicConfiguration, connection_class=QuicConnection,
    server_class=_Qh3Server, h3_class=H3Connection, events=events, h3_events=h3_events,
    view=Qh3View,
    send_stream=_send_stream, receive_many=_receive_many, receive_gro=_receive_gro,
    take_events=_take_events,
    poll_datagrams=_poll_datagrams, closed_error=QuicConnectionError, trust=_trust,
    credit_on_read=False,
    auto_datagram_limit=UDP_PAYLOAD_MAX,
    # qh3's client probes the path upwards to at most 1472 bytes (1280, 1350, 1452, 1472):
    # off, so a connection sends what the setting (or the route, for auto) and the peer
    # allow and no more; docs/transport.md, "Datagram size"
    configuration_extra=lambda s: {"probe_datagram_size": False},
)
