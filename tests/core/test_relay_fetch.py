"""FETCH from the relay's cache: Range-filter limits, unknown ranges reported with End of Range
markers, and concurrent upstream misses coalesced into one upstream FETCH (§14.6, §14.7)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    client,
    drain,
    fetch_objects,
    fill_objects,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.moqt.codes import (
    EndOfRangeType,
    GroupOrder,
    LocationFilterType,
    ObjectStatus,
    ParameterType,
    PropertyType,
    RequestErrorCode,
)
from relay.moqt.kvp import KeyValuePair
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.moqt.range_filter import Range, RangeFilter
from relay.options import RelayOptions
from relay.service import RunningRelay
from relay.session import (
    FetchResponse,
    IncomingFetch,
    MoqtSession,
    RangeMarker,
    ReceivedObject,
    RequestRejected,
    SessionConfig,
    SessionHandler,
    Source,
    StreamAborted,
    StreamEnded,
    Subscription,
)
from relay.session.events import FetchEvent
from relay.transport import QuicSettings, StreamReset
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
        assert b.relay.counters.upstream_fetches == 1
        assert a.relay.counters.ok("FETCH") == 1
    finally:
        await b.close()
        await a.close()


class _SilentFetchPublisher(SessionHandler):
    """An upstream that never answers FETCH, and notes one asked and one cancelled."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def fetch(self, req: IncomingFetch) -> None:
        self.asked.set()
        try:
            while await req.rs.recv() is not None:
                continue  # nothing else comes on a FETCH's request stream
        except StreamReset:
            self.cancelled.set()


async def test_a_shared_upstream_fetch_cut_short_is_no_absence(tmp_path: Path) -> None:
    """Two misses share one upstream FETCH, bounded by the first one's FILL_TIMEOUT (which
    it carries upstream). That runs out before the source answers: the upstream FETCH is
    cancelled at the source (left open, its fetch stream would hold receive credit for
    good), and the second request learns that the Track is unknown (TIMEOUT), not that it
    does not exist."""
    b = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    up = _SilentFetchPublisher()
    try:
        pub = await client(b, handler=up)
        await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
        short, long = await client(b), await client(b)
        first = asyncio.ensure_future(
            short.fetch(name.namespace, name.name, Params(fill_timeout=300)))
        # the short one's FETCH is the shared one: the second, on another connection, must
        # not overtake it (it would carry its own 10 s upstream, the short one joining it)
        await asyncio.wait_for(up.asked.wait(), TIMEOUT)
        loop = asyncio.get_running_loop()
        started = loop.time()
        second = asyncio.ensure_future(
            long.fetch(name.namespace, name.name, Params(fill_timeout=10_000)))
        for ask in (first, second):
            with pytest.raises(RequestRejected) as refused:
                await asyncio.wait_for(ask, TIMEOUT)
            assert refused.value.code == RequestErrorCode.TIMEOUT
        # answered at the shared FETCH's end, not at its own FILL_TIMEOUT
        assert loop.time() - started < 5.0
        await asyncio.wait_for(up.cancelled.wait(), TIMEOUT)
        assert b.relay.counters.upstream_fetches == 0  # one FETCH, never answered
    finally:
        await b.close()


async def test_a_fetch_past_what_a_relay_holds_of_a_track_it_does_not_follow(
        tmp_path: Path) -> None:
    """Relay b learned a Track only by FETCH from a (it does not follow it live): b's Largest
    Object is a lower bound. A FETCH starting past it asks a again (pull-through); one
    starting at it does not; a range past it is answered up to it, and a Location filter
    of type None is the whole Track (no End of Track: none is known), in the FETCH's Group
    Order."""
    a = await relay_at(tmp_path / "a")
    b = await relay_at(tmp_path / "b", upstream=[a.url])
    name = FullTrackName(make_ns(), b"k.raw.s0")
    lf = LocationFilter
    try:
        pub = await client(a)
        t = await push_track(pub, name, layers=4)
        for g in range(2):
            await t.group(g, group_payloads(g, 3, size=100))
        await wait_cached(a, name, Location(1, 3))
        c = await client(b)
        _, got = await fetch_objects(c, name, Params(
            location_filter=lf.absolute_range(Location(0, 0), Location(1, 3))))
        assert got == t.sent and b.relay.counters.upstream_fetches == 1
        assert not b.relay.tracks[name].live
        resp, got = await fetch_objects(c, name, Params(location_filter=lf.absolute_start(1, 3)))
        assert resp.end_location == Location(1, 3) and got == {}
        assert b.relay.counters.upstream_fetches == 1  # L itself is held: nothing asked
        await t.group(2, group_payloads(2, 3, size=100))
        await wait_cached(a, name, Location(2, 3))
        resp, got = await fetch_objects(c, name, Params(location_filter=lf.absolute_start(2, 0)))
        assert got == {loc: p for loc, p in t.sent.items() if loc.group == 2}
        assert b.relay.counters.upstream_fetches == 2
        resp, got = await fetch_objects(c, name, Params(
            location_filter=lf.absolute_range(Location(0, 0), Location(9, 0))))
        assert resp.end_location == Location(2, 3) and got == t.sent
        resp, got = await fetch_objects(c, name, Params(location_filter=lf.none()))
        assert resp.end_location == Location(2, 3) and got == t.sent
        assert not resp.end_of_track  # the Track goes on: no End of Track is known
        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
            group_order=GroupOrder.DESCENDING)), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            events = await resp.collect()
        assert [e.location for e in events] == \
            [Location(g, i) for g in (2, 1, 0) for i in range(3)]  # Groups in its order
    finally:
        await b.close()
        await a.close()


