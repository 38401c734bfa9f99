"""One UDP port serving MOQT over raw QUIC (ALPN moqt-22) and over WebTransport (h3)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import logging
import os
import socket
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from .backend import QuicBackend, default_backend, get_backend
from .burst import install, make_socket, size_buffers
from .config import H3_ALPN, Application, QuicSettings, datagram_size_towards
from .connection import Connection
from .endpoint import Endpoint
from .errors import ConnectionClosed
from .gso import DatagramSender, gso_supported
from .pathmtu import AUTO, SAFE_DATAGRAM_SIZE

log = logging.getLogger(__name__)

Handler = Callable[[Connection], Awaitable[None]]

INTERNAL_ERROR = 0x1  # MOQT Session Termination code


class Server:
    """A listening endpoint. Create it with :func:`serve`.

    Each accepted session (raw QUIC connection or WebTransport session) is handed to
    ``handler(conn)`` in its own task. When the handler returns, the session is closed
    with NO_ERROR if still open; if it raises, with INTERNAL_ERROR.
    """

    def __init__(self, handler: Handler, settings: QuicSettings, wt_path: str,
                 backend: QuicBackend) -> None:
        self._handler = handler
        self.backend = backend
        self.settings = settings
        self.wt_path = wt_path
        self._udp: Any = None  # the backend's QuicServer
        self._sock: socket.socket | None = None
        self._sender: DatagramSender | None = None
        self._endpoints: weakref.WeakSet[Endpoint] = weakref.WeakSet()
        self._connections: set[Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        assert self._sock is not None
        sockname = self._sock.getsockname()
        return sockname[0], sockname[1]

    @property
    def port(self) -> int:
        """The bound UDP port (useful when serving on port 0)."""
        return self.address[1]

    @property
    def accepting(self) -> bool:
        """False once :meth:`stop_accepting` or :meth:`close` was called."""
        return not self._closing

    def stop_accepting(self) -> None:
        """Refuse new sessions (closed at once with NO_ERROR); open ones go on."""
        self._closing = True

    def _create_protocol(self, quic: Any, stream_handler: Any = None) -> Endpoint:
        ep = Endpoint(quic, backend=self.backend, settings=self.settings, server=self)
        assert self._sender is not None
        ep.use_socket(self._sender)
        self._endpoints.add(ep)
        return ep

    def spawn_handler(self, conn: Connection) -> None:
        if self._closing:
            conn.close(0, "server shutting down")
            return
        self._connections.add(conn)
        task = asyncio.get_running_loop().create_task(self._run(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, conn: Connection) -> None:
        try:
            await self._handler(conn)
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            conn.close(0, "server shutting down")
            raise
        except Exception:
            log.exception("session handler failed for %r", conn)
            conn.close(INTERNAL_ERROR, "internal error")
        else:
            conn.close(0, "")
        finally:
            self._connections.discard(conn)

    async def close_all(self, code: int = 0, reason: str = "", grace: float = 1.0) -> None:
        """Close every open session with ``code``/``reason``; wait up to ``grace`` s
        for the closes to be delivered (WebTransport needs its capsule acknowledged)."""
        for conn in list(self._connections):
            conn.close(code, reason)
        eps = [ep for ep in self._endpoints if not ep.terminated.is_set()]
        if eps and grace > 0:
            waits = [asyncio.ensure_future(ep.terminated.wait()) for ep in eps]
            _, pending = await asyncio.wait(waits, timeout=grace)
            for w in pending:
                w.cancel()

    async def close(self, code: int = 0, reason: str = "server shutting down",
                    grace: float = 1.0) -> None:
        """Stop accepting, close all sessions, cancel handlers and release the port."""
        self._closing = True
        await self.close_all(code, reason, grace)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace)
        if self._udp is not None:
            self._udp.close()
            self._udp = None

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def serve(host: str, port: int, certfile: str | os.PathLike[str],
                keyfile: str | os.PathLike[str], handler: Handler, *, application: Application,
                settings: QuicSettings | None = None, wt_path: str = "/moq",
                reuse_port: bool = False, sock: socket.socket | None = None) -> Server:
    """Listen on ``host:port`` (UDP) for raw QUIC and WebTransport MOQT sessions.

    Raw QUIC clients negotiate ALPN ``application.alpn``; WebTransport clients negotiate
    ``h3`` and send an extended CONNECT to ``wt_path`` listing ``application.alpn`` in
    ``WT-Available-Protocols``. Other paths get 404. 0-RTT is never accepted (no session
    tickets are issued). ``port=0`` picks a free port; read it from :attr:`Server.port`.
    ``settings.backend`` picks the QUIC library (:mod:`relay.transport.backend`).
    ``reuse_port``: SO_REUSEPORT, so several processes serve one port; the kernel keeps
    each client address on one of them (a client whose address changes may move).
    ``sock``: serve on this already bound UDP socket instead (``host``/``port`` are then
    only its description), e.g. one a supervisor process made and keeps open.
    """
    settings = dataclasses.replace(settings or QuicSettings(), application=application)
    backend = get_backend(settings.backend or default_backend("server"))
    # auto: 1200 until a client's first datagram names its address (_size_per_peer)
    size = SAFE_DATAGRAM_SIZE if settings.max_datagram_size == AUTO \
        else settings.max_datagram_size
    assert isinstance(size, int)
    config = backend.configuration(settings, False, [application.alpn, H3_ALPN], size)
    config.load_cert_chain(os.fspath(certfile), os.fspath(keyfile))
    server = Server(handler, settings, wt_path, backend)
    loop = asyncio.get_running_loop()
    if sock is None:
        sock = make_socket(host, port, reuse_port=reuse_port, large_buffers=False)
    sock.setblocking(False)
    # ours or a worker's (its supervisor's, made with the kernel's default): sized here, for
    # the backend that serves it
    if backend.credit_on_read:
        size_buffers(sock)
    transport, udp = await loop.create_datagram_endpoint(
        lambda: backend.server(config, server._create_protocol), sock=sock)
    if settings.max_datagram_size == AUTO:
        _size_per_peer(udp, config, settings, backend)
    install(loop, sock, udp, route=functools.partial(backend.route, udp))
    server._udp = udp
    server._sock = sock
    server._sender = DatagramSender(sock, transport, gso_supported(sock))
    return server


def _size_per_peer(udp: Any, config: Any, settings: QuicSettings,
                   backend: QuicBackend) -> None:
    """``auto`` on a server: each connection's datagram size follows the route to its
    client. The library's server makes a connection from its configuration when a client's
    first datagram (a long-header Initial) arrives, before it sends anything, so every
    long-header datagram is handed over with the configuration of the route to its sender
    (a copy per size). Short-header datagrams belong to existing connections: untouched."""
    configs: dict[int, Any] = {}
    receive = udp.datagram_received

    def datagram_received(data: bytes, addr: Any) -> None:
        if data and data[0] & 0x80:
            size = datagram_size_towards(settings, addr, backend.auto_datagram_limit)
            sized = configs.get(size)
            if sized is None:
                sized = configs[size] = copy.copy(config)
                sized.max_datagram_size = size
            backend.use_configuration(udp, sized)
        receive(data, addr)

    udp.datagram_received = datagram_received
