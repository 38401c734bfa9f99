"""Where a relay sends a request it cannot answer from its cache (``Reach``), and what it
answers when a source never does: guards of issue 26 that no test protected.

Sibling workers are linked here in one process, exactly as ``relay/core/siblings.py`` links
them (a second listener served by ``handle_sibling_connection``, a session to it with a
SUBSCRIBE_NAMESPACE on the empty prefix, ``add_sibling``), so the counts are exact."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from relay_helpers import TIMEOUT, client, live_params, make_ns, relay_at

from relay.core.relay import RelayOptions
from relay.moqt.codes import RequestErrorCode
from relay.moqt.primitives import TrackNamespace
from relay.service import RunningRelay
from relay.session import (
    IncomingSubscribe,
    IncomingTrackStatus,
    MoqtSession,
    RequestRejected,
    SessionHandler,
    open_session,
)
from relay.session.wire import MOQT
from relay.transport import Server, ensure_self_signed, serve


class _Counting(SessionHandler):
    """A publisher that has no Track but counts the SUBSCRIBEs routed to it."""

    def __init__(self) -> None:
        self.subscribes = 0

    async def subscribe(self, req: IncomingSubscribe) -> None:
        self.subscribes += 1
        await req.reject(RequestErrorCode.DOES_NOT_EXIST, "no such track")


class _Silent(SessionHandler):
    """A publisher that never answers SUBSCRIBE or TRACK_STATUS (alive, not a dead link)."""

    async def subscribe(self, req: IncomingSubscribe) -> None:
        await asyncio.Event().wait()

    async def track_status(self, req: IncomingTrackStatus) -> None:
        await asyncio.Event().wait()


@asynccontextmanager
async def siblings(a: RunningRelay, b: RunningRelay, tmp: Path
                   ) -> AsyncIterator[tuple[Server, Server]]:
    """Link ``a`` and ``b`` as two workers of one relay are linked."""
    tls = ensure_self_signed(tmp / "sibling-tls")
    servers = [await serve("127.0.0.1", 0, tls.certfile, tls.keyfile,
                           x.relay.handle_sibling_connection, application=MOQT) for x in (a, b)]
    sessions: list[MoqtSession] = []
    try:
        for x, other in ((a, servers[1]), (b, servers[0])):
            s = await asyncio.wait_for(open_session(f"moqt://127.0.0.1:{other.port}/",
                                                    ca_file=tls.certfile), TIMEOUT)
            sessions.append(s)
            nsub = await asyncio.wait_for(s.subscribe_namespace(()), TIMEOUT)
            x.relay.routing.add_sibling(s, nsub)
        yield servers[0], servers[1]
    finally:
        for s in sessions:
            await s.aclose()
        for srv in servers:
            await srv.close()


async def _announced(r: RunningRelay, ns: TrackNamespace, sources: int) -> None:
    async with asyncio.timeout(TIMEOUT):
        while len(r.relay.namespaces.sources_of(ns)) < sources:
            await asyncio.sleep(0)


async def test_a_siblings_request_never_bounces_back_to_the_sibling(tmp_path: Path) -> None:
    """A namespace announced on both workers; a SUBSCRIBE at B for a Track nobody publishes
    goes to B's publisher, then to A, whose answer comes from its own publisher only: each
    publisher is asked once, and the answer is DOES_NOT_EXIST at once."""
    a = await relay_at(tmp_path / "a")
    b = await relay_at(tmp_path / "b")
    ns = make_ns()
    try:
        async with siblings(a, b, tmp_path):
            pa, pb = _Counting(), _Counting()
            for x, h in ((a, pa), (b, pb)):
                s = await client(x, handler=h)
                await asyncio.wait_for(s.publish_namespace(ns), TIMEOUT)
            await _announced(a, ns, 2)  # its publisher's, and the sibling's
            await _announced(b, ns, 2)
            c = await client(b)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(RequestRejected) as e:
                await asyncio.wait_for(c.subscribe(ns, b"k.raw.s0", live_params()), TIMEOUT)
            assert e.value.code == RequestErrorCode.DOES_NOT_EXIST
            assert (pa.subscribes, pb.subscribes) == (1, 1)
            # at once: a request sent back to B would wait there for B's own attempt (the
            # one waiting for A) until the upstream SUBSCRIBE's bound, fill_timeout
            assert loop.time() - started < b.relay.options.default_fill_timeout
    finally:
        await b.close()
        await a.close()


@pytest.mark.parametrize("request_kind", ["subscribe", "track_status"])
async def test_a_source_that_never_answers_is_timeout_not_does_not_exist(
        tmp_path: Path, request_kind: str) -> None:
    r = await relay_at(tmp_path, options=RelayOptions(default_fill_timeout=0.5))
    ns = make_ns()
    try:
        pub = await client(r, handler=_Silent())
        await asyncio.wait_for(pub.publish_namespace(ns), TIMEOUT)
        c = await client(r)
        ask = c.subscribe(ns, b"k.raw.s0", live_params()) if request_kind == "subscribe" \
            else c.track_status(ns, b"k.raw.s0")
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(ask, TIMEOUT)
        assert e.value.code == RequestErrorCode.TIMEOUT
    finally:
        await r.close()


async def test_a_request_waits_only_for_an_upstream_fetch_of_its_own_reach(
        tmp_path: Path) -> None:
    """Serving a FETCH waits for an upstream FETCH already on its way instead of asking
    again (pull-through), but only for one asked with the request's own Reach: a sibling's
    or the upstream relay's request waiting for a client's FETCH that was sent to that same
    sibling or up would wait for itself until its FILL_TIMEOUT."""
    from relay.core.namespaces import Reach
    from relay.moqt.primitives import FullTrackName, Location

    r = await relay_at(tmp_path)
    try:
        routing = r.relay.routing
        track = r.relay.track(FullTrackName(make_ns(), b"k.raw.s0"))
        other = r.relay.track(FullTrackName(make_ns(), b"k.raw.s0"))
        pending: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
        routing._fetches[(track.full_name, Location(0, 0), Location(3, 9), Reach.ALL)] = pending
        at = Location(2, 5)
        assert routing.fetch_in_flight(track, at, reach=Reach.ALL) is pending
        assert routing.fetch_in_flight(track, at, reach=Reach.OWN) is None
        assert routing.fetch_in_flight(track, at, reach=Reach.NO_SIBLINGS) is None
        assert routing.fetch_in_flight(track, Location(4, 0)) is None  # past its range
        assert routing.fetch_in_flight(other, at) is None
        pending.set_result(True)
        assert routing.fetch_in_flight(track, at) is None  # over
        del routing._fetches[(track.full_name, Location(0, 0), Location(3, 9), Reach.ALL)]
    finally:
        await r.close()
