"""The project's only seam onto QUIC: MOQT byte streams over raw QUIC and WebTransport, on
aioquic (default) or qh3 (``QuicSettings(backend="qh3")``; docs/transport.md).

Public API::

    server = await serve(host, port, certfile, keyfile, handler, settings=QuicSettings())
    conn = await connect("moqt://127.0.0.1:4433/path", ca_file=...)   # or https://…/moq
    send = await conn.open_uni();  send, recv = await conn.open_bi()
    incoming = await conn.accept()          # IncomingStream(recv, send|None)
    await send.write(data); await send.finish(); send.reset(code)
    data = await recv.read()                # one chunk as received; b"" == FIN;
                                            # raises StreamReset(code)
    chunks = await recv.read_chunks()       # every chunk queued, none joined; [] == FIN
    conn.close(code, reason); code, reason = await conn.wait_closed()

Who owns what (each module's docstring says more)::

    client.py, server.py   dial / listen: sockets, TLS configuration, one Endpoint per
                           QUIC connection; the server hands each session to its handler
    endpoint.py            Endpoint: one QUIC connection; routes the library's events to
                           the owning session and stream, ALPN, handshake, keepalive, close
    driver.py              its I/O half, QuicDriver: drives the library's sans-IO
                           QuicConnection (datagrams in, events, datagrams out, one timer,
                           transmit retries)
    webtransport.py        WebTransport: extended CONNECT, session close and linger,
                           datagram framing (ALPN h3)
    h3wire.py              its wire formats, pure: the WT error-code range, varints, the
                           close capsule, the WT-Protocol headers' structured fields
    connection.py          Connection (the application's session) over its StreamTable
                           (the session's streams, incoming queue, datagrams)
    streams.py             SendStream / RecvStream: backpressure, reads, resets
    port.py                the seams: EndpointPort (session -> endpoint) and StreamPort
                           (stream -> session), as the calls that cross them
    backend.py, _aioquic.py, _qh3.py
                           the QUIC library behind a QuicView; only _aioquic.py and _qh3.py
                           import one (docs/transport.md lists the private members used)
    burst.py, gso.py       receiving in bursts, sending in GSO batches
    congestion.py          the bbr controller registered with aioquic
    config.py, tls.py, errors.py
                           settings, certificates, the errors callers catch

Calls cross the seams downward only through port.py's protocols (a stream cannot reach the
QUIC connection, a session cannot reach the endpoint's internals); events go upward as the
StreamTable's ``on_*`` calls, from the endpoint and from WebTransport (which reaches the
endpoint through ``WebTransportHost``).

Operational behaviour (details in the module docstrings):

* Memory is bounded both ways. Sending: ``write`` waits while a stream has more than
  ``send_buffer_high`` unsent bytes or the connection more than
  ``connection_send_buffer_high``. Receiving: flow-control credit is returned only as
  the application reads (aioquic, ``_aioquic.py``), so an unread stream buffers at most
  ``max_stream_data`` and all unread streams together at most ``max_data``; stream
  credit (MAX_STREAMS) is held for streams not yet ``accept()``-ed. On qh3 the same bound
  holds by stopping an over-full stream instead (``_qh3.py``).
* ``max_datagram_size`` is capped at 16384: aioquic encodes frame lengths in 2 bytes.
  ``auto`` goes up to 65507 on qh3, whose frames have no such limit (loopback).
* Raw QUIC and WebTransport share one UDP port (ALPN ``moqt-22`` vs ``h3``); 0-RTT is
  never accepted. Keepalive PINGs keep idle sessions open (aioquic sends none).
* Never run this under uvloop (its 1 ms timer granularity stalls aioquic's timers).
"""

from .client import connect
from .config import H3_ALPN, Application, QuicSettings
from .connection import Connection, RequestStreams
from .errors import (
    ConnectionClosed,
    ConnectTimeout,
    ProtocolNegotiationError,
    StreamReset,
    StreamStopped,
    TransportError,
)
from .h3wire import app_to_wt_error, wt_to_app_error
from .server import Server, serve
from .streams import IncomingStream, RecvStream, SendStream
from .tls import CertificatePaths, ensure_self_signed, fingerprint

__all__ = [
    "H3_ALPN",
    "Application",
    "CertificatePaths",
    "ConnectTimeout",
    "Connection",
    "ConnectionClosed",
    "IncomingStream",
    "ProtocolNegotiationError",
    "QuicSettings",
    "RecvStream",
    "RequestStreams",
    "SendStream",
    "Server",
    "StreamReset",
    "StreamStopped",
    "TransportError",
    "app_to_wt_error",
    "connect",
    "ensure_self_signed",
    "fingerprint",
    "serve",
    "wt_to_app_error",
]
