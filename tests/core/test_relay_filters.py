"""Range filters (§6.5) on every path that serves Objects: a live subscription, its fill,
REQUEST_UPDATE, and FETCH. The relay advertises MAX_FILTER_RANGES 16, so it must evaluate
SUBGROUP_FILTER, OBJECTID_FILTER (any SetID), PRIORITY_FILTER and OBJECT_PROPERTY_FILTER,
ANDed within a SetID and ORed across SetIDs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    PushedTrack,
    Received,
    client,
    drain,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.moqt.codes import (
    GroupOrder,
    ObjectStatus,
    ParameterType,
    PublishDoneCode,
    RequestErrorCode,
)
from relay.moqt.kvp import encode_kvps
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.moqt.range_filter import Range, RangeFilter
from relay.service import RunningRelay
from relay.session import (
    MoqtSession,
    ReceivedObject,
    RequestRejected,
    Source,
    StreamEnded,
    Subscription,
)

P = ParameterType
PROP = 0x3800  # an application Property type (§12): its value is Object ID mod 3
OBJECTS = 6  # per Group: even IDs on Subgroup 0 (priority 0), odd IDs on Subgroup 5 (7)
SUBGROUP_PRIORITY = {0: 0, 5: 7}


def _subgroup(object_id: int) -> int:
    return 0 if object_id % 2 == 0 else 5


async def _group(t: PushedTrack, g: int) -> None:
    """Group g: two Subgroup streams, every Object with the Property PROP."""
    writers = {s: await t.served.open_subgroup(g, s, SUBGROUP_PRIORITY[s], properties=True)
               for s in (0, 5)}
    for i in range(OBJECTS):
        payload = os.urandom(100) + bytes([g, i])
        await writers[_subgroup(i)].write_object(
            i, payload, properties=encode_kvps([(PROP, i % 3)]))
        t.sent[Location(g, i)] = payload
    await writers[0].finish()
    await writers[5].write_status(OBJECTS, ObjectStatus.END_OF_GROUP, fin=True)


def _f(ptype: P, set_id: int, *ranges: tuple[int, int], prop: int | None = None
       ) -> RangeFilter:
    return RangeFilter(ptype, set_id, tuple(Range(a, b) for a, b in ranges), prop)


# (filters, Object IDs of each Group that pass)
CASES = {
    "priority": ((_f(P.PRIORITY_FILTER, 0, (0, 0)),), [0, 2, 4]),
    "subgroup": ((_f(P.SUBGROUP_FILTER, 0, (5, 5)),), [1, 3, 5]),
    "objectid-set1": ((_f(P.OBJECTID_FILTER, 1, (1, 2)),), [1, 2]),
    "property": ((_f(P.OBJECT_PROPERTY_FILTER, 0, (1, 1), prop=PROP),), [1, 4]),
    # SetID 0: Subgroup 0 AND IDs 0-1 -> {0}; SetID 1: priority 7 AND IDs 4-5 -> {5}; ORed
    "sets-and-or": ((_f(P.SUBGROUP_FILTER, 0, (0, 0)), _f(P.OBJECTID_FILTER, 0, (0, 1)),
                     _f(P.PRIORITY_FILTER, 1, (7, 7)), _f(P.OBJECTID_FILTER, 1, (4, 5))),
                    [0, 5]),
}


async def _fill_and_live(r: RunningRelay, name: FullTrackName, params: Params
                         ) -> tuple[MoqtSession, PushedTrack, Received]:
    """Group 0 cached, then a SUBSCRIBE with ``params`` (its fill serves Group 0 from
    cache), then Group 1 forwarded live and the Track's end; what the subscriber got."""
    pub = await client(r)
    t = await push_track(pub, name, layers=2)
    await _group(t, 0)
    await wait_cached(r, name, Location(0, OBJECTS))
    c = await client(r)
    sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, params), TIMEOUT)
    await _group(t, 1)
    await t.end()
    async with asyncio.timeout(TIMEOUT):
        return c, t, await drain(sub)


def _expected(t: PushedTrack, groups: range, ids: list[int]) -> dict[Location, bytes]:
    return {Location(g, i): t.sent[Location(g, i)] for g in groups for i in ids}