async def test_fetch_of_a_whole_group_ends_at_its_last_known_location(tmp_path: Path) -> None:
    """FETCH with "all of Group G" (filter 0x03) reports the last Location known in G
    (§7.10), never {G, 2^64-1}: the End of Group a FINed END_OF_GROUP stream implies (a
    publisher that ends Groups without a status Object, as moq-rs does), else the last
    Object held of G. An implied End of Group at or past a known End of Track is not
    cached (it would contradict it)."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=5)
        payloads = {g: group_payloads(g, 3, size=200) for g in (0, 1, 4)}
        payloads[2] = group_payloads(2, 1, size=200)  # one Object, not the Group's end
        payloads[3] = []  # nothing of Group 3 ever reaches the relay
        # End of Track first, on its own stream, right after Group 4's last Object
        w = await t.served.open_subgroup(4, 1, 0)
        await w.write_status(3, ObjectStatus.END_OF_TRACK, fin=True)
        await wait_cached(r, name, Location(4, 3))
        c = await client(r)
        # a live subscriber sees a stream's FIN only after the relay took it in
        live = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_start(0, 0))), TIMEOUT)
        for g, flag in ((0, True), (1, False), (2, False), (4, True)):
            w = await t.served.open_subgroup(g, 0, 0, end_of_group=flag)
            for i, p in enumerate(payloads[g]):
                await w.write_object(i, p, fin=i == len(payloads[g]) - 1)
        ended: set[int] = set()
        async with asyncio.timeout(TIMEOUT):
            async for ev in live:
                if isinstance(ev, StreamEnded) and ev.fin and ev.stream.header is not None:
                    ended.add(ev.stream.header.group_id)
                    if ended == {0, 1, 2, 4}:
                        break
        live.cancel()
        track = r.relay.tracks[name]
        for g, end in ((0, Location(0, 3)), (1, Location(1, 2)), (2, Location(2, 0))):
            resp, got = await fetch_objects(c, name, Params(
                location_filter=LocationFilter.absolute_group_end(g, 0, g)))
            assert resp.end_location == end
            assert got == {Location(g, i): p for i, p in enumerate(payloads[g])}
        # the implied End of Group is only cached: nothing was sent live for it
        assert r.store.group_end(track.key, 0) == 3
        assert r.store.group_end(track.key, 1) is None
        # Group 4's implied end is the End of Track's Location: not cached again
        resp, got = await fetch_objects(c, name, Params(
            location_filter=LocationFilter.absolute_group_end(4, 0, 4)))
        assert got == {Location(4, i): p for i, p in enumerate(payloads[4])}
        assert r.store.group_end(track.key, 4) is None and not track.malformed
        assert track.upstreams  # and the relay is still taking in the Track
        # nothing known of Group 3, and the publisher cannot say: reported unknown
        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_group_end(3, 0, 3))), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            events = await resp.collect()
        assert [(e.type, e.end) for e in events if isinstance(e, RangeMarker)] == \
            [(EndOfRangeType.UNKNOWN, Location(3, OBJECT_MAX))] and len(events) == 1
    finally:
        await r.close()


async def test_a_track_whose_groups_end_with_a_fin_commits(tmp_path: Path) -> None:
    """Every Group ended by a FINed END_OF_GROUP stream and an End of Track: the Track is
    complete, is committed to LMDB and is served from it after a restart."""
    name = FullTrackName(make_ns(), b"k.raw.s0")
    payloads = {g: group_payloads(g, 2, size=200) for g in range(2)}
    r = await relay_at(tmp_path)
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=2)
        for g in range(2):
            w = await t.served.open_subgroup(g, 0, 7, end_of_group=True)
            for i, p in enumerate(payloads[g]):
                await w.write_object(i, p, fin=i == 1)
        await t.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
    finally:
        await r.close()
    r = await relay_at(tmp_path)
    try:
        c = await client(r)
        for g in range(2):
            resp, got = await fetch_objects(c, name, Params(
                location_filter=LocationFilter.absolute_group_end(g, 0, g)))
            assert resp.end_location == Location(g, 2)
            assert got == {Location(g, i): p for i, p in enumerate(payloads[g])}
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
        assert b.relay.counters.upstream_fetches == 1
        status = await asyncio.wait_for(c.track_status(name.namespace, name.name), TIMEOUT)
        assert status.params.largest_object == Location(4, 2)
    finally:
        await b.close()


class _MarkingFetchPublisher(SessionHandler):
    """An upstream whose first FETCH answer mixes Objects and End of Range markers (§11.7),
    and which answers every later FETCH with one End of Unknown Range over all of it, but
    once it ``learned_group_2``, a range ending at {2,6}: unknown up to Group 2, nothing
    there in {2,0}..{2,6}. It records the range of every FETCH it gets, to show what the
    relay below asks again."""

    def __init__(self) -> None:
        self.asked: list[tuple[Location, Location]] = []
        self.learned_group_2 = False

    async def fetch(self, req: IncomingFetch) -> None:
        lf = req.params.location_filter
        assert lf is not None
        start = Location(lf.start_group, lf.start_object)
        end = Location(lf.end_group, lf.end_object) \
            if lf.type == LocationFilterType.ABSOLUTE_RANGE else \
            Location(lf.end_group, OBJECT_MAX)  # "all of Group"
        assert lf.type in (LocationFilterType.ABSOLUTE_RANGE,
                           LocationFilterType.ABSOLUTE_START_GROUP_END)
        self.asked.append((start, end))
        w = await req.accept(False, end)
        if len(self.asked) == 1:
            # a marker always ends in another Group than the element before it (§11.7)
            await w.write_object(0, 0, 0, 0, b"a")
            await w.write_marker(EndOfRangeType.NON_EXISTENT, 1, 3)  # {0,1}..{1,3}
            await w.write_marker(EndOfRangeType.UNKNOWN, 2, 6)  # {1,4}..{2,6}
            await w.write_marker(EndOfRangeType.NON_EXISTENT, 3, OBJECT_MAX)  # {2,7}..
            await w.write_marker(EndOfRangeType.UNKNOWN, 4, 0)  # exactly {4,0}
            await w.write_marker(EndOfRangeType.TIMED_OUT, 5, 2)  # {4,1}..{5,2}
            await w.write_object(6, 0, 4, 0, b"b")  # {5,3}..{6,3} do not exist
            await w.write_marker(EndOfRangeType.NON_EXISTENT, 7, 0)  # {6,5}..{7,0}
            await w.write_marker(EndOfRangeType.UNKNOWN, 8, 3)  # {7,1}..{8,3}
        elif self.learned_group_2 and end == Location(2, 6):
            if start.group < 2:
                await w.write_marker(EndOfRangeType.UNKNOWN, 1, OBJECT_MAX)
        else:
            await w.write_marker(EndOfRangeType.UNKNOWN, end.group, end.object)
        await w.finish()  # (what it skipped, {2,0}..{2,6}, is not there)


async def test_ranges_an_upstream_marked_unknown_are_asked_again_the_rest_is_known(
        tmp_path: Path) -> None:
    """After an upstream FETCH ends with FIN, the Locations it skipped do not exist (§10),
    except those its Unknown and Timed-Out markers covered: those stay unknown and are asked
    upstream again (§14.9), each exactly as wide as the marker said, while a FETCH of the
    known-absent ones is answered from the cache."""
    b = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    up = _MarkingFetchPublisher()
    try:
        pub = await client(b, handler=up)
        await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
        c = await client(b)

        async def fetch(start: Location, end: Location
                        ) -> tuple[dict[Location, bytes], list[tuple[int, Location]]]:
            resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
                location_filter=LocationFilter.absolute_range(start, end))), TIMEOUT)
            async with asyncio.timeout(TIMEOUT):
                events = await resp.collect()
            return ({e.location: bytes(e.payload) for e in events
                     if not isinstance(e, RangeMarker)},
                    [(e.type, e.end) for e in events if isinstance(e, RangeMarker)])

        got, marks = await fetch(Location(0, 0), Location(8, 5))
        assert got == {Location(0, 0): b"a", Location(6, 4): b"b"}
        assert up.asked[0] == (Location(0, 0), Location(8, 5))
        # serving it, the relay asked once more for each run of unknown ranges the cache
        # holds no Object between, from where it starts to where it ends (one FETCH across
        # Groups, not one per Group; a known-absent range inside is only confirmed)
        assert up.asked[1:] == [(Location(1, 4), Location(5, 2)),
                                (Location(7, 1), Location(8, 3))]
        assert [m[1].group for m in marks] == [1, 2, 4, 5, 7, 8]
        asked = len(up.asked)
        known_absent = [(Location(0, 1), Location(1, 3)), (Location(2, 7), Location(3, 9)),
                        (Location(3, OBJECT_MAX), Location(3, OBJECT_MAX)),
                        (Location(5, 3), Location(6, 3)), (Location(6, 5), Location(7, 0)),
                        (Location(8, 4), Location(8, 5))]
        for start, end in known_absent:
            got, marks = await fetch(start, end)
            assert got == {} and marks == [] and len(up.asked) == asked, (start, end, up.asked)
        # the unknown ranges, asked again from exactly where they start (also when the FETCH
        # starts on a known-absent Location before them), each once across its Groups
        whole = OBJECT_MAX
        up.learned_group_2 = True
        unknown = [
            (Location(1, 0), Location(2, 6), [(Location(1, 4), Location(2, 6))],
             Location(1, whole)),  # {2,0}..{2,6}: now known not to exist
            (Location(4, 0), Location(4, 0), [(Location(4, 0), Location(4, 0))],
             Location(4, 0)),
            (Location(4, 1), Location(5, 2), [(Location(4, 1), Location(5, 2))],
             Location(5, 2)),
            (Location(7, 0), Location(8, 3), [(Location(7, 1), Location(8, 3))],
             Location(8, 3)),
        ]
        for start, end, asks, last_marker in unknown:
            _, marks = await fetch(start, end)
            assert marks[-1] == (EndOfRangeType.UNKNOWN, last_marker)
            assert up.asked[asked:] == asks, up.asked
            asked = len(up.asked)
        # what two answers proved absent together ({2,0}..{2,6}, then {2,7}.. from the
        # first) is known absent as a whole: nothing asked, nothing reported
        got, marks = await fetch(Location(2, 0), Location(2, 9))
        assert got == {} and marks == [] and len(up.asked) == asked
        # each request's own lookups upstream, counted for the operator
        assert b.relay.counters.fetch.upstream_lookups == len(up.asked) - 1
    finally:
        await b.close()


class _BulkFetchPublisher(SessionHandler):
    """An upstream that answers every FETCH with all it has in the range: Groups 0..5 of two
    8 KiB Objects each. For "all of Group G" its End Location is G's last Object."""

    def __init__(self) -> None:
        self.payloads = {Location(g, i): bytes([g * 2 + i]) * 8192
                         for g in range(6) for i in range(2)}

    async def fetch(self, req: IncomingFetch) -> None:
        lf = req.params.location_filter
        assert lf is not None and lf.type in (LocationFilterType.ABSOLUTE_RANGE,
                                              LocationFilterType.ABSOLUTE_START_GROUP_END)
        start = Location(lf.start_group, lf.start_object)
        whole = lf.type == LocationFilterType.ABSOLUTE_START_GROUP_END
        end = Location(lf.end_group, 1 if whole else lf.end_object)
        w = await req.accept(False, min(end, Location(5, 1)))
        for loc, p in sorted(self.payloads.items()):
            if start <= loc <= end:
                await w.write_object(loc.group, 0, loc.object, 0, p)
        await w.finish()


