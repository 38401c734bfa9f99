"""Fixtures: a real server on 127.0.0.1 (ephemeral port) and client/server session pairs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from relay.session.wire import MOQT
from relay.transport import (
    CertificatePaths,
    Connection,
    QuicSettings,
    Server,
    connect,
    ensure_self_signed,
    serve,
)

T = TypeVar("T")

TIMEOUT = 10.0
SETTINGS = QuicSettings(max_datagram_size=8952, idle_timeout=15.0, connect_timeout=5.0)


async def w(aw: Awaitable[T], timeout: float = TIMEOUT) -> T:
    """Every await in these tests is bounded."""
    return await asyncio.wait_for(aw, timeout)


async def until(cond: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    """Wait for a state the transport exposes no event for; fail loudly if it never comes,
    so a test cannot silently check less than it claims."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never reached: {what}")
        await asyncio.sleep(0.005)


async def round_trips(a: Connection, b: Connection, n: int = 2) -> None:
    """``n`` datagram exchanges a -> b -> a. Datagrams bypass flow control, and whatever
    ``b`` queued for ``a`` before answering (credit, stream data) reaches ``a`` no later than
    the answer: after this, a negative check ("no credit came back") holds however slow
    the machine is, instead of hoping a fixed delay was long enough."""
    for i in range(n):
        ping = b"round trip %d" % i
        assert a.send_datagram(ping)
        while (got := await w(b.receive_datagram())) != ping:
            pass
        assert b.send_datagram(got)
        while await w(a.receive_datagram()) != ping:
            pass


async def exchange(client: Connection, server: Connection, up: bytes = b"ping",
                   down: bytes = b"pong") -> None:
    """``up`` from the client and ``down`` back on one bidirectional stream, each checked
    bit for bit: the session carries data both ways."""
    from stream_helpers import read_all

    send, recv = await w(client.open_bi())
    await w(send.write(up, end_stream=True))
    inc = await w(server.accept())
    assert await w(read_all(inc.recv)) == up
    assert inc.send is not None
    await w(inc.send.write(down, end_stream=True))
    assert await w(read_all(recv)) == down


def url_for(server: Server, transport: str, path: str = "/moq") -> str:
    scheme = "moqt" if transport == "quic" else "https"
    return f"{scheme}://127.0.0.1:{server.port}{path}"


class Harness:
    """A server whose sessions the test drives directly (handler parks them in a queue)."""

    def __init__(self, server: Server, certs: CertificatePaths,
                 sessions: asyncio.Queue[Connection]) -> None:
        self.server = server
        self.certs = certs
        self.sessions = sessions

    async def pair(self, transport: str, settings: QuicSettings = SETTINGS,
                   path: str = "/moq") -> tuple[Connection, Connection]:
        client = await w(connect(url_for(self.server, transport, path), settings=settings,
                                 ca_file=self.certs.certfile, application=MOQT))
        server_side = await w(self.sessions.get())
        return client, server_side


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertificatePaths:
    return ensure_self_signed(Path(tmp_path_factory.mktemp("certs")))


async def _start(certs: CertificatePaths, settings: QuicSettings) -> Harness:
    sessions: asyncio.Queue[Connection] = asyncio.Queue()

    async def handler(conn: Connection) -> None:
        await sessions.put(conn)
        await conn.wait_closed()

    server = await serve("127.0.0.1", 0, certs.certfile, certs.keyfile, handler,
                         settings=settings, application=MOQT)
    return Harness(server, certs, sessions)


@pytest.fixture
async def harness(certs: CertificatePaths) -> AsyncIterator[Harness]:
    h = await _start(certs, SETTINGS)
    yield h
    await w(h.server.close(grace=0.5))


@pytest.fixture
async def make_harness(certs: CertificatePaths) -> AsyncIterator[Any]:
    """For tests that need non-default server settings."""
    started: list[Harness] = []

    async def make(settings: QuicSettings) -> Harness:
        h = await _start(certs, settings)
        started.append(h)
        return h

    yield make
    for h in started:
        await w(h.server.close(grace=0.5))


@pytest.fixture(params=["quic", "webtransport"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def pair(harness: Harness, transport: str) -> AsyncIterator[tuple[Connection, Connection]]:
    client, server_side = await harness.pair(transport)
    yield client, server_side
    await w(client.aclose())