@pytest.mark.parametrize("case", list(CASES))
async def test_range_filters_on_fetch_fill_and_live(tmp_path: Path, case: str) -> None:
    filters, ids = CASES[case]
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        # the subscription's filters apply to its fill and to the live part
        c, t, got = await _fill_and_live(r, name, Params(
            location_filter=LocationFilter.next_object(),
            fill=Params(location_filter=LocationFilter.absolute_start(0, 0)),
            range_filters=filters))
        assert got.objects == _expected(t, range(2), ids)
        assert got.duplicates == []

        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
            range_filters=filters)), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            fetched = {e.location: bytes(e.payload) for e in await resp.collect()}
        assert fetched == _expected(t, range(2), ids)
    finally:
        await r.close()


async def test_fill_filters_replace_the_subscriptions_per_type(tmp_path: Path) -> None:
    """FILL_PARAMETERS' own SUBGROUP_FILTER replaces the subscription's for the fill only;
    the PRIORITY_FILTER it does not carry is inherited (§6.4)."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        _, t, got = await _fill_and_live(r, name, Params(
            location_filter=LocationFilter.next_object(),
            fill=Params(location_filter=LocationFilter.absolute_start(0, 0),
                        range_filters=(_f(P.SUBGROUP_FILTER, 0, (0, 0)),)),
            range_filters=(_f(P.SUBGROUP_FILTER, 0, (5, 5)),
                           _f(P.OBJECTID_FILTER, 0, (0, 3)))))
        assert got.objects == {**_expected(t, range(0, 1), [0, 2]),
                               **_expected(t, range(1, 2), [1, 3])}
    finally:
        await r.close()


async def test_request_update_replaces_and_removes_filters(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=3)
        c = await client(r)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.next_object(),
            range_filters=(_f(P.SUBGROUP_FILTER, 0, (5, 5)),))), TIMEOUT)
        await _group(t, 0)
        await wait_cached(r, name, Location(0, OBJECTS))
        # a new filter of the same type replaces the old one
        await asyncio.wait_for(sub.update(Params(range_filters=(
            _f(P.SUBGROUP_FILTER, 0, (0, 0)),))), TIMEOUT)
        await _group(t, 1)
        await wait_cached(r, name, Location(1, OBJECTS))
        # a zero-length value removes the filter type
        await asyncio.wait_for(sub.update(Params(range_filters=(
            RangeFilter.clear(P.SUBGROUP_FILTER),))), TIMEOUT)
        await _group(t, 2)
        await t.end()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        assert got.objects == {**_expected(t, range(0, 1), [1, 3, 5]),
                               **_expected(t, range(1, 2), [0, 2, 4]),
                               **_expected(t, range(2, 3), list(range(OBJECTS)))}
    finally:
        await r.close()


async def test_a_failed_request_update_ends_the_subscription(tmp_path: Path) -> None:
    """Too many Ranges after an update: REQUEST_ERROR INVALID_FILTER, and the publisher
    also ends the subscription with PUBLISH_DONE UPDATE_FAILED (§7.5); the relay forwards
    nothing more to it, and its other subscriber on the session goes on."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=3)
        c = await client(r)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.next_object())), TIMEOUT)
        other = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.next_object())), TIMEOUT)
        await _group(t, 0)
        await wait_cached(r, name, Location(0, OBJECTS))
        with pytest.raises(RequestRejected) as refused:
            await asyncio.wait_for(sub.update(Params(range_filters=(
                RangeFilter(P.OBJECTID_FILTER, 0, tuple(Range(2 * i, 2 * i)
                                                        for i in range(17))),))), TIMEOUT)
        assert refused.value.code == RequestErrorCode.INVALID_FILTER
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        assert got.done is not None and got.done.status == PublishDoneCode.UPDATE_FAILED
        assert len(r.relay.tracks[name].forwarders) == 1  # only the other subscription's
        await _group(t, 1)
        await t.end()
        async with asyncio.timeout(TIMEOUT):
            rest = await drain(other)
        assert rest.objects.keys() >= set(_expected(t, range(0, 2), list(range(OBJECTS))))
    finally:
        await r.close()