async def test_a_whole_group_learned_upstream_or_started_past_its_end_is_no_group_end(
        tmp_path: Path) -> None:
    """FETCH of "all of Group G" (§7.10) never answers {G, 2^64-1}: a Group the relay holds
    nothing of is asked upstream first and its End Location is the last Object that
    brought; one whose End of Group is cached and that starts past it ends at its start
    (nothing asked upstream)."""
    b = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    up = _BulkFetchPublisher()
    try:
        pub = await client(b, handler=up)
        t = await push_track(pub, name, layers=6)
        for g in (4, 5):  # live: Groups 4 and 5 only, each with its End of Group at {g, 2}
            await t.group(g, [up.payloads[Location(g, i)] for i in range(2)])
        await wait_cached(b, name, Location(5, 2))
        c = await client(b)
        resp, got = await fetch_objects(c, name, Params(
            location_filter=LocationFilter.absolute_group_end(1, 0, 1)))
        assert resp.end_location == Location(1, 1)
        assert got == {loc: p for loc, p in up.payloads.items() if loc.group == 1}
        fetches = b.relay.counters.upstream_fetches
        resp, got = await fetch_objects(c, name, Params(
            location_filter=LocationFilter.absolute_group_end(4, 3, 4)))
        assert resp.end_location == Location(4, 3) and got == {}
        assert b.relay.counters.upstream_fetches == fetches
    finally:
        await b.close()


