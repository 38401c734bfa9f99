"""Reading the UDP socket in bursts, with generic receive offload where the kernel has it.

asyncio's datagram transport reads one datagram per event-loop turn, and the QUIC protocol
then processes events and builds packets (ACKs, flow-control updates) after every single
datagram. At loopback rates that per-datagram overhead is a large part of a connection's CPU.
Here the socket is drained of up to ``MAX_BURST`` reads per readiness event; each datagram is
fed to its QUIC connection at once, and events and transmissions run once per connection
after the burst. With UDP_GRO (Linux) one read returns up to 64 coalesced datagrams of one
peer, cut apart here. Sending: ``gso.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Any, Protocol

from .gso import SOL_UDP  # the UDP layer's socket option level, defined once

MAX_BURST = 64
CID_LENGTH = 8  # our connection IDs (both libraries' default connection_id_length)
_MAX_DATAGRAM = 65536
UDP_GRO = 104  # linux/udp.h; Python 3.11's socket module does not name it
_GRO_CMSG = struct.Struct("@i")
_CMSG_SPACE = socket.CMSG_SPACE(_GRO_CMSG.size) if hasattr(socket, "CMSG_SPACE") else 0
# Socket buffers of every QUIC socket, each direction. The kernel's default (~208 KiB) holds
# about 1.5 ms of a 1 Gbit/s flow: on a long round trip the congestion window is larger than
# that, a burst of it overflows the receive buffer, and the drops read to QUIC as congestion
# (80 ms RTT, no loss, 16 MiB on qh3: 15.6 s -> 1.7 s). Linux doubles the value asked for.
UDP_BUFFER_BYTES = 4 << 20
# SO_RCVBUFFORCE / SO_SNDBUFFORCE (linux/socket.h) go past net.core.[rw]mem_max but need
# CAP_NET_ADMIN; without it the plain options apply, capped at the sysctl.
_FORCE = {socket.SO_RCVBUF: getattr(socket, "SO_RCVBUFFORCE", 33),
          socket.SO_SNDBUF: getattr(socket, "SO_SNDBUFFORCE", 32)}


class BurstReceiver(Protocol):
    def burst_flush(self) -> None: ...


class _Burst:
    """Set while a burst is being read: endpoints defer their processing to its end."""

    def __init__(self) -> None:
        self.active = False
        self.dirty: list[BurstReceiver] = []


BURST = _Burst()


def make_socket(host: str, port: int, *, large_buffers: bool,
                reuse_port: bool = False) -> socket.socket:
    """A non-blocking UDP socket bound to ``host:port`` (IPv4 or IPv6 by the address), with
    UDP_BUFFER_BYTES of buffer each way if ``large_buffers`` (else the kernel's default:
    see ``QuicBackend.credit_on_read`` for which server sockets may not have more);
    ``reuse_port`` shares the port with other sockets that set it (SO_REUSEPORT)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if large_buffers:
            size_buffers(sock)
        sock.bind(addr)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def size_buffers(sock: socket.socket, nbytes: int = UDP_BUFFER_BYTES) -> None:
    """Ask for ``nbytes`` of receive and send buffer on ``sock`` (see UDP_BUFFER_BYTES):
    forced where the process may (root, CAP_NET_ADMIN), else up to the system's maximum."""
    for opt, force in _FORCE.items():
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, nbytes)
        except OSError:  # EPERM without CAP_NET_ADMIN; ENOPROTOOPT off Linux
            # a platform that refuses the size: its default still works
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, opt, nbytes)


class ReaderControl:
    """Stops and restarts reading one socket (a client connection's own): datagrams then
    wait in the kernel's buffer, and beyond it are lost, which QUIC recovers from and its
    congestion control answers by sending slower."""

    def __init__(self, add: Callable[[], None], remove: Callable[[], None]) -> None:
        self._add, self._remove = add, remove
        self.paused = False

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self._remove()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self._add()


def install(loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: Any,
            route: Callable[[bytes], Any] | None = None) -> ReaderControl | None:
    """Replace the transport's one-datagram reader for ``sock`` with a burst reader.

    ``route(dcid)``, for a server socket, finds the connection a short-header packet's
    Destination Connection ID belongs to, so 1-RTT packets (all of a transfer) skip the
    library's per-datagram demultiplexing; anything else goes through ``protocol``.

    The public add_reader/remove_reader refuse a socket owned by a transport, so this uses
    the selector loop's own ``_add_reader``/``_remove_reader`` (what its transports call);
    on a loop without them the transport keeps its own reader.
    """
    add = getattr(loop, "_add_reader", None)
    remove = getattr(loop, "_remove_reader", None)
    if add is None or remove is None:
        return None
    fd = sock.fileno()
    remove(fd)
    # GRO only here, where coalesced reads are cut apart (asyncio's reader would not)
    gro = _CMSG_SPACE > 0
    if gro:
        try:
            sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        except OSError:
            gro = False

    def read_burst() -> None:
        BURST.active = True
        try:
            for _ in range(MAX_BURST):
                try:
                    if gro:
                        data, anc, _, addr = sock.recvmsg(_MAX_DATAGRAM, _CMSG_SPACE)
                    else:
                        data, addr = sock.recvfrom(_MAX_DATAGRAM)
                        anc = None
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as e:
                    protocol.error_received(e)
                    break
                target = protocol
                if route is not None and data and not data[0] & 0x80:  # short header
                    target = route(data[1:1 + CID_LENGTH]) or protocol
                seg = _segment_size(anc) if anc else 0
                if seg and len(data) > seg:
                    if getattr(target, "takes_gro", False):
                        target.gro_received(data, seg, addr)  # cut natively
                        continue
                    view = memoryview(data)
                    for off in range(0, len(data), seg):
                        target.datagram_received(bytes(view[off:off + seg]), addr)
                else:
                    target.datagram_received(data, addr)
        finally:
            BURST.active = False
            dirty, BURST.dirty = BURST.dirty, []
            for ep in dirty:
                ep.burst_flush()

    add(fd, read_burst)
    return ReaderControl(lambda: add(fd, read_burst), lambda: remove(fd))


def _segment_size(ancdata: list[tuple[int, int, bytes]]) -> int:
    for level, kind, value in ancdata:
        if level == SOL_UDP and kind == UDP_GRO and len(value) >= _GRO_CMSG.size:
            return int(_GRO_CMSG.unpack_from(value)[0])
    return 0
