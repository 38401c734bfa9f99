"""FETCH from the relay's cache: Range-filter limits, unknown ranges reported with End of Range
markers, and concurrent upstream misses coalesced into one upstream FETCH (§14.6, §14.7)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    client,
    fetch_objects,
    group_payloads,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.moqt.codes import EndOfRangeType, ParameterType, RequestErrorCode
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.moqt.range_filter import Range, RangeFilter
from relay.session import IncomingFetch, RangeMarker, RequestRejected, SessionHandler
from storage.interface import OBJECT_MAX


async def test_objectid_filter_limit_is_enforced(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=1)
        await t.group(0, group_payloads(0, 40, size=100))
        c = await client(r)
        assert c.peer_max_filter_ranges == 16
        ranges = tuple(Range(2 * i, 2 * i) for i in range(17))
        try:
            await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
                range_filters=(RangeFilter(ParameterType.OBJECTID_FILTER, 0, ranges),))),
                TIMEOUT)
        except RequestRejected as e:
            assert e.code == RequestErrorCode.INVALID_FILTER
        else:
            raise AssertionError("17 ranges accepted with MAX_FILTER_RANGES 16")
        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
            range_filters=(RangeFilter(ParameterType.OBJECTID_FILTER, 0, ranges[:16]),))),
            TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            got = [e.location for e in await resp.collect()]
        assert got == [Location(0, 2 * i) for i in range(16)]
    finally:
        await r.close()


@pytest.mark.parametrize(("fill_timeout_ms", "kind"), [
    # time to spare: nobody can say what the evicted Groups held -> End of Unknown Range
    (int(TIMEOUT * 1000), EndOfRangeType.UNKNOWN),
    # no time at all: the relay gave up for lack of time -> End of Timed-Out Range
    (0, EndOfRangeType.TIMED_OUT),
], ids=["unknown", "timed-out"])
async def test_evicted_groups_are_reported_unknown_never_skipped(
        tmp_path: Path, fill_timeout_ms: int, kind: EndOfRangeType) -> None:
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=5)
        for g in range(5):
            await t.group(g, group_payloads(g, 3))
        await wait_cached(r, name, Location(4, 3))
        await pub.aclose()  # no upstream left to ask
        track = r.relay.tracks[name]
        assert r.store.memory.discard_group(track.key, 1)
        assert r.store.memory.discard_group(track.key, 3)
        c = await client(r)
        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_start(0, 0), fill_timeout=fill_timeout_ms)),
            TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            events = await resp.collect()
        got = [(e.type, e.end) if isinstance(e, RangeMarker) else e.location for e in events]
        # each marker covers exactly its evicted Group: from the previous element up to the
        # Group's last possible Object, nothing of the Groups around it
        assert got == [
            *(Location(0, i) for i in range(3)), (kind, Location(1, OBJECT_MAX)),
            *(Location(2, i) for i in range(3)), (kind, Location(3, OBJECT_MAX)),
            *(Location(4, i) for i in range(3))]
    finally:
        await r.close()


async def test_concurrent_misses_share_one_upstream_fetch(tmp_path: Path) -> None:
    a = await relay_at(tmp_path / "a")
    b = await relay_at(tmp_path / "b", upstream=[a.url])
    name = FullTrackName(make_ns(), b"v.raw.s0")
    try:
        pub = await client(a)
        t = await push_track(pub, name, layers=2)
        for g in range(2):
            await t.group(g, group_payloads(g, 4))
        await t.end()
        assert await a.relay.wait_committed(name, TIMEOUT)
        await pub.aclose()
        clients = [await client(b) for _ in range(5)]
        resps = await asyncio.wait_for(asyncio.gather(
            *(c.fetch(name.namespace, name.name) for c in clients)), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            results = await asyncio.gather(*(x.collect() for x in resps))
        for events in results:
            assert {e.location: bytes(e.payload) for e in events} == t.sent
        assert b.relay.counters.get("upstream_fetches") == 1
        assert a.relay.counters.get("fetches") == 1
    finally:
        await b.close()
        await a.close()


async def test_fetch_of_a_whole_group_ends_at_its_last_known_location(tmp_path: Path) -> None:
    """FETCH with "all of Group G" (filter 0x03) reports the last Location known in G
    (§7.10), never {G, 2^64-1}: the End of Group a FINed END_OF_GROUP stream implies (a
    publisher that ends Groups without a status Object, as moq-rs does), else the last
    Object held of G."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=3)
        payloads = {g: group_payloads(g, 3, size=200) for g in range(3)}
        for g, flag in ((0, True), (1, False), (2, True)):
            w = await t.served.open_subgroup(g, 0, 0, end_of_group=flag)
            for i, p in enumerate(payloads[g]):
                await w.write_object(i, p, fin=i == 2)
        await wait_cached(r, name, Location(2, 3))  # Group 2's implied End of Group
        c = await client(r)
        for g, end in ((0, Location(0, 3)), (1, Location(1, 2))):
            resp, got = await fetch_objects(c, name, Params(
                location_filter=LocationFilter.absolute_group_end(g, 0, g)))
            assert resp.end_location == end
            assert got == {Location(g, i): p for i, p in enumerate(payloads[g])}
        # the implied End of Group is only cached: nothing was sent live for it
        assert r.store.group_end(r.relay.tracks[name].key, 0) == 3
        assert r.store.group_end(r.relay.tracks[name].key, 1) is None
    finally:
        await r.close()


class _GroupEndFetchPublisher(SessionHandler):
    """An upstream that answers FETCH of "all of Group G" with End Location {G, 2^64-1}
    (the pre-draft-20 habit), then Objects 0..2 of G and FIN."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads

    async def fetch(self, req: IncomingFetch) -> None:
        g = req.params.location_filter.start_group  # type: ignore[union-attr]
        w = await req.accept(False, Location(g, OBJECT_MAX))
        for i, p in enumerate(self.payloads):
            await w.write_object(g, 0, i, 0, p)
        await w.finish()


async def test_an_upstream_end_location_of_a_whole_group_is_no_largest_object(
        tmp_path: Path) -> None:
    """A lower relay must not take an upstream FETCH_OK End Location {G, 2^64-1} for the
    Largest Object: it would report it (TRACK_STATUS, SUBSCRIBE_OK) and answer FETCHes up
    to it, asking upstream again and again for a tail that holds no Object."""
    b = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    payloads = group_payloads(4, 3, size=200)
    try:
        up = await client(b, handler=_GroupEndFetchPublisher(payloads))
        await asyncio.wait_for(up.publish_namespace(name.namespace), TIMEOUT)
        c = await client(b)
        whole_group = Params(location_filter=LocationFilter.absolute_group_end(4, 0, 4))
        for _ in range(2):
            resp, got = await fetch_objects(c, name, whole_group)
            assert resp.end_location == Location(4, 2)
            assert got == {Location(4, i): p for i, p in enumerate(payloads)}
        # the second FETCH was served from cache: the first one's FIN proved the rest absent
        assert b.relay.counters.get("upstream_fetches") == 1
        status = await asyncio.wait_for(c.track_status(name.namespace, name.name), TIMEOUT)
        assert status.params.largest_object == Location(4, 2)
    finally:
        await b.close()