async def test_objects_an_upstream_fetch_brought_and_the_cache_evicted_are_not_absent(
        tmp_path: Path) -> None:
    """A memory tier too small for what an upstream FETCH brings evicts its Objects as they
    come. The FIN says only what the upstream skipped does not exist: what it sent and the
    relay evicted is unknown (§14.9), so it is asked for again or reported with a marker,
    never left out of the answer as if it did not exist."""
    b = await relay_at(tmp_path, memory_bytes=20 << 10)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    up = _BulkFetchPublisher()
    try:
        pub = await client(b, handler=up)
        await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
        c = await client(b)
        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_range(Location(0, 0), Location(5, 1)))),
            TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            events = await resp.collect()
        got = {e.location: bytes(e.payload) for e in events if not isinstance(e, RangeMarker)}
        assert b.relay.store.memory.stats()["evicted_groups"] > 0
        for loc, p in up.payloads.items():  # each one delivered, or its group marked unknown
            assert got.get(loc) == p or any(
                isinstance(e, RangeMarker) and e.end.group == loc.group for e in events), loc
    finally:
        await b.close()


async def test_a_fill_is_served_in_its_effective_group_order(tmp_path: Path) -> None:
    """A fill's Group Order (§9.4) is its own GROUP_ORDER, else the subscription's, else the
    Track's DEFAULT_PUBLISHER_GROUP_ORDER, else Ascending: the order the subscriber decodes
    the fill's Group deltas with. Another Track Property whose value happens to be a Group
    Order decides nothing."""
    asc, desc = GroupOrder.ASCENDING, GroupOrder.DESCENDING
    r = await relay_at(tmp_path)
    properties = {  # the Track's default order, by its Properties
        desc: (KeyValuePair(PropertyType.DEFAULT_PUBLISHER_GROUP_ORDER, 2),),
        asc: (KeyValuePair(PropertyType.DEFAULT_PUBLISHER_PRIORITY, 2),)}
    cases = [  # (the Track's default, the subscription's order, the fill's, the effective)
        (desc, None, None, desc), (desc, asc, None, asc), (desc, None, asc, asc),
        (asc, None, None, asc), (asc, desc, None, desc), (asc, None, desc, desc),
        (asc, desc, asc, asc)]
    try:
        pub = await client(r)
        names = {}
        for default, props in properties.items():
            name = FullTrackName(make_ns(), b"k.raw.s0")
            t = await push_track(pub, name, layers=3, properties=props)
            for g in range(3):
                await t.group(g, group_payloads(g, 2, size=100))
            await t.end()
            assert await r.relay.wait_committed(name, TIMEOUT)
            names[default] = (name, t.sent)
        c = await client(r)
        for default, sub_order, fill_order, effective in cases:
            name, sent = names[default]
            sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
                location_filter=LocationFilter.next_object(), group_order=sub_order,
                fill=Params(location_filter=LocationFilter.absolute_start(0, 0),
                            group_order=fill_order))), TIMEOUT)
            async with asyncio.timeout(TIMEOUT):
                got = await drain(sub)
            groups = [2, 1, 0] if effective == desc else [0, 1, 2]
            assert list(got.objects) == [Location(g, i) for g in groups for i in range(2)], \
                (default, sub_order, fill_order)
            assert got.objects == sent
    finally:
        await r.close()


