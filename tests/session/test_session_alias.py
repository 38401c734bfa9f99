"""Track Aliases on the subscriber side of a real session (§8.3, Appendix B): a publisher
that names two different live Tracks with one Track Alias is closed with
DUPLICATE_TRACK_ALIAS; the same Track under its alias again, or an alias freed by the end
of its subscription, is fine; a data stream that overtakes the SUBSCRIBE_OK naming its alias
is delivered as soon as that SUBSCRIBE_OK arrives, and so is a fill stream that overtakes the
SUBSCRIBE_OK giving its Group Order (§9.4)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from session_helpers import TIMEOUT, served_by

from relay.moqt.codes import GroupOrder, SessionErrorCode
from relay.moqt.dataplane.fetch import FetchStreamEncoder
from relay.moqt.dataplane.objects import SubgroupHeader
from relay.moqt.dataplane.subgroup import SubgroupStreamEncoder
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import Location
from relay.session import (
    IncomingSubscribe,
    MoqtSession,
    ReceivedObject,
    ServedSubscription,
    SessionClosed,
    SessionConfig,
    SessionHandler,
    Source,
    StreamEnded,
    SubscriptionDone,
)
from relay.transport import ensure_self_signed

NS = (b"kvcs-1", os.urandom(32))
ALIAS = 7


class OneAliasPublisher(SessionHandler):
    """Answers every SUBSCRIBE with the same Track Alias, as a faulty publisher would."""

    def __init__(self) -> None:
        self.served: dict[bytes, list[ServedSubscription]] = {}

    async def subscribe(self, req: IncomingSubscribe) -> None:
        served = await req.accept(None, track_alias=ALIAS)
        self.served.setdefault(req.name, []).append(served)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[OneAliasPublisher, MoqtSession]]:
    publisher = OneAliasPublisher()
    async with served_by(publisher, ensure_self_signed(tmp_path).certfile.parent) as client:
        yield publisher, client


async def test_one_alias_for_two_live_tracks_closes_the_session(pair) -> None:  # type: ignore[no-untyped-def]
    _publisher, client = pair
    x = await asyncio.wait_for(client.subscribe(NS, b"x"), TIMEOUT)
    assert x.track_alias == ALIAS
    # the same Track again under its alias: no conflict
    again = await asyncio.wait_for(client.subscribe(NS, b"x"), TIMEOUT)
    assert again.track_alias == ALIAS and not client.closed
    with pytest.raises(SessionClosed) as e:
        await asyncio.wait_for(client.subscribe(NS, b"y"), TIMEOUT)
    assert e.value.meaning == SessionErrorCode.DUPLICATE_TRACK_ALIAS
    code, _ = await asyncio.wait_for(client.wait_closed(), TIMEOUT)
    assert code == SessionErrorCode.DUPLICATE_TRACK_ALIAS


async def test_an_alias_freed_by_publish_done_names_another_track(pair) -> None:  # type: ignore[no-untyped-def]
    publisher, client = pair
    x = await asyncio.wait_for(client.subscribe(NS, b"x"), TIMEOUT)
    await publisher.served[b"x"][0].done()
    async with asyncio.timeout(TIMEOUT):
        events = [ev async for ev in x]
    assert isinstance(events[-1], SubscriptionDone)
    y = await asyncio.wait_for(client.subscribe(NS, b"y"), TIMEOUT)
    assert y.track_alias == ALIAS and not client.closed


class EarlyStreamPublisher(SessionHandler):
    """Sends a Group's subgroup stream before the SUBSCRIBE_OK that names its Track Alias."""

    def __init__(self) -> None:
        self.subscriber: MoqtSession | None = None

    async def subscribe(self, req: IncomingSubscribe) -> None:
        enc = SubgroupStreamEncoder(SubgroupHeader(ALIAS, 0, 0, 5, first_object=True))
        stream = await req.session.conn.open_uni()
        await stream.write(enc.header_bytes() + enc.object_header(0, 5) + b"early", True)
        # SUBSCRIBE_OK only once the subscriber holds the stream, waiting for its alias
        assert self.subscriber is not None
        async with asyncio.timeout(TIMEOUT):
            while ALIAS not in self.subscriber._alias_waiters:
                await asyncio.sleep(0)
        await req.accept(None, track_alias=ALIAS)


async def test_a_stream_ahead_of_its_subscribe_ok_is_delivered_when_it_arrives(
        tmp_path: Path) -> None:
    publisher = EarlyStreamPublisher()
    # The subscriber would hold such a stream far longer than this test waits: only the
    # SUBSCRIBE_OK can release it in time.
    patient = SessionConfig(alias_wait_timeout=10 * TIMEOUT)
    async with served_by(publisher, ensure_self_signed(tmp_path).certfile.parent,
                         client_config=patient) as client:
        publisher.subscriber = client
        sub = await asyncio.wait_for(client.subscribe(NS, b"x"), TIMEOUT)
        ev = await asyncio.wait_for(anext(aiter(sub)), TIMEOUT)
        assert isinstance(ev, ReceivedObject)
        assert ev.location == Location(0, 0) and bytes(ev.payload) == b"early"


class EarlyFillPublisher(SessionHandler):
    """Sends a SUBSCRIBE's whole fill stream before the SUBSCRIBE_OK that gives its Group
    Order."""

    def __init__(self) -> None:
        self.subscriber: MoqtSession | None = None

    async def subscribe(self, req: IncomingSubscribe) -> None:
        enc = FetchStreamEncoder(req.request_id, GroupOrder.ASCENDING)
        fill = enc.header_bytes() + b"".join(
            enc.object_header(0, 0, i, 5, 4) + b"obj%d" % i for i in range(3))
        stream = await req.session.conn.open_uni()
        await stream.write(fill, True)
        # SUBSCRIBE_OK only once the subscriber holds the fill stream
        assert self.subscriber is not None
        async with asyncio.timeout(TIMEOUT):
            while not any(getattr(r, "_open_streams", 0)
                          for r in self.subscriber.routes.values()):
                await asyncio.sleep(0)
        await req.accept(None, track_alias=ALIAS)


async def test_a_fill_stream_ahead_of_its_subscribe_ok_is_delivered_whole(
        tmp_path: Path) -> None:
    publisher = EarlyFillPublisher()
    async with served_by(publisher, ensure_self_signed(tmp_path).certfile.parent) as client:
        publisher.subscriber = client
        sub = await asyncio.wait_for(client.subscribe(NS, b"x", Params(
            location_filter=LocationFilter.next_object(),
            fill=Params(location_filter=LocationFilter.absolute_start(0, 0)))), TIMEOUT)
        events = []
        async with asyncio.timeout(TIMEOUT):
            async for ev in sub:
                events.append(ev)
                if isinstance(ev, StreamEnded):
                    break
        objects = [(e.location, bytes(e.payload)) for e in events[:-1]]
        assert objects == [(Location(0, i), b"obj%d" % i) for i in range(3)]
        assert events[-1].fin and events[-1].stream.source == Source.FILL
