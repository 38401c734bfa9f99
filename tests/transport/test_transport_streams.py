"""Streams over real QUIC on 127.0.0.1, raw QUIC and WebTransport on the same server port."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest
from conftest import SETTINGS, Harness, w
from stream_helpers import read_all

from relay.transport import (
    Connection,
    QuicSettings,
    StreamReset,
    StreamStopped,
    app_to_wt_error,
)
from relay.transport.backend import default_backend

Pair = tuple[Connection, Connection]


async def _echo_bidi(opener: Connection, acceptor: Connection, payload: bytes) -> None:
    send, recv = await w(opener.open_bi())
    await w(send.write(payload, end_stream=True))
    inc = await w(acceptor.accept())
    assert inc.is_bidirectional and inc.send is not None
    assert inc.stream_id == send.stream_id
    got = await w(read_all(inc.recv))
    assert got == payload
    await w(inc.send.write(got[::-1], end_stream=True))
    assert await w(read_all(recv)) == payload[::-1]
    assert await w(recv.read()) == b""  # and the FIN stays read


async def test_bidi_echo_both_directions(pair: Pair) -> None:
    client, server = pair
    await _echo_bidi(client, server, b"from the client")
    await _echo_bidi(server, client, b"from the server")


async def test_uni_both_directions_and_fin(pair: Pair) -> None:
    client, server = pair
    for src, dst in ((client, server), (server, client)):
        s = await w(src.open_uni())
        await w(s.write(b"hello "))
        await w(s.write(memoryview(b"world")))
        await w(s.finish())
        inc = await w(dst.accept())
        assert not inc.is_bidirectional
        assert await w(read_all(inc.recv)) == b"hello world"
        assert await w(inc.recv.read()) == b""  # FIN stays sticky


async def test_session_attributes(pair: Pair, transport: str) -> None:
    client, server = pair
    assert client.transport == server.transport == transport
    assert client.is_client and not server.is_client
    assert client.remote_address is not None and server.remote_address is not None
    assert client.path == "/moq"
    if transport == "webtransport":
        assert server.path == "/moq"
        assert server.authority.startswith("127.0.0.1:")


async def test_accept_is_lossless_and_ordered(pair: Pair) -> None:
    client, server = pair
    for i in range(5):  # all opened and finished before the server accepts anything
        s = await w(client.open_uni())
        await w(s.write(bytes([i]) * (i + 1), end_stream=True))
    unis = [await w(server.accept()) for _ in range(5)]
    assert [u.stream_id for u in unis] == sorted(u.stream_id for u in unis)
    assert [await w(read_all(u.recv)) for u in unis] == [bytes([i]) * (i + 1) for i in range(5)]


@pytest.mark.parametrize("code", [0x0, 0x1, 0x5, 0x12, 0x1E, 0xFFFFFFFF])
async def test_reset_code_arrives(pair: Pair, code: int) -> None:
    client, server = pair
    s = await w(client.open_uni())
    await w(s.write(b"partial"))
    inc = await w(server.accept())
    assert await w(inc.recv.read()) == b"partial"
    s.reset(code)
    with pytest.raises(StreamReset) as e:
        await w(inc.recv.read())
    assert e.value.code == code
    # and server -> client on a bidi stream's server half
    send, _recv = await w(server.open_bi())
    await w(send.write(b"x"))
    inc2 = await w(client.accept())
    assert await w(inc2.recv.read()) == b"x"
    send.reset(code)
    with pytest.raises(StreamReset) as e2:
        await w(inc2.recv.read())
    assert e2.value.code == code


async def test_webtransport_reset_uses_mapped_code_on_the_wire(harness: Harness) -> None:
    client, server = await harness.pair("webtransport")
    seen: list[int] = []
    original = server.streams.on_stream_reset

    def spy(sid: int, wire_code: int) -> None:
        seen.append(wire_code)
        original(sid, wire_code)

    server.streams.on_stream_reset = spy  # type: ignore[method-assign]
    s = await w(client.open_uni())
    await w(s.write(b"a"))
    inc = await w(server.accept())
    await w(inc.recv.read())
    s.reset(0x2)
    with pytest.raises(StreamReset) as e:
        await w(inc.recv.read())
    assert e.value.code == 0x2
    assert seen == [app_to_wt_error(0x2)]
    await w(client.aclose())


@pytest.mark.parametrize("bidi", [False, True])
async def test_stop_sending_reaches_the_sender(pair: Pair, bidi: bool) -> None:
    client, server = pair
    if bidi:
        send, _ = await w(client.open_bi())
    else:
        send = await w(client.open_uni())
    await w(send.write(b"first"))
    inc = await w(server.accept())
    assert await w(inc.recv.read()) == b"first"
    inc.recv.stop_sending(0x9)
    assert await w(send.wait_stopped()) == 0x9
    assert send.stop_code == 0x9
    with pytest.raises(StreamStopped) as e:
        await w(send.write(b"more"))
    assert e.value.code == 0x9
    with pytest.raises(StreamReset):
        await w(inc.recv.read())


async def test_many_concurrent_streams(pair: Pair) -> None:
    """300 uni streams and 300 bidi streams at once (above the 256 bidi limit: opens
    must wait for MAX_STREAMS instead of failing)."""
    client, server = pair
    n = n_bidi = 300
    if default_backend("client") == "qh3":
        # Known, not fixed (docs/transport.md, "Known issues"): a qh3 client opening bidi
        # streams across the server's first MAX_STREAMS limit sometimes loses a few just
        # below it, about one run in ten under load: never always, so no xfail of it can be
        # strict. Its bidi streams stay below that limit here (a qh3 client waiting for
        # MAX_STREAMS: test_transport_limits.py::test_bidi_limit_waits_and_recovers).
        n_bidi = SETTINGS.max_streams_bidi - 8  # WebTransport's CONNECT takes one too

    async def serve_all() -> None:
        async def one() -> None:
            inc = await server.accept()
            data = await read_all(inc.recv)
            if inc.send is not None:
                await inc.send.write(data, end_stream=True)
            else:
                assert data == inc.stream_id.to_bytes(8, "big") * 100
        await asyncio.gather(*(one() for _ in range(n + n_bidi)))

    async def uni(i: int) -> None:
        s = await client.open_uni()
        await s.write(s.stream_id.to_bytes(8, "big") * 100, end_stream=True)

    async def bidi(i: int) -> None:
        s, r = await client.open_bi()
        payload = os.urandom(500 + i)
        await s.write(payload, end_stream=True)
        assert await read_all(r) == payload

    await w(asyncio.gather(serve_all(), *(uni(i) for i in range(n)),
                           *(bidi(i) for i in range(n_bidi))), 20)  # about 1 s


@pytest.mark.parametrize("single_write", [False, True])
async def test_large_transfer_is_bit_identical(pair: Pair, single_write: bool) -> None:
    client, server = pair
    payload = os.urandom(8 * 1024 * 1024)
    digest = hashlib.sha256(payload).digest()

    async def receive() -> bytes:
        inc = await server.accept()
        h = hashlib.sha256()
        while chunk := await inc.recv.read():
            h.update(chunk)
        return h.digest()

    async def send() -> None:
        s = await client.open_uni()
        view = memoryview(payload)
        if single_write:
            await s.write(view, end_stream=True)  # > high-water: sliced internally
        else:
            for pos in range(0, len(payload), 300_000):
                await s.write(view[pos:pos + 300_000])
            await s.finish()

    got, _ = await w(asyncio.gather(receive(), send()), 60)
    assert got == digest


async def test_framed_writes_arrive_head_then_data(pair: Pair) -> None:
    """``write_framed`` queues its head, then its data, in order with the stream's other
    writes: below the high-water mark as one send, above it (the last write here) as the
    two writes it stands for; with FIN on the last."""
    client, server = pair
    parts = [(b"h%d" % i, memoryview(os.urandom(40_000 + i))) for i in range(8)]
    parts.append((b"last", memoryview(os.urandom(2 * 1024 * 1024))))  # > send_buffer_high
    s = await w(client.open_uni())
    for i, (head, data) in enumerate(parts):
        await w(s.write_framed(head, data, end_stream=i == len(parts) - 1))
    inc = await w(server.accept())
    assert await w(read_all(inc.recv)) == b"".join(h + bytes(d) for h, d in parts)


async def test_default_1200_byte_datagrams(make_harness: object, transport: str) -> None:
    settings = QuicSettings()
    h = await make_harness(settings)  # type: ignore[operator]
    client, server = await h.pair(transport, settings)
    payload = os.urandom(512 * 1024)
    s = await w(client.open_uni())
    await w(s.write(payload, end_stream=True))
    inc = await w(server.accept())
    assert await w(read_all(inc.recv)) == payload
    await w(client.aclose())


async def test_datagrams_both_ways(pair: Pair) -> None:
    client, server = pair
    assert client.max_datagram_payload > 1000
    assert client.send_datagram(b"ping")
    assert await w(server.receive_datagram()) == b"ping"
    assert server.send_datagram(b"pong")
    assert await w(client.receive_datagram()) == b"pong"
    assert not client.send_datagram(b"x" * (SETTINGS.max_datagram_size + 1))  # dropped