async def test_a_fill_ending_at_an_end_of_group_ends_that_group_on_the_live_path(
        tmp_path: Path) -> None:
    """L is Group 0's End of Group: the fill delivers Group 0 but cannot carry that status
    (§11.4), and the live part starts after L. The live path says the Group is over with an
    empty subgroup stream flagged END_OF_GROUP (Forwarder.announce_group_end)."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=2)
        await t.group(0, group_payloads(0, 3, size=100))
        await wait_cached(r, name, Location(0, 3))
        c = await client(r)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, live_params()),
                                     TIMEOUT)
        assert sub.largest == Location(0, 3)
        await t.group(1, group_payloads(1, 3, size=100))
        await t.end()
        live_objects: dict[int, list[int]] = {}
        group_ends: list[int] = []
        async with asyncio.timeout(TIMEOUT):
            async for ev in sub:
                if isinstance(ev, ReceivedObject) and ev.stream.header is not None:
                    live_objects.setdefault(ev.group, []).append(ev.object_id)
                elif isinstance(ev, StreamEnded) and ev.fin and ev.stream.header is not None \
                        and ev.stream.header.end_of_group:
                    group_ends.append(ev.stream.header.group_id)
        assert 0 not in live_objects and live_objects[1][:3] == [0, 1, 2]
        assert 0 in group_ends
    finally:
        await r.close()


async def test_a_fills_range_is_its_own_location_filter_else_the_subscriptions(
        tmp_path: Path) -> None:
    """FILL_PARAMETERS' LOCATION_FILTER gives the fill's range, clipped to L (§9.4, §6.3);
    without one the subscription's applies; a filter of type None (or none anywhere) is
    the whole Track up to L; a range starting past L opens no fill stream at all."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    lf = LocationFilter
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=3)
        for g in range(3):
            await t.group(g, group_payloads(g, 2, size=100))
        await t.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
        await pub.aclose()
        c = await client(r)
        cases = [  # (the subscription's filter, the fill's filter, the Groups filled)
            (lf.next_object(), lf.absolute_start(1, 0), [1, 2]),
            (lf.absolute_start(2, 0), None, [2]),
            (None, None, [0, 1, 2]),
            (lf.absolute_start(2, 0), lf.none(), [0, 1, 2]),
            (lf.next_object(), lf.absolute_start(5, 0), []),
        ]
        for sub_filter, fill_filter, groups in cases:
            sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
                location_filter=sub_filter, fill=Params(location_filter=fill_filter))),
                TIMEOUT)
            filled: list[Location] = []
            fill_streams = 0
            async with asyncio.timeout(TIMEOUT):
                async for ev in sub:
                    if isinstance(ev, ReceivedObject) and ev.stream.source == Source.FILL:
                        filled.append(ev.location)
                    elif isinstance(ev, StreamEnded) and ev.stream.source == Source.FILL:
                        fill_streams += 1
            assert filled == [Location(g, i) for g in groups for i in range(2)], \
                (sub_filter, fill_filter)
            assert fill_streams == (1 if groups else 0)
    finally:
        await r.close()