async def test_a_request_update_counts_its_fills_ranges_with_the_subscriptions(
        tmp_path: Path) -> None:
    """MAX_FILTER_RANGES (16) counts the subscription's Ranges after an update plus its
    fill's (§6.4, §6.5): 10 + 7 is refused INVALID_FILTER though each is within it."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=1)
        await _group(t, 0)
        await wait_cached(r, name, Location(0, OBJECTS))
        c = await client(r)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.next_object(),
            range_filters=(_f(P.OBJECTID_FILTER, 0, *((2 * i, 2 * i) for i in range(10))),))),
            TIMEOUT)
        with pytest.raises(RequestRejected) as refused:
            await asyncio.wait_for(sub.update(Params(fill=Params(
                location_filter=LocationFilter.absolute_start(0, 0),
                range_filters=(_f(P.SUBGROUP_FILTER, 0, *((i, i) for i in range(7))),)))),
                TIMEOUT)
        assert refused.value.code == RequestErrorCode.INVALID_FILTER
    finally:
        await r.close()


async def test_a_request_update_moves_the_live_window(tmp_path: Path) -> None:
    """A new Location filter in REQUEST_UPDATE moves the subscription's window (§7.5),
    resolved against the Largest Object at the update: Relative Start 0 begins at the next
    Group (the rest of the current one is not forwarded); an Absolute Range starts inside a
    later Group and ends at its End of Group."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=4)
        c = await client(r)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_start(0, 0))), TIMEOUT)
        w = await t.served.open_subgroup(0, 0, 0)
        for i in range(3):
            await w.write_object(i, bytes([0, i]))
        await wait_cached(r, name, Location(0, 2))
        await asyncio.wait_for(sub.update(Params(
            location_filter=LocationFilter.relative_start(0))), TIMEOUT)
        for i in range(3, 6):
            await w.write_object(i, bytes([0, i]))
        await w.write_status(6, ObjectStatus.END_OF_GROUP, fin=True)
        await t.group(1, [bytes([1, i]) for i in range(6)])
        await wait_cached(r, name, Location(1, 6))
        await asyncio.wait_for(sub.update(Params(location_filter=LocationFilter.absolute_range(
            Location(2, 2), Location(2, 6)))), TIMEOUT)
        for g in (2, 3):
            await t.group(g, [bytes([g, i]) for i in range(6)])
        await t.end()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        assert sorted(got.objects) == [Location(0, i) for i in range(3)] + \
            [Location(1, i) for i in range(6)] + [Location(2, i) for i in range(2, 6)]
    finally:
        await r.close()


async def _fill_of(sub: Subscription) -> list[Location]:
    """The Objects of the subscription's next fill stream, in the order they came."""
    got: list[Location] = []
    async with asyncio.timeout(TIMEOUT):
        async for ev in sub:
            if isinstance(ev, ReceivedObject) and ev.stream.source is Source.FILL:
                got.append(ev.location)
            elif isinstance(ev, StreamEnded) and ev.stream.source is Source.FILL:
                assert ev.fin
                return got
    raise AssertionError("the subscription ended before its fill")


async def test_a_request_updates_fill_inherits_what_it_does_not_give(tmp_path: Path) -> None:
    """A fill asked with REQUEST_UPDATE takes from the subscription what its
    FILL_PARAMETERS leave out (§6.4): the Location filter (from {1,0}), the Group Order
    (Descending) and the Range filters (Subgroup 5: odd IDs). Its own GROUP_ORDER replaces
    the subscription's, and its stream carries the update's Request ID, by which the
    subscriber knows the order to decode it with (§9.1, §9.4)."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=4)
        for g in range(3):
            await _group(t, g)
        await wait_cached(r, name, Location(2, OBJECTS))
        c = await client(r)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_start(1, 0),
            group_order=GroupOrder.DESCENDING,
            range_filters=(_f(P.SUBGROUP_FILTER, 0, (5, 5)),))), TIMEOUT)
        odd = [1, 3, 5]
        await asyncio.wait_for(sub.update(Params(fill=Params())), TIMEOUT)
        assert await _fill_of(sub) == [Location(g, i) for g in (2, 1) for i in odd]
        await asyncio.wait_for(sub.update(Params(fill=Params(
            group_order=GroupOrder.ASCENDING))), TIMEOUT)
        assert await _fill_of(sub) == [Location(g, i) for g in (1, 2) for i in odd]
        await t.end()
        async with asyncio.timeout(TIMEOUT):
            rest = await drain(sub)
        assert rest.objects == {} and rest.done is not None
    finally:
        await r.close()
