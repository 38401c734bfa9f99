"""Bounded memory: a reader that does not read never buffers more than its windows.

On aioquic the writer blocks (credit follows reads); on qh3, whose core returns credit as it
delivers, the over-full stream is stopped with EXCESSIVE_LOAD (docs/transport.md)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest
from backends import credit_follows_reads
from conftest import round_trips, until, w
from stream_helpers import read_all

from relay.session.wire import MOQT
from relay.transport import Connection, QuicSettings, SendStream, StreamStopped
from relay.transport.errors import ReceiveBufferFull

KiB = 1024
WINDOW = 64 * KiB
HIGH = 64 * KiB
CHUNK = 16 * KiB
# Window bytes that carry no application data: a WebTransport stream's header (signal and
# session ID), and on the connection also HTTP/3's own streams.
STREAM_SLACK = 16
CONNECTION_SLACK = 1 * KiB
SETTINGS = QuicSettings(max_datagram_size=8952, max_stream_data=WINDOW, max_data=4 * WINDOW,
                        send_buffer_high=HIGH, connection_send_buffer_high=8 * HIGH,
                        connect_timeout=5.0)


def blocked(conn: Connection) -> set[SendStream]:
    """The session's writers waiting for room."""
    return conn.streams._blocked


async def _writer(send: SendStream, payload: bytes, progress: list[int]) -> None:
    for pos in range(0, len(payload), CHUNK):
        await send.write(payload[pos:pos + CHUNK])
        progress[0] = pos + CHUNK
    await send.finish()


async def _held(task: asyncio.Future[object], written: Callable[[], int],
                stuck: Callable[[], bool], sender: Connection, reader: Connection) -> None:
    """The writer filled the reader's window (``stuck``) and gets no further: across round
    trips in which any credit the reader returned would have arrived, it writes nothing
    more. Decided on events, so a slow machine cannot turn this into a weaker check."""
    await until(stuck, "the reader's window full and the writer waiting")
    before = written()
    await round_trips(sender, reader)
    assert written() == before and not task.done()


async def test_writer_blocks_on_a_reader_that_does_not_read(make_harness: object,
                                                            transport: str) -> None:
    h = await make_harness(SETTINGS)  # type: ignore[operator]
    client, server = await h.pair(transport, SETTINGS)
    payload = os.urandom(4 * 1024 * KiB)
    send = await w(client.open_uni())
    progress = [0]
    task = asyncio.ensure_future(_writer(send, payload, progress))
    inc = await w(server.accept())
    if not credit_follows_reads():
        # qh3: the stream is stopped once it holds a window's worth unread
        with pytest.raises(StreamStopped) as stopped:
            await w(task)
        assert stopped.value.code == MOQT.receive_overflow_code
        assert inc.recv.buffered == 0 and server._port.view.unread_total == 0
        with pytest.raises(ReceiveBufferFull):
            await w(read_all(inc.recv))
        await w(client.aclose())
        return
    await _held(task, lambda: progress[0],
                lambda: inc.recv.buffered >= WINDOW - STREAM_SLACK and send in blocked(client),
                client, server)
    # receiver buffers at most its stream window; sender holds at most high water
    # (+ one write) unsent, plus what is in flight (bounded by the peer's window)
    assert inc.recv.buffered <= WINDOW
    assert send.unsent <= HIGH + CHUNK
    assert progress[0] <= WINDOW + HIGH + 2 * CHUNK + 8 * KiB
    assert send in blocked(client)
    # reading drains everything, bit-identical, and the writer completes
    got = await w(read_all(inc.recv), 30)
    await w(task)
    assert got == payload
    await w(client.aclose())