async def test_a_fill_and_a_fetch_report_their_own_duration(tmp_path: Path) -> None:
    """The latency a fill or a FETCH reports when it ends (the histograms' observation,
    ``ServedCounters.observe``) is its own duration: above zero, below the test's."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    seen: dict[str, list[float]] = {"fill": [], "fetch": []}
    r.relay.counters.fill.observe = seen["fill"].append
    r.relay.counters.fetch.observe = seen["fetch"].append
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=2)
        for g in range(2):
            await t.group(g, group_payloads(g, 2, size=100))
        await t.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
        c = await client(r)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, live_params()),
                                     TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        _, fetched = await fetch_objects(c, name)
        assert got.objects == fetched == t.sent
        counters = r.relay.counters
        async with asyncio.timeout(TIMEOUT):  # each reports as it leaves in_flight
            while counters.fill.in_flight.count or counters.fetch.in_flight.count:
                await asyncio.sleep(0)
        elapsed = loop.time() - started
        assert len(seen["fill"]) == len(seen["fetch"]) == 1
        assert all(0 < s[0] < elapsed for s in seen.values()), seen
    finally:
        await r.close()


@pytest.mark.parametrize("path", ["fill", "fetch"])
async def test_the_groups_a_slow_fill_or_fetch_walks_stay_in_memory(tmp_path: Path,
                                                                    path: str) -> None:
    """A fill or FETCH pins the Groups it walks in the memory tier (storage.memory's
    leases): a slow subscriber's walk of a live Track (nothing in LMDB yet) still gets every
    Object of them after newer Groups pushed the tier over its size."""
    r = await relay_at(tmp_path, memory_bytes=1 << 20, send_buffer_bytes=64 * 1024)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=8)
        for g in range(3):
            await t.group(g, group_payloads(g, 8, size=32 * 1024))
        await wait_cached(r, name, Location(2, 8))
        # a slow link: small QUIC windows and a small receive queue, not read at first
        c = await client(r, config=SessionConfig(receive_queue=2),
                         settings=QuicSettings(max_data=128 * 1024, max_stream_data=64 * 1024))
        served = r.relay.counters.fill if path == "fill" else r.relay.counters.fetch
        walk: Subscription | FetchResponse
        if path == "fill":
            walk = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
                location_filter=LocationFilter.next_object(),
                fill=Params(location_filter=LocationFilter.absolute_start(0, 0)))), TIMEOUT)
        else:
            walk = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
                location_filter=LocationFilter.absolute_range(Location(0, 0),
                                                              Location(2, 7)))), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            while served.in_flight.count == 0:
                await asyncio.sleep(0)
        for g in range(3, 7):  # 1 MiB more: the tier evicts what is not pinned
            await t.group(g, group_payloads(g, 8, size=32 * 1024))
        await wait_cached(r, name, Location(6, 8))
        assert r.store.memory.stats()["evicted_groups"] > 0
        got: dict[Location, bytes] = {}
        marks: list[RangeMarker] = []
        async with asyncio.timeout(TIMEOUT):
            async for ev in walk:
                if isinstance(ev, RangeMarker):
                    marks.append(ev)
                elif isinstance(ev, ReceivedObject) and ev.stream.source is not Source.SUBGROUP:
                    got[ev.location] = bytes(ev.payload)  # the fill's, not the live part's
                elif isinstance(ev, StreamEnded) and ev.stream.source is Source.FILL:
                    break
        assert marks == []
        assert got == {loc: p for loc, p in t.sent.items() if loc.group < 3}
    finally:
        await r.close()


class _GroupAtATimeFetchPublisher(SessionHandler):
    """An upstream whose FETCH answer carries Group 0 at once, then Group 1 only when the
    test lets it (``go``), and its FIN only after that (``fin``): a long Track still
    crossing the link."""

    def __init__(self, payloads: list[list[bytes]]) -> None:
        self.payloads = payloads
        self.go = asyncio.Event()
        self.fin = asyncio.Event()
        self.fetches = 0

    async def fetch(self, req: IncomingFetch) -> None:
        self.fetches += 1
        w = await req.accept(False, Location(len(self.payloads) - 1,
                                             len(self.payloads[-1]) - 1))
        for g, group in enumerate(self.payloads):
            if g == 1:
                await self.go.wait()
            for i, p in enumerate(group):
                await w.write_object(g, 0, i, 0, p)
        await self.fin.wait()
        await w.finish()


async def _pull_through(r: RunningRelay, up: _GroupAtATimeFetchPublisher,
                        params: Params | None = None
                        ) -> tuple[FullTrackName, MoqtSession, MoqtSession, FetchResponse]:
    """A publisher of ``up``'s Track on ``r`` (it announces, and answers FETCH only), and a
    client's FETCH of that Track, which ``r`` holds nothing of."""
    name = FullTrackName(make_ns(), b"k.raw.s0")
    pub = await client(r, handler=up)
    await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
    c = await client(r)
    resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, params), TIMEOUT)
    return name, pub, c, resp


