"""Ended requests give their stream credit back, whatever the requester does with its own
direction.

A requester SHOULD FIN its direction once the responder's FIN completed a request (§5.2);
one that never does must not use up the session's bidirectional streams: qh3 grants a fixed
100 and returns one only when a stream is over in both directions, so such a client's 101st
FETCH waited for ever on a qh3 relay. The server here grants 100 on both backends (aioquic
takes ``max_streams_bidi``; qh3's is fixed), so the test means the same on each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from session_helpers import TIMEOUT, TrackPublisher
from stream_helpers import read_all

from relay.moqt.control import ControlStreamParser, encode_message
from relay.moqt.messages import Fetch, FetchOk, Setup
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName
from relay.session import (
    IncomingFetch,
    IncomingSubscribeNamespace,
    MoqtSession,
    SessionHandler,
    open_session,
)
from relay.session.wire import MOQT
from relay.transport import Connection, QuicSettings, Server, connect, ensure_self_signed, serve

NS = (b"kvcs-1", b"credit")
TRACK = FullTrackName(NS, b"k.raw.s0")
PEER_BIDI = 100  # what qh3 grants, fixed
REQUESTS = 150  # more than the limit: only returned credit lets the last ones through


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_self_signed(tmp_path_factory.mktemp("tls")).certfile.parent


@pytest.fixture
async def server(certs: Path) -> AsyncIterator[Server]:
    publisher = TrackPublisher(TRACK)
    await publisher.produce_group(0, [b"zero", b"one"])

    async def on_conn(conn: Connection) -> None:
        s = await MoqtSession.start(conn, None, publisher)
        await s.wait_closed()

    srv = await serve("127.0.0.1", 0, certs / "cert.pem", certs / "key.pem", on_conn,
                      settings=QuicSettings(max_streams_bidi=PEER_BIDI), application=MOQT)
    yield srv
    await srv.close()


async def _fetch_without_fin(conn: Connection, rid: int) -> bytes:
    """One FETCH on a new request stream whose direction we never FIN: the FETCH_OK, the
    fetch stream to its end, the responder's FIN. Returns the fetch stream's bytes."""
    send, recv = await conn.open_bi()
    await send.write(encode_message(Fetch(rid, NS, TRACK.name, Params())))
    parser = ControlStreamParser()
    replies: list[object] = []
    while not replies:
        chunk = await recv.read()
        assert chunk, "request stream ended before FETCH_OK"
        replies += parser.feed(chunk)
    assert isinstance(replies[0], FetchOk), replies
    data = await read_all((await conn.accept()).recv)
    while chunk := await recv.read():  # the responder FINs once the fetch stream is done
        assert not parser.feed(chunk)
    return data


async def test_requests_the_requester_never_fins_give_their_stream_back(
        server: Server, certs: Path) -> None:
    conn = await asyncio.wait_for(connect(f"moqt://127.0.0.1:{server.port}/",
                                          ca_file=certs / "cert.pem", application=MOQT), TIMEOUT)
    try:
        control = await conn.open_uni()
        await asyncio.wait_for(control.write(encode_message(Setup())), TIMEOUT)
        # the server's control stream comes first; every later one is a fetch stream
        theirs = await asyncio.wait_for(conn.accept(), TIMEOUT)
        assert not theirs.is_bidirectional
        served: list[bytes] = []

        async def run() -> None:
            for i in range(REQUESTS):
                served.append(await _fetch_without_fin(conn, 2 * i))

        try:
            await asyncio.wait_for(run(), 30)
        except TimeoutError:
            raise AssertionError(f"FETCH {len(served) + 1} of {REQUESTS} never got a "
                                 "request stream") from None
        # every fetch stream carried both Objects (after a FETCH_HEADER naming its request)
        assert len(served) == REQUESTS
        assert all(d.endswith(b"zero\x00\x03one") for d in served)
    finally:
        await asyncio.wait_for(conn.aclose(), TIMEOUT)


class _Silent(SessionHandler):
    """Answers nothing: every FETCH and SUBSCRIBE_NAMESPACE waits for ever."""

    def __init__(self) -> None:
        self.asked = 0
        self.never = asyncio.Event()

    async def fetch(self, req: IncomingFetch) -> None:
        self.asked += 1
        await self.never.wait()

    async def subscribe_namespace(self, req: IncomingSubscribeNamespace) -> None:
        self.asked += 1
        await self.never.wait()


async def test_requests_given_up_before_their_reply_give_their_stream_back(
        certs: Path) -> None:
    """A requester that gives up waiting (its timeout, its task cancelled) cancels the
    request's stream (§5.1): the responder is not left serving it, and the stream credit
    comes back. More requests than the peer grants at once: all given up, then none held."""
    silent = _Silent()
    sessions: list[MoqtSession] = []

    async def on_conn(conn: Connection) -> None:
        s = await MoqtSession.start(conn, None, silent)
        sessions.append(s)
        await s.wait_closed()

    srv = await serve("127.0.0.1", 0, certs / "cert.pem", certs / "key.pem", on_conn,
                      settings=QuicSettings(max_streams_bidi=PEER_BIDI), application=MOQT)
    c = await asyncio.wait_for(open_session(f"moqt://127.0.0.1:{srv.port}/",
                                            ca_file=certs / "cert.pem"), TIMEOUT)
    try:
        async def ask(i: int, wait: float) -> None:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(c.fetch(NS, TRACK.name) if i % 2 else
                                       c.subscribe_namespace((b"kvcs-1", b"%d" % i)), wait)

        # twice the grant: only streams given back let the second round in. The second
        # round's requests may wait for the peer's MAX_STREAMS (aioquic sends it with its next
        # packet): on a loaded machine 0.5 s was once too short for it
        for wait in (0.5, 1.5):
            await asyncio.wait_for(asyncio.gather(*(ask(i, wait) for i in range(PEER_BIDI))),
                                   TIMEOUT)
            async with asyncio.timeout(TIMEOUT):
                while c.request_streams().out_in_use or \
                        sessions[0].request_streams().in_in_use:
                    await asyncio.sleep(0.01)  # poll step: credit moves with no event here
        assert silent.asked == 2 * PEER_BIDI  # the second round reached the server too
    finally:
        await asyncio.wait_for(c.aclose(), TIMEOUT)
        await srv.close()
