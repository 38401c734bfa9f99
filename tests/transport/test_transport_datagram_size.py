"""``max_datagram_size = "auto"`` on loopback, and QUIC's max_udp_payload_size obeyed.

A UDP forwarder on 127.0.0.1 stands between client and server and records the size of every
datagram each way: what went on the wire, not what a library says it would send. Every test
here runs on every backend pair (tests/conftest.py), so both libraries interoperate with
large datagrams and each obeys the other's advertised limit.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import Harness, exchange, w
from udp_forwarder import UdpForwarder, forwarding

from relay.session.wire import MOQT
from relay.transport import QuicSettings, connect
from relay.transport.backend import default_backend, get_backend
from relay.transport.config import MAX_DATAGRAM_SIZE_LIMIT, UDP_PAYLOAD_MAX

PAYLOAD = os.urandom(1024 * 1024)  # a few dozen full-size datagrams each way
AUTO = QuicSettings(connect_timeout=5.0)  # the default: auto
SMALL = 1300  # what a peer advertises (between 1200 and a 1500-byte link's 1472)
SLACK = 64  # a full-size datagram, as qh3 packs one, is within this of the limit


def auto_limit(role: str) -> int:
    """What ``auto`` allows the library of ``role`` (server or client) on loopback."""
    return get_backend(default_backend(role)).auto_datagram_limit


class SizeRecorder(UdpForwarder):
    """Forwards one client's datagrams to the server and the answers back; the sizes seen
    each way."""

    def __init__(self, server: tuple[str, int]) -> None:
        super().__init__(server)
        self.up: list[int] = []
        self.down: list[int] = []
        self.handshake = (0, 0)  # how many each way before the session was up

    def from_client(self, data: bytes) -> None:
        self.up.append(len(data))

    def from_server(self, data: bytes) -> None:
        self.down.append(len(data))


async def _through_recorder(make_harness: Any, server_settings: QuicSettings,
                            client_settings: QuicSettings) -> SizeRecorder:
    h: Harness = await make_harness(server_settings)
    async with forwarding(SizeRecorder, h.server.port) as (rec, port):
        client = await w(connect(f"moqt://127.0.0.1:{port}/", settings=client_settings,
                                 ca_file=h.certs.certfile, application=MOQT))
        try:
            server = await w(h.sessions.get())
            rec.handshake = (len(rec.up), len(rec.down))
            await exchange(client, server, PAYLOAD, PAYLOAD)
        finally:
            await w(client.aclose())
    return rec


async def test_auto_on_loopback_sends_the_largest_datagrams_both_ways(
        make_harness: Any) -> None:
    """Loopback's MTU (65536) allows more than aioquic's frames can carry: with ``auto`` on
    both ends, the client (from its route to the server) and the server (per connection,
    from its route to the client, known at the client's first datagram) both send
    datagrams as large as both libraries allow (aioquic 16384, qh3 65507, the largest UDP
    payload): each end advertises its own as its max_udp_payload_size and sends no more
    than the other's (aioquic fills them to the byte, qh3 to within a few dozen). Only a
    client's first Initials, padded to its own size, come before the server has said
    anything."""
    assert {auto_limit("server"), auto_limit("client")} <= {MAX_DATAGRAM_SIZE_LIMIT,
                                                            UDP_PAYLOAD_MAX}
    both = min(auto_limit("server"), auto_limit("client"))
    rec = await _through_recorder(make_harness, AUTO, AUTO)
    for sizes in (rec.up[rec.handshake[0]:], rec.down[rec.handshake[1]:]):
        assert both - SLACK <= max(sizes) <= both, sorted(set(sizes))[-5:]
    assert max(rec.up) <= auto_limit("client") and max(rec.down) <= auto_limit("server")


@pytest.mark.parametrize("small_end", ["client", "server"])
async def test_a_peer_advertising_a_smaller_max_udp_payload_size_is_never_sent_more(
        make_harness: Any, small_end: str) -> None:
    """One end set to 1300 bytes advertises it as its max_udp_payload_size; the other, on
    ``auto`` (16384 here), sends it nothing larger once it has the peer's transport
    parameters (a client's first Initials come before the server has said anything, and
    qh3's core applies them only when the handshake completes: docs/transport.md,
    "Datagram size"). aioquic ignores the peer's value by itself; qh3 obeys it but
    advertised 1472 for every client whatever its setting. (qh3 configured to 1300 sends
    at most 1280.)"""
    small = QuicSettings(max_datagram_size=SMALL, connect_timeout=5.0)
    rec = await _through_recorder(make_harness, *((AUTO, small) if small_end == "client"
                                                  else (small, AUTO)))
    up, down = rec.up[rec.handshake[0]:], rec.down[rec.handshake[1]:]
    towards_small, from_small = (down, up) if small_end == "client" else (up, down)
    assert 1200 < max(towards_small) <= SMALL, sorted(set(towards_small))[-5:]
    assert 1200 < max(from_small) <= SMALL, sorted(set(from_small))[-5:]