async def _objects_until(events: AsyncIterator[FetchEvent], got: dict[Location, bytes],
                         n: int) -> None:
    """Read ``events`` into ``got`` until it holds ``n`` Objects; no marker comes first."""
    async with asyncio.timeout(TIMEOUT):
        while len(got) < n:
            ev = await anext(events)
            assert not isinstance(ev, RangeMarker), ev
            if isinstance(ev, ReceivedObject):
                got[ev.location] = bytes(ev.payload)


async def test_a_pull_through_fetch_serves_objects_as_they_arrive(tmp_path: Path) -> None:
    """A FETCH of a Track the relay holds nothing of is answered from its source (pull-
    through), Object by Object as they arrive, not once the whole range has crossed: the
    consumer has Group 0 while Group 1 is still held back upstream (KVCS: a consumer at an
    edge computes layer l while l+1 arrives, however many relays lie between), and Group 1
    before the upstream stream's FIN (its first Object tells that Group 0 ended). All of it
    comes from that one upstream FETCH."""
    r = await relay_at(tmp_path)
    payloads = [group_payloads(g, 3, size=500) for g in range(2)]
    up = _GroupAtATimeFetchPublisher(payloads)
    try:
        _, _, _, resp = await _pull_through(r, up)
        assert resp.end_location == Location(1, 2)
        got: dict[Location, bytes] = {}
        events = aiter(resp)
        await _objects_until(events, got, 3)  # Group 0, with Group 1 still upstream
        assert got == {Location(0, i): p for i, p in enumerate(payloads[0])}
        assert not up.go.is_set()
        up.go.set()
        await _objects_until(events, got, 6)  # Group 1, with the upstream FIN held back
        assert got == {Location(g, i): p for g in range(2) for i, p in enumerate(payloads[g])}
        assert not up.fin.is_set()
        up.fin.set()
        async with asyncio.timeout(TIMEOUT):
            rest = [ev async for ev in events]
        assert not any(isinstance(ev, (ReceivedObject, RangeMarker)) for ev in rest), rest
        assert up.fetches == 1
        assert r.relay.counters.upstream_fetches == 1
    finally:
        up.go.set()
        up.fin.set()
        await r.close()


