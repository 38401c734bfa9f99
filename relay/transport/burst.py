"""Reading the UDP socket in bursts.

asyncio's datagram transport reads one datagram per event-loop turn, and aioquic's protocol
then processes events and builds packets (ACKs, flow-control updates) after every single
datagram. At loopback rates that per-datagram overhead is a large part of a connection's CPU.
Here the socket is drained of up to ``MAX_BURST`` datagrams per readiness event; each one is
fed to its QUIC connection at once, and events and transmissions run once per connection
after the burst. Sending still goes through the asyncio transport.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Protocol

MAX_BURST = 64
_MAX_DATAGRAM = 65536


class BurstReceiver(Protocol):
    def burst_flush(self) -> None: ...


class _Burst:
    """Set while a burst is being read: endpoints defer their processing to its end."""

    def __init__(self) -> None:
        self.active = False
        self.dirty: list[BurstReceiver] = []


BURST = _Burst()


def make_socket(host: str, port: int) -> socket.socket:
    """A non-blocking UDP socket bound to ``host:port`` (IPv4 or IPv6 by the address)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(addr)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def install(loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: Any) -> None:
    """Replace the transport's one-datagram reader for ``sock`` with a burst reader.

    The public add_reader/remove_reader refuse a socket owned by a transport, so this uses
    the selector loop's own ``_add_reader``/``_remove_reader`` (what its transports call);
    on a loop without them the transport keeps its own reader.
    """
    add = getattr(loop, "_add_reader", None)
    remove = getattr(loop, "_remove_reader", None)
    if add is None or remove is None:
        return
    fd = sock.fileno()
    remove(fd)

    def read_burst() -> None:
        BURST.active = True
        try:
            for _ in range(MAX_BURST):
                try:
                    data, addr = sock.recvfrom(_MAX_DATAGRAM)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as e:
                    protocol.error_received(e)
                    break
                protocol.datagram_received(data, addr)
        finally:
            BURST.active = False
            dirty, BURST.dirty = BURST.dirty, []
            for ep in dirty:
                ep.burst_flush()

    add(fd, read_burst)
