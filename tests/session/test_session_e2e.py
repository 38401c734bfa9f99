"""End to end without a relay: a publisher session answers SUBSCRIBE (Next Object +
FILL_PARAMETERS) and FETCH (OBJECTID_FILTER) from a second session, over raw QUIC and over
WebTransport, on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from session_helpers import TIMEOUT, TrackPublisher, served_by

from relay.moqt.codes import GroupOrder, ObjectStatus, ParameterType, RequestErrorCode
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.moqt.range_filter import Range, RangeFilter
from relay.session import (
    MoqtSession,
    RequestRejected,
    SessionConfig,
    Source,
    StreamEnded,
    SubscriptionDone,
)
from relay.transport import ensure_self_signed

NS = (b"kvcs-1", os.urandom(32), b"\xff\x00compat", b"anchor", b"pub")  # raw octets on purpose
TRACK = FullTrackName(NS, b"k.raw.s0")


def payloads(group: int, n: int = 5) -> list[bytes]:
    return [os.urandom(100 + 3000 * i) + bytes([group, i]) for i in range(n)]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_self_signed(tmp_path_factory.mktemp("tls")).certfile.parent


@pytest.fixture(params=["quic", "webtransport"])
async def pair(request: pytest.FixtureRequest, certs: Path
               ) -> AsyncIterator[tuple[TrackPublisher, MoqtSession]]:
    publisher = TrackPublisher(TRACK)
    async with served_by(publisher, certs, transport=request.param,
                         config=SessionConfig(max_filter_ranges=8)) as client:
        yield publisher, client


async def test_subscribe_with_fill_gets_every_object_exactly_once(pair) -> None:  # type: ignore[no-untyped-def]
    publisher, client = pair
    sent = {g: payloads(g) for g in range(4)}
    await publisher.produce_group(0, sent[0])
    await publisher.produce_group(1, sent[1])

    sub = await asyncio.wait_for(client.subscribe(NS, TRACK.name, Params(
        location_filter=LocationFilter.next_object(),
        fill=Params(location_filter=LocationFilter.absolute_start(0, 0)))), TIMEOUT)
    # L = the End of Group of Group 1 (status Objects count, profile §6.3).
    assert sub.largest == Location(1, 5)

    await publisher.produce_group(2, sent[2])
    await publisher.produce_group(3, sent[3], end_of_track=True)

    got: dict[Location, bytes] = {}
    statuses: dict[Location, ObjectStatus] = {}
    fill_ended = False
    done = None
    async with asyncio.timeout(TIMEOUT):
        async for ev in sub:
            if isinstance(ev, SubscriptionDone):
                done = ev
            elif isinstance(ev, StreamEnded):
                assert ev.fin, ev
                fill_ended = fill_ended or ev.stream.source == Source.FILL
            elif ev.status == ObjectStatus.NORMAL:
                assert ev.location not in got, f"{ev.location} delivered twice"
                got[ev.location] = bytes(ev.payload)
                assert (ev.stream.source == Source.FILL) == (ev.group < 2)
            else:
                statuses[ev.location] = ev.status
    want = {Location(g, i): p for g, ps in sent.items() for i, p in enumerate(ps)}
    assert got == want
    assert fill_ended
    assert statuses == {Location(2, 5): ObjectStatus.END_OF_GROUP,
                        Location(3, 5): ObjectStatus.END_OF_GROUP,
                        Location(4, 0): ObjectStatus.END_OF_TRACK}
    assert done is not None and done.status == 0x2  # TRACK_ENDED
    assert done.stream_count == 4  # fill + 2 groups + End of Track


async def test_fetch_with_objectid_filter_both_orders(pair) -> None:  # type: ignore[no-untyped-def]
    publisher, client = pair
    sent = {g: payloads(g) for g in range(4)}
    for g in range(4):
        await publisher.produce_group(g, sent[g])
    assert client.peer_max_filter_ranges == 8
    for order in (GroupOrder.ASCENDING, GroupOrder.DESCENDING):
        params = Params(
            location_filter=LocationFilter.absolute_group_end(1, 0, 3),
            group_order=order,
            range_filters=(RangeFilter(ParameterType.OBJECTID_FILTER, 0, (Range(0, 1),)),))
        resp = await asyncio.wait_for(client.fetch(NS, TRACK.name, params), TIMEOUT)
        assert resp.end_location == Location(3, 5)
        async with asyncio.timeout(TIMEOUT):
            events = await resp.collect()
        locs = [e.location for e in events]
        groups = [1, 2, 3] if order == GroupOrder.ASCENDING else [3, 2, 1]
        assert locs == [Location(g, i) for g in groups for i in (0, 1)]
        assert all(bytes(e.payload) == sent[e.group][e.object_id] for e in events)


async def test_rejections_are_typed(pair) -> None:  # type: ignore[no-untyped-def]
    _, client = pair
    with pytest.raises(RequestRejected) as info:
        await asyncio.wait_for(client.subscribe(NS, b"v.raw.s0"), TIMEOUT)
    assert info.value.code == RequestErrorCode.DOES_NOT_EXIST
    with pytest.raises(RequestRejected) as info:
        await asyncio.wait_for(client.fetch(NS, TRACK.name), TIMEOUT)
    assert info.value.code == RequestErrorCode.INVALID_RANGE
    # the session survives request errors
    with pytest.raises(RequestRejected):
        await asyncio.wait_for(client.fetch(NS, TRACK.name), TIMEOUT)


async def test_datagram_objects_reach_the_subscription(pair) -> None:  # type: ignore[no-untyped-def]
    publisher, client = pair
    sub = await asyncio.wait_for(client.subscribe(NS, TRACK.name, Params(
        location_filter=LocationFilter.next_object())), TIMEOUT)
    await asyncio.wait_for(publisher.subscribed.wait(), TIMEOUT)
    served = publisher.live[-1]
    # datagrams are unreliable: send until one arrives (bounded), then check its fields
    async with asyncio.timeout(TIMEOUT):
        it = aiter(sub)
        while True:
            assert served.send_datagram(7, 3, b"datagram payload", priority=9)
            try:
                ev = await asyncio.wait_for(anext(it), 0.2)
                break
            except TimeoutError:
                continue
    assert ev.stream.source == Source.DATAGRAM
    assert (ev.group, ev.object_id, ev.priority, bytes(ev.payload)) == (7, 3, 9,
                                                                      b"datagram payload")


async def test_request_updates_wait_for_room_under_the_peers_limit(certs: Path) -> None:
    """The publisher accepts one unanswered REQUEST_UPDATE per request (MAX_REQUEST_UPDATES
    1): concurrent updates of one subscription go out one at a time, none is refused and the
    session stays up (a fifth unanswered one would close it, test_session_malformed.py)."""
    publisher = TrackPublisher(TRACK)
    async with served_by(publisher, certs,
                         config=SessionConfig(max_request_updates=1)) as client:
        assert client.state.peer_max_request_updates == 1
        sub = await asyncio.wait_for(client.subscribe(NS, TRACK.name, Params(
            location_filter=LocationFilter.next_object())), TIMEOUT)
        oks = await asyncio.wait_for(asyncio.gather(
            *(sub.update(Params(subscriber_priority=i)) for i in range(5))), TIMEOUT)
        assert len(oks) == 5 and not client.closed
        assert publisher.live[-1].subscriber_priority == 4  # applied in order


async def test_cancel_stops_and_resets_the_request_stream(pair) -> None:  # type: ignore[no-untyped-def]
    """Unsubscribing aborts both directions of the request stream (§5.1): the publisher sees
    STOP_SENDING on what it sends and RESET_STREAM on what it reads, both with the code. A
    second cancel sends nothing more."""
    publisher, client = pair
    sub = await asyncio.wait_for(client.subscribe(NS, TRACK.name), TIMEOUT)
    await asyncio.wait_for(publisher.subscribed.wait(), TIMEOUT)
    served = publisher.live[0]
    sub.cancel(0x7)
    sub.cancel(0x9)
    assert await asyncio.wait_for(served.rs.send_stream.wait_stopped(), TIMEOUT) == 0x7
    await asyncio.wait_for(served.cancelled.wait(), TIMEOUT)
    assert served.cancel_code == 0x7