async def test_a_pull_through_fetch_whose_source_dies_midway_ends_with_what_is_unknown(
        tmp_path: Path) -> None:
    """The upstream FETCH a pull-through serves from fails after its first Group (the
    source's session closes): the consumer keeps what came, the rest is reported as not
    known (an End of Range marker, or the stream reset UNKNOWN_OBJECT_STATUS), within the
    FETCH's FILL_TIMEOUT, never as absent, and the relay goes on serving."""
    r = await relay_at(tmp_path)
    payloads = [group_payloads(g, 3, size=500) for g in range(2)]
    up = _GroupAtATimeFetchPublisher(payloads)
    try:
        name, pub, c, resp = await _pull_through(r, up, Params(fill_timeout=2000))
        got: dict[Location, bytes] = {}
        markers: list[RangeMarker] = []
        events = aiter(resp)
        await _objects_until(events, got, 3)
        await asyncio.wait_for(pub.aclose(), TIMEOUT)  # Group 1 never comes
        reset = None
        async with asyncio.timeout(TIMEOUT):
            try:
                async for ev in events:
                    if isinstance(ev, ReceivedObject):
                        got[ev.location] = bytes(ev.payload)
                    elif isinstance(ev, RangeMarker):
                        markers.append(ev)
            except StreamAborted as e:
                reset = e
        assert got == {Location(0, i): p for i, p in enumerate(payloads[0])}
        if reset is None:
            assert markers and all(m.type in (EndOfRangeType.UNKNOWN, EndOfRangeType.TIMED_OUT)
                                   for m in markers), markers
        # the relay still answers, and what it kept is served
        _, again = await fetch_objects(c, name, Params(
            location_filter=LocationFilter.absolute_range(Location(0, 0), Location(0, 2))))
        assert again == got
    finally:
        up.go.set()
        up.fin.set()
        await r.close()


async def test_the_groups_a_relay_lacks_are_asked_upstream_in_one_fetch(tmp_path: Path) -> None:
    """An edge relay that holds part of a Track asks its upstream for the rest in one FETCH
    per unknown run, not one per Group (a round trip per past layer), and serves it as it
    arrives, in order. b holds Groups 0-1 (an earlier FETCH), then follows the Track live
    from its Largest Object on (no fill: b is warm). A consumer joining with a fill from
    {0,0} needs Groups 2-5 from a: nothing will bring them on b's subscription, so b does
    not wait for them there (``in_flight_wait`` is made longer than the test's bound);
    one upstream FETCH brings all four. Then b loses Groups 1-4 from its memory tier: a
    FETCH of the whole Track asks a again once, for that run."""
    a = await relay_at(tmp_path / "a")
    b = await relay_at(tmp_path / "b", upstream=[a.url],
                       options=RelayOptions(in_flight_wait=10 * TIMEOUT))
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(a)
        t = await push_track(pub, name, layers=8)
        for g in range(6):
            await t.group(g, group_payloads(g, 3, size=300))
        await wait_cached(a, name, Location(5, 3))
        c = await client(b)
        _, got = await fetch_objects(c, name, Params(
            location_filter=LocationFilter.absolute_range(Location(0, 0), Location(1, 2))))
        assert len(got) == 6 and b.relay.counters.upstream_fetches == 1
        every = [(loc, p) for loc, p in t.sent.items()]
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, live_params()),
                                     TIMEOUT)
        assert sub.largest == Location(5, 3)
        assert await fill_objects(sub) == every  # in order, each once
        assert b.relay.counters.upstream_fetches == 2
        assert a.relay.counters.ok("FETCH") == 2
        track = b.relay.tracks[name]
        for g in range(1, 5):
            assert b.store.memory.discard_group(track.key, g)
        _, got = await fetch_objects(c, name, Params(
            location_filter=LocationFilter.absolute_range(Location(0, 0), Location(5, 2))))
        assert list(got.items()) == every
        assert b.relay.counters.upstream_fetches == 3
        # a FETCH that asks for some Object IDs of each Group is not widened upstream to
        # the whole run: only what passes its filter crosses the link (a Group at a time)
        for g in range(1, 5):
            assert b.store.memory.discard_group(track.key, g)
        fetched = b.relay.counters.upstream_fetched_objects
        ids = RangeFilter(ParameterType.OBJECTID_FILTER, 0, (Range(0, 1),))
        _, got = await fetch_objects(c, name, Params(
            location_filter=LocationFilter.absolute_range(Location(0, 0), Location(5, 2)),
            range_filters=(ids,)))
        assert list(got.items()) == [(loc, p) for loc, p in every if loc.object <= 1]
        assert b.relay.counters.upstream_fetched_objects - fetched == 4 * 2
        await t.group(6, group_payloads(6, 3, size=300))  # and the live part goes on
        async with asyncio.timeout(TIMEOUT):
            async for ev in sub:
                if isinstance(ev, ReceivedObject) and ev.group == 6:
                    break
    finally:
        await b.close()
        await a.close()
