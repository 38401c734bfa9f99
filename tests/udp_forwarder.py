"""A UDP forwarder on 127.0.0.1 between one QUIC client and its server, for tests that look
at (or drop) what crosses the wire: subclasses see every datagram in ``from_client`` /
``from_server`` before it is passed on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

F = TypeVar("F", bound="UdpForwarder")


class UdpForwarder(asyncio.DatagramProtocol):
    """Forwards one client's datagrams to ``server`` and the answers back, after dropping
    the client's first ``drop`` datagrams."""

    def __init__(self, server: tuple[str, int], drop: int = 0) -> None:
        self.server = server
        self.drop = drop
        self.dropped = 0
        self.client: Any = None
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def from_client(self, data: bytes) -> None:
        """A client datagram, before it is forwarded (or dropped)."""

    def from_server(self, data: bytes) -> None:
        """A server datagram, before it is forwarded."""

    def datagram_received(self, data: bytes, addr: Any) -> None:
        assert self.transport is not None
        if addr == self.server:
            self.from_server(data)
            if self.client is not None:
                self.transport.sendto(data, self.client)
            return
        self.client = addr
        if self.dropped < self.drop:
            self.dropped += 1
            return
        self.from_client(data)
        self.transport.sendto(data, self.server)


@asynccontextmanager
async def forwarding(make: Callable[[tuple[str, int]], F], server_port: int
                     ) -> AsyncIterator[tuple[F, int]]:
    """A forwarder ``make((127.0.0.1, server_port))`` on a port of its own: (it, its port)."""
    loop = asyncio.get_running_loop()
    transport, fwd = await loop.create_datagram_endpoint(
        lambda: make(("127.0.0.1", server_port)), local_addr=("127.0.0.1", 0))
    try:
        yield fwd, transport.get_extra_info("sockname")[1]
    finally:
        transport.close()


def packet_types(datagram: bytes) -> list[int]:
    """The long-header packet types coalesced in ``datagram`` (0 Initial, 2 Handshake,
    3 Retry), up to its first short-header packet (RFC 9000 17.2)."""
    types, i = [], 0
    while i < len(datagram) and datagram[i] & 0x80:
        kind = (datagram[i] >> 4) & 0x3
        types.append(kind)
        if kind == 3:  # Retry: no Length, the rest of the datagram is the packet
            break
        i += 5  # first byte, version
        i += 1 + datagram[i]  # Destination Connection ID
        i += 1 + datagram[i]  # Source Connection ID
        if kind == 0:  # Initial: Token
            n, i = _varint(datagram, i)
            i += n
        n, i = _varint(datagram, i)  # Length: packet number and payload
        i += n
    return types


def _varint(b: bytes, i: int) -> tuple[int, int]:
    size = 1 << (b[i] >> 6)
    return int.from_bytes(bytes([b[i] & 0x3F]) + b[i + 1:i + size], "big"), i + size


class ServerInitials(UdpForwarder):
    """Forwards everything; keeps the size of every server datagram that starts with an
    Initial packet, in order, and whether the server sent a Retry."""

    def __init__(self, server: tuple[str, int]) -> None:
        super().__init__(server)
        self.initial_sizes: list[int] = []
        self.retried = False

    def from_server(self, data: bytes) -> None:
        first = packet_types(data)[:1]
        if first == [0]:
            self.initial_sizes.append(len(data))
        self.retried |= first == [3]