async def test_connection_window_bounds_unread_streams(make_harness: object,
                                                      transport: str) -> None:
    h = await make_harness(SETTINGS)  # type: ignore[operator]
    client, server = await h.pair(transport, SETTINGS)
    n = 8  # 8 streams x 64 KiB windows > the 256 KiB connection window
    payloads = [os.urandom(256 * KiB) for _ in range(n)]
    sends = [await w(client.open_uni()) for _ in range(n)]
    progress = [[0] for _ in range(n)]
    tasks = [asyncio.ensure_future(_writer(s, p, pr))
             for s, p, pr in zip(sends, payloads, progress, strict=True)]
    incs = []
    while len(incs) < 4:  # at least the window's worth of streams shows up
        incs.append(await w(server.accept()))
    if not credit_follows_reads():
        # qh3: streams beyond the connection window are stopped, the rest stay within it
        outcomes = await w(asyncio.gather(*tasks, return_exceptions=True), 30)
        stopped = [o for o in outcomes if isinstance(o, StreamStopped)]
        assert stopped and all(o.code == MOQT.receive_overflow_code for o in stopped)
        assert server._port.view.unread_total <= 4 * WINDOW
        assert all(i.recv.buffered <= WINDOW for i in incs)
        await w(client.aclose())
        return
    def unread() -> int:
        return sum(i.recv.buffered for i in incs) + sum(
            i.recv.buffered for i in server.streams._incoming)

    await _held(asyncio.gather(*tasks), lambda: sum(p[0] for p in progress),
                lambda: unread() >= 4 * WINDOW - CONNECTION_SLACK and all(
                    t.done() or s in blocked(client) for t, s in zip(tasks, sends, strict=True)),
                client, server)
    assert unread() <= 4 * WINDOW
    for inc in incs:
        assert inc.recv.buffered <= WINDOW
    # drain all streams (more may arrive as credit returns)
    results = {}

    async def drain_one() -> None:
        inc = incs.pop() if incs else await server.accept()
        results[inc.stream_id] = await read_all(inc.recv)

    await w(asyncio.gather(*(drain_one() for _ in range(n))), 30)
    await w(asyncio.gather(*tasks))
    assert [results[s.stream_id] for s in sends] == payloads
    await w(client.aclose())


async def test_unread_data_is_released_by_stop_sending(make_harness: object,
                                                       transport: str) -> None:
    h = await make_harness(SETTINGS)  # type: ignore[operator]
    client, server = await h.pair(transport, SETTINGS)
    # fill one stream's window, then stop it: the connection window must be returned
    stuck = await w(client.open_uni())
    progress = [0]
    task = asyncio.ensure_future(_writer(stuck, os.urandom(1024 * KiB), progress))
    inc = await w(server.accept())
    if credit_follows_reads():
        await _held(task, lambda: progress[0],
                    lambda: inc.recv.buffered >= WINDOW - STREAM_SLACK and stuck in blocked(client),
                    client, server)
        inc.recv.stop_sending(0x1)
        code = 0x1
    else:
        code = MOQT.receive_overflow_code  # qh3: the overflow stopped it already
    assert await w(stuck.wait_stopped()) == code
    task.cancel()
    assert server._port.view.unread_total == 0  # receive window given back
    assert client.streams.connection_unsent() < CHUNK  # the reset stream's queue is not counted
    # the session still moves data afterwards
    s = await w(client.open_uni())
    await w(s.write(b"after", end_stream=True))
    inc2 = await w(server.accept())
    assert await w(read_all(inc2.recv)) == b"after"
    await w(client.aclose())


async def test_a_client_that_does_not_read_slows_the_sender(make_harness: object,
                                                            transport: str) -> None:
    """The other direction: the server writes, the client does not read. aioquic withholds
    credit; a qh3 client stops reading its socket until the application catches up. Either
    way the writer waits, the client's buffer stays near its window, nothing is lost."""
    h = await make_harness(SETTINGS)  # type: ignore[operator]
    client, server = await h.pair(transport, SETTINGS)
    payload = os.urandom(4 * 1024 * KiB)
    send = await w(server.open_uni())
    progress = [0]
    task = asyncio.ensure_future(_writer(send, payload, progress))
    inc = await w(client.accept())
    if credit_follows_reads("client"):
        await _held(task, lambda: progress[0],
                    lambda: inc.recv.buffered >= WINDOW - STREAM_SLACK and send in blocked(server),
                    server, client)
        assert inc.recv.buffered <= WINDOW
    else:
        # a paused client reads no datagrams either: no round trip, but nothing moves
        # until it reads again
        reader = client._port._reader
        await until(lambda: reader is not None and reader.paused and send in blocked(server),
                    "the client's reader paused and the server's writer waiting")
        assert not task.done()
    # one burst of datagrams may land after the pause: a window plus a burst at most
    assert inc.recv.buffered <= WINDOW + 512 * KiB
    got = await w(read_all(inc.recv), 60)
    await w(task, 60)
    assert got == payload
    await w(client.aclose())
