"""Sending QUIC packets with UDP generic segmentation offload (GSO, Linux).

A QUIC connection sending at full rate hands us runs of equal-size datagrams for one peer.
One ``sendmsg`` with a ``UDP_SEGMENT`` control message sends up to 64 of them: the kernel
cuts the buffer into datagrams, so the per-datagram system call (a quarter of a busy relay
process's CPU at 1200-byte datagrams) is paid once per run. Where GSO is unavailable, or
the asyncio transport still holds queued datagrams (ordering), datagrams go one by one
through the transport as before.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

SOL_UDP = getattr(socket, "SOL_UDP", 17)  # IPPROTO_UDP; burst.py sets UDP_GRO at it too
UDP_SEGMENT = 103  # linux/udp.h; Python 3.11's socket module does not name it
MAX_SEGMENTS = 64  # the kernel's UDP_MAX_SEGMENTS
MAX_PAYLOAD = 65000  # one UDP datagram's worth, below 65507


def gso_supported(sock: socket.socket) -> bool:
    """True if the kernel accepts UDP_SEGMENT on ``sock`` (Linux 4.18+)."""
    try:
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)  # 0: no default segmentation
    except (OSError, AttributeError):
        return False
    return True


class DatagramSender:
    """Sends a connection's datagrams, in order, batching runs with GSO where it can."""

    __slots__ = ("_gso", "_sock", "_transport")

    def __init__(self, sock: socket.socket, transport: asyncio.DatagramTransport,
                 gso: bool) -> None:
        self._sock = sock
        self._transport = transport
        self._gso = gso

    def send(self, datagrams: Sequence[tuple[bytes, Any]]) -> None:
        transport = self._transport
        n = len(datagrams)
        if not self._gso or n < 2 or transport.get_write_buffer_size():
            for data, addr in datagrams:
                transport.sendto(data, addr)
            return
        i = 0
        while i < n:
            data, addr = datagrams[i]
            size = len(data)
            j = i + 1
            limit = min(n, i + MAX_SEGMENTS, i + MAX_PAYLOAD // size)
            # a run: same peer, same size; the last one may be shorter
            while j < limit and datagrams[j][1] == addr:
                k = len(datagrams[j][0])
                if k > size:
                    break
                j += 1
                if k < size:
                    break
            if j - i == 1:
                transport.sendto(data, addr)
            elif not self._sendmsg(datagrams[i:j], size, addr):
                for d, a in datagrams[i:]:
                    transport.sendto(d, a)
                return
            i = j

    def _sendmsg(self, run: Sequence[tuple[bytes, Any]], size: int, addr: Any) -> bool:
        try:
            # the datagrams as the buffers of one message: the kernel gathers them (no join)
            self._sock.sendmsg([d for d, _ in run],
                               [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", size))], 0, addr)
        except (BlockingIOError, InterruptedError):
            return False  # the socket is full: the transport queues the rest, in order
        except OSError as e:
            # e.g. EIO from a device without segmentation offload: stop trying
            log.debug("GSO send failed (%s); sending datagrams one by one", e)
            self._gso = False
            return False
        return True
