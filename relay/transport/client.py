"""Dial a MOQT server: ``moqt://`` (raw QUIC) or ``https://`` (WebTransport)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import ssl
from urllib.parse import urlsplit

from .backend import default_backend, get_backend
from .burst import install, make_socket
from .config import H3_ALPN, Application, QuicSettings, datagram_size_towards
from .connection import Connection
from .endpoint import Endpoint
from .errors import ConnectTimeout
from .gso import DatagramSender, gso_supported

log = logging.getLogger(__name__)


async def connect(url: str, *, application: Application,
                  settings: QuicSettings | None = None,
                  ca_file: str | os.PathLike[str] | None = None, insecure: bool = False,
                  server_name: str | None = None) -> Connection:
    """Open a MOQT session to ``url`` and return its :class:`Connection`.

    ``moqt://host[:port]/path?query`` uses raw QUIC with ALPN ``application.alpn``;
    ``https://host[:port]/path`` uses WebTransport (HTTP/3 extended CONNECT offering
    ``application.alpn`` in ``WT-Available-Protocols``). The port defaults to 443.

    The server certificate is verified against ``ca_file`` (or the system/certifi
    store) for ``server_name`` (default: the URL's host). ``insecure=True`` disables
    verification entirely; use it only for loopback development.

    Raises :class:`ConnectTimeout` after ``settings.connect_timeout`` seconds,
    :class:`ProtocolNegotiationError` if the server does not speak ``application``,
    :class:`ConnectionClosed` if the handshake fails otherwise (e.g. bad certificate),
    :class:`TransportError` if a WebTransport CONNECT is refused (e.g. 404),
    :class:`~relay.transport.backend.BackendUnavailable` if ``settings.backend`` is not
    installed.
    """
    settings = dataclasses.replace(settings or QuicSettings(), application=application)
    backend = get_backend(settings.backend or default_backend("client"))
    u = urlsplit(url)
    if u.scheme == "moqt":
        alpn = application.alpn
    elif u.scheme == "https":
        alpn = H3_ALPN
    else:
        raise ValueError(f"unsupported URL scheme {u.scheme!r} (use moqt:// or https://)")
    if not u.hostname:
        raise ValueError(f"no host in {url!r}")
    host, port = u.hostname, u.port or 443
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    authority = u.netloc.rsplit("@", 1)[-1]

    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    family, addr = infos[0][0], infos[0][4]
    # auto: what the route to the server allows, known before the first packet
    config = backend.configuration(settings, True, [alpn], datagram_size_towards(
        settings, addr, backend.auto_datagram_limit))
    config.server_name = server_name or host
    if insecure:
        log.warning("!!! TLS certificate verification DISABLED for %s — loopback "
                    "development only, never in production !!!", url)
        config.verify_mode = ssl.CERT_NONE
    elif ca_file is not None:
        backend.trust(config, os.fspath(ca_file))

    quic = backend.connection(config)
    # a client's own socket: it pauses reading when its application falls behind (qh3),
    # so a large buffer only absorbs a long round trip's bursts
    sock = make_socket("::" if family == socket.AF_INET6 else "0.0.0.0", 0, large_buffers=True)
    _, ep = await loop.create_datagram_endpoint(
        lambda: Endpoint(quic, backend=backend, settings=settings, path=path,
                         authority=authority), sock=sock)
    transport = ep.transport
    assert transport is not None
    ep.use_socket(DatagramSender(sock, transport, gso_supported(sock)),
                  install(loop, sock, ep))
    ep.connect(addr)
    try:
        return await asyncio.wait_for(ep.ready(), settings.connect_timeout)
    except TimeoutError:
        ep.abort()
        raise ConnectTimeout(f"no MOQT session with {url} within "
                             f"{settings.connect_timeout:g} s") from None
    except BaseException:
        ep.abort()
        raise
