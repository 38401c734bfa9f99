"""UDP batching under QUIC: GSO runs out (gso.py) and GRO reads cut apart (burst.py) deliver
every datagram, in order, byte for byte."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from conftest import w

from relay.transport.burst import install, make_socket
from relay.transport.gso import DatagramSender, gso_supported


class _Collect(asyncio.DatagramProtocol):
    def __init__(self, expect: int) -> None:
        self.got: list[bytes] = []
        self.expect = expect
        self.done = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.got.append(bytes(data))
        if len(self.got) == self.expect and not self.done.done():
            self.done.set_result(None)


async def test_gso_runs_and_gro_reads_deliver_every_datagram_in_order() -> None:
    loop = asyncio.get_running_loop()
    rsock = make_socket("127.0.0.1", 0)
    # runs of equal sizes, a shorter last one, a larger one breaking a run, one alone
    sizes = [1200] * 40 + [700] + [1200] * 70 + [1400] * 3 + [90]
    datagrams = [os.urandom(n) for n in sizes]
    rtransport, collect = await loop.create_datagram_endpoint(
        lambda: _Collect(len(datagrams)), sock=rsock)
    install(loop, rsock, collect)
    ssock = make_socket("127.0.0.1", 0)
    stransport, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, sock=ssock)
    try:
        assert gso_supported(ssock)  # Linux loopback: the batched path is the one tested
        sender = DatagramSender(ssock, stransport, gso=True)  # type: ignore[arg-type]
        addr = rsock.getsockname()
        sender.send([(d, addr) for d in datagrams])
        assert sender._gso  # no fallback happened
        await w(collect.done)
        assert collect.got == datagrams
    finally:
        stransport.close()
        rtransport.close()
