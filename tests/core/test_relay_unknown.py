"""Unknown stays unknown down a relay tree (§11.7, §14.7, §14.9): a lower relay that gets
End of Unknown Range markers from upstream reports them downstream and asks again later,
never recording the span as absent. And what is in flight is waited for, not asked for."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    client,
    fetch_objects,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.core.relay import RelayOptions
from relay.core.upstream import UNREACHABLE
from relay.moqt.codes import EndOfRangeType, ObjectStatus, RequestErrorCode
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.service import RunningRelay
from relay.session import (
    IncomingFetch,
    IncomingSubscribe,
    MoqtSession,
    RangeMarker,
    ReceivedObject,
    RequestRejected,
    SessionHandler,
    Source,
    StreamEnded,
)


async def _fetch_group(c: MoqtSession, name: FullTrackName, g: int) -> list[object]:
    """FETCH Objects 0..2 of Group ``g``."""
    resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
        location_filter=LocationFilter.absolute_range(Location(g, 0), Location(g, 2)),
        fill_timeout=3000)), TIMEOUT)
    async with asyncio.timeout(TIMEOUT):
        return list(await resp.collect())


async def _group_cached(running: RunningRelay, name: FullTrackName, group: int) -> None:
    """Until ``group`` is all in the relay's memory tier. Largest Object past it does not say
    so: each Group has its own stream, and its last Objects may still be in flight (they
    would land after a discard)."""
    track = running.relay.tracks[name]
    async with asyncio.timeout(TIMEOUT):
        while running.store.memory.group_end(track.key, group) is None:
            await track.wait_change(TIMEOUT)


async def test_unknown_upstream_span_stays_unknown_down_the_tree(tmp_path: Path) -> None:
    opts = RelayOptions(in_flight_wait=0.05)
    origin = await relay_at(tmp_path / "o", options=opts)
    a = await relay_at(tmp_path / "a", upstream=[origin.url], options=opts)
    b = await relay_at(tmp_path / "b", upstream=[a.url], options=opts)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(origin)
        t = await push_track(pub, name, layers=3)
        payloads = {g: group_payloads(g, 3, size=300) for g in range(3)}
        for g in range(3):
            await t.group(g, payloads[g])
        await wait_cached(origin, name, Location(2, 3))
        # the origin loses Group 1 of the live Track (memory pressure). Largest Object (2,3)
        # does not mean Group 1 is all there: each Group has its own stream, and its last
        # Objects may still be in flight (then they would arrive after the discard)
        key = origin.relay.tracks[name].key
        await _group_cached(origin, name, 1)
        assert origin.store.memory.discard_group(key, 1)
        c = await client(b)
        for _ in range(2):  # asked twice: unknown both times, never an empty "absent" answer
            events = await _fetch_group(c, name, 1)
            assert not [e for e in events if isinstance(e, ReceivedObject)]
            marks = [e for e in events if isinstance(e, RangeMarker)]
            assert marks and marks[0].type in (EndOfRangeType.UNKNOWN,
                                               EndOfRangeType.TIMED_OUT), events
            assert marks[0].end.group == 1
        assert not b.relay.tracks[name].absent and not a.relay.tracks[name].absent
        # a fill from A (a new lower relay subscribing cold) carries the same marker: the
        # subscribing relay keeps Group 1 unknown too
        b2 = await relay_at(tmp_path / "b2", upstream=[a.url], options=opts)
        try:
            sub = await asyncio.wait_for(
                (await client(b2)).subscribe(name.namespace, name.name, live_params()), TIMEOUT)
            track2 = b2.relay.tracks[name]
            async with asyncio.timeout(TIMEOUT):
                # until the upstream fill's FIN: it proves where Group 2 ends
                while not any(hi.group == 2 for _, hi in track2.absent):
                    await track2.wait_change(TIMEOUT)
            assert not any(lo <= Location(1, 0) <= hi for lo, hi in track2.absent)
            sub.cancel()
        finally:
            await b2.close()
        # the publisher sends Group 1 again: the origin holds it, and B now serves it
        await t.group(1, payloads[1])
        track = origin.relay.tracks[name]
        async with asyncio.timeout(TIMEOUT):
            while origin.store.memory.group_end(key, 1) is None:
                await track.wait_change(TIMEOUT)
        events = await _fetch_group(c, name, 1)
        got = [bytes(e.payload) for e in events if isinstance(e, ReceivedObject)]
        assert got == payloads[1], events
    finally:
        await b.close()
        await a.close()
        await origin.close()


class _LatePublisher(SessionHandler):
    """Answers SUBSCRIBE with Largest Object {0,2} at once and sends Group 0 (Objects 0 and
    1, End of Group 2): the first ``early`` elements at once; once ``go`` is set, Object 0 of
    Group 1 (a change that resolves nothing below L); once ``go2`` is set, the rest. Those are
    at or below L and still in flight."""

    def __init__(self, early: int) -> None:
        self.early = early
        self.go = asyncio.Event()
        self.go2 = asyncio.Event()
        self.fetches = 0

    async def subscribe(self, req: IncomingSubscribe) -> None:
        served = await req.accept(Location(0, 2))
        w = await served.open_subgroup(0, 0, 0)
        for i, p in enumerate((b"zero", b"one", None)):
            if i == self.early:
                await self.go.wait()
                w1 = await served.open_subgroup(1, 0, 0)
                await w1.write_object(0, b"next", fin=True)
                await self.go2.wait()
            if p is None:
                await w.write_status(2, ObjectStatus.END_OF_GROUP, fin=True)
            else:
                await w.write_object(i, p)

    async def fetch(self, req: IncomingFetch) -> None:
        self.fetches += 1
        await req.reject(RequestErrorCode.DOES_NOT_EXIST, "not here")


@pytest.mark.parametrize("early", [0, 2], ids=["all-in-flight", "only-L-in-flight"])
async def test_a_fill_waits_for_objects_in_flight_up_to_the_largest_object(
        tmp_path: Path, early: int) -> None:
    """Objects at or below the upstream's Largest Object that have not arrived yet are in
    flight on the upstream subscription: a fill waits for them (``in_flight_wait``) instead of
    asking upstream with FETCH, and serves them once they come — L itself included."""
    r = await relay_at(tmp_path, options=RelayOptions(in_flight_wait=TIMEOUT))
    name = FullTrackName(make_ns(), b"k.raw.s0")
    up = _LatePublisher(early)
    try:
        pub = await client(r, handler=up)
        await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
        first = await client(r)
        await asyncio.wait_for(first.subscribe(name.namespace, name.name), TIMEOUT)
        track = r.relay.tracks[name]
        async with asyncio.timeout(TIMEOUT):  # the early Objects are cached
            while (track.last_held(0) or Location(0, -1)) < Location(0, early - 1):
                await track.wait_change(TIMEOUT)
        c = await client(r)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, live_params()),
                                     TIMEOUT)
        async with asyncio.timeout(TIMEOUT):  # until the fill is walking (then it waits)
            while r.relay.counters.fill.in_flight.count == 0:
                await asyncio.sleep(0.005)
        up.go.set()
        await wait_cached(r, name, Location(1, 0))  # the fill goes on waiting after it
        up.go2.set()
        got: dict[Location, bytes] = {}
        marks: list[RangeMarker] = []
        async with asyncio.timeout(TIMEOUT):
            async for ev in sub:
                if isinstance(ev, RangeMarker):
                    marks.append(ev)
                elif isinstance(ev, StreamEnded) and ev.stream.source is Source.FILL:
                    assert ev.fin
                    break
                elif isinstance(ev, ReceivedObject) and ev.stream.source is Source.FILL:
                    got[ev.location] = bytes(ev.payload)
        assert got == {Location(0, 0): b"zero", Location(0, 1): b"one"} and marks == []
        assert up.fetches == 0 and r.relay.counters.upstream_fetches == 0
    finally:
        await r.close()


class _SilentFetchPublisher(SessionHandler):
    """Accepts no FETCH and refuses none: every one waits for an answer that never comes."""

    def __init__(self) -> None:
        self.fetches = 0
        self.never = asyncio.Event()

    async def fetch(self, req: IncomingFetch) -> None:
        self.fetches += 1
        await self.never.wait()


async def _group_1_without_group_0(r: RunningRelay, up: _SilentFetchPublisher
                                   ) -> tuple[FullTrackName, MoqtSession]:
    """A Track pushed by a publisher that answers no FETCH, of which the relay saw Group 1
    but never Group 0; and a client session to ask for it."""
    name = FullTrackName(make_ns(), b"k.raw.s0")
    pub = await client(r, handler=up)
    t = await push_track(pub, name, layers=2)
    await t.group(1, group_payloads(1, 2, size=100))  # Group 0 never came this way
    await wait_cached(r, name, Location(1, 2))
    return name, await client(r)


async def test_an_upstream_that_never_answers_costs_a_fetch_its_fill_timeout_only(
        tmp_path: Path) -> None:
    """FILL_TIMEOUT bounds the whole FETCH (§9.6): an upstream FETCH still unanswered when it
    runs out is given up, and what it was for is reported Timed-Out."""
    r = await relay_at(tmp_path, options=RelayOptions(in_flight_wait=0))
    up = _SilentFetchPublisher()
    try:
        name, c = await _group_1_without_group_0(r, up)
        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_range(Location(0, 0), Location(0, 5)),
            fill_timeout=300)), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            events = await resp.collect()
        assert [(e.type, e.end) for e in events] == \
            [(EndOfRangeType.TIMED_OUT, Location(0, 5))]
        assert up.fetches == 1
    finally:
        up.never.set()
        await r.close()


async def test_a_fills_own_fill_timeout_bounds_its_wait_for_the_upstream(
        tmp_path: Path) -> None:
    """FILL_PARAMETERS' FILL_TIMEOUT (milliseconds, §9.4) bounds what a fill waits for an
    upstream that never answers, not the relay's default (set far above the test's bound):
    the Group that never came is reported Timed-Out and the rest is served."""
    r = await relay_at(tmp_path, options=RelayOptions(in_flight_wait=0,
                                                      default_fill_timeout=TIMEOUT * 2))
    up = _SilentFetchPublisher()
    try:
        name, c = await _group_1_without_group_0(r, up)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.next_object(),
            fill=Params(location_filter=LocationFilter.absolute_start(0, 0),
                        fill_timeout=300))), TIMEOUT)
        marks: list[EndOfRangeType] = []
        filled: list[Location] = []
        async with asyncio.timeout(TIMEOUT):
            async for ev in sub:
                if isinstance(ev, RangeMarker):
                    marks.append(ev.type)
                elif isinstance(ev, StreamEnded) and ev.stream.source is Source.FILL:
                    assert ev.fin
                    break
                elif isinstance(ev, ReceivedObject) and ev.stream.source is Source.FILL:
                    filled.append(ev.location)
        assert marks == [EndOfRangeType.TIMED_OUT]
        assert filled == [Location(1, 0), Location(1, 1)]
        assert up.fetches == 1
    finally:
        up.never.set()
        await r.close()


async def test_a_fetch_of_an_unknown_track_waits_for_its_source_its_fill_timeout_only(
        tmp_path: Path) -> None:
    """A FETCH of a Track the relay holds nothing of asks the publisher of its namespace
    (pull-through) within the request's FILL_TIMEOUT: a source that never answers costs
    that, and the FETCH is refused TIMEOUT, not left waiting (§9.6)."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    up = _SilentFetchPublisher()
    try:
        pub = await client(r, handler=up)
        await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
        c = await client(r)
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
                fill_timeout=300)), TIMEOUT)
        assert e.value.code == RequestErrorCode.TIMEOUT
        assert up.fetches == 1
    finally:
        up.never.set()
        await r.close()


async def test_a_fetch_past_a_known_end_of_track_asks_no_source(tmp_path: Path) -> None:
    """Past a Track's End of Track nothing can ever be published: a FETCH starting there is
    refused INVALID_RANGE at once, its publisher (still connected) never asked."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    up = _SilentFetchPublisher()
    try:
        pub = await client(r, handler=up)
        t = await push_track(pub, name, layers=2)
        for g in range(2):
            await t.group(g, group_payloads(g, 2, size=100))
        await t.end()  # End of Track at {2, 0}
        assert await r.relay.wait_committed(name, TIMEOUT)
        c = await client(r)
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
                location_filter=LocationFilter.absolute_start(5, 0), fill_timeout=300)),
                TIMEOUT)
        assert e.value.code == RequestErrorCode.INVALID_RANGE
        assert up.fetches == 0
    finally:
        up.never.set()
        await r.close()


async def test_a_fetch_its_namespaces_publisher_cannot_answer_is_invalid_range(
        tmp_path: Path) -> None:
    """A FETCH of a Track the relay holds nothing of, whose namespace has a publisher that
    refuses it: INVALID_RANGE "nothing published" (the namespace is served, this range of
    it is not), never DOES_NOT_EXIST, which only a namespace nobody publishes gets."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)  # its SessionHandler refuses every FETCH
        await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
        c = await client(r)
        for ns, code in ((name.namespace, RequestErrorCode.INVALID_RANGE),
                         (make_ns(), RequestErrorCode.DOES_NOT_EXIST)):
            with pytest.raises(RequestRejected) as e:
                await asyncio.wait_for(c.fetch(ns, name.name), TIMEOUT)
            assert e.value.code == code
    finally:
        await r.close()


async def test_a_fetch_past_what_the_relay_saw_of_an_ended_publication_times_out(
        tmp_path: Path) -> None:
    """The publisher stopped publishing without an End of Track: what lies past the Largest
    Object the relay saw is not known. A FETCH starting there asks the publisher, which
    never answers: TIMEOUT "upstream unreachable" (counted), not INVALID_RANGE."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    up = _SilentFetchPublisher()
    try:
        pub = await client(r, handler=up)
        t = await push_track(pub, name, layers=2)
        await t.group(0, group_payloads(0, 2, size=100))
        await wait_cached(r, name, Location(0, 2))
        await asyncio.wait_for(t.served.done(), TIMEOUT)  # PUBLISH_DONE, no End of Track
        track = r.relay.tracks[name]
        async with asyncio.timeout(TIMEOUT):
            while track.live:
                await track.wait_change(TIMEOUT)
        c = await client(r)
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
                location_filter=LocationFilter.absolute_start(3, 0), fill_timeout=300)),
                TIMEOUT)
        assert (e.value.code, e.value.reason) == (RequestErrorCode.TIMEOUT, UNREACHABLE)
        assert r.relay.counters.upstream_unreachable == 1 and up.fetches == 1
    finally:
        up.never.set()
        await r.close()


async def test_a_cold_edge_answers_a_group_its_origin_lost_as_unknown(tmp_path: Path) -> None:
    """Issue 26 item 7: a cold edge asked for "all of Group 1", which its origin evicted,
    answers FETCH_OK and an Unknown (or Timed-Out) Range for it, never DOES_NOT_EXIST or
    INVALID_RANGE "nothing published" (which tell a consumer the Track is absent)."""
    opts = RelayOptions(in_flight_wait=0.05)
    origin = await relay_at(tmp_path / "o", options=opts)
    edge = await relay_at(tmp_path / "e", upstream=[origin.url], options=opts)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(origin)
        t = await push_track(pub, name, layers=3)
        for g in range(3):
            await t.group(g, group_payloads(g, 3, size=300))
        await wait_cached(origin, name, Location(2, 3))
        await _group_cached(origin, name, 1)
        assert origin.store.memory.discard_group(origin.relay.tracks[name].key, 1)
        c = await client(edge)
        for _ in range(2):
            resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
                location_filter=LocationFilter.absolute_group_end(1, 0, 1),
                fill_timeout=3000)), TIMEOUT)
            async with asyncio.timeout(TIMEOUT):
                events = list(await resp.collect())
            assert not [e for e in events if isinstance(e, ReceivedObject)]
            marks = [e for e in events if isinstance(e, RangeMarker)]
            assert marks and marks[0].type in (EndOfRangeType.UNKNOWN,
                                               EndOfRangeType.TIMED_OUT), events
            assert resp.end_location is not None and resp.end_location.group == 1
        assert not edge.relay.tracks[name].absent
    finally:
        await edge.close()
        await origin.close()


async def test_a_fetchs_fill_timeout_is_one_budget_before_and_after_fetch_ok(
        tmp_path: Path) -> None:
    """FILL_TIMEOUT bounds all of a FETCH's upstream effort: what finding "all of Group 0"'s
    end cost before FETCH_OK is not given again to the walk after it (issue 26 guard)."""
    r = await relay_at(tmp_path, options=RelayOptions(in_flight_wait=0))
    name = FullTrackName(make_ns(), b"k.raw.s0")
    up = _SilentFetchPublisher()
    budget = 2.0
    try:
        pub = await client(r, handler=up)
        t = await push_track(pub, name, layers=2)
        await t.group(1, group_payloads(1, 2, size=100))  # Group 0 never came this way
        await wait_cached(r, name, Location(1, 2))
        c = await client(r)
        loop = asyncio.get_running_loop()
        started = loop.time()
        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_group_end(0, 0, 0),
            fill_timeout=int(budget * 1000))), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            events = await resp.collect()
        elapsed = loop.time() - started
        assert [e.type for e in events] == [EndOfRangeType.TIMED_OUT]
        # the whole budget went into looking for Group 0 before FETCH_OK: one budget in all,
        # not a second one for the walk (that would be about twice the budget)
        assert budget * 0.9 <= elapsed < budget * 1.5, elapsed
    finally:
        up.never.set()
        await r.close()


class _ResettingFetchPublisher(SessionHandler):
    """Answers FETCH (FETCH_OK) and resets its fetch stream at once; the next FETCH it
    answers whole."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads
        self.fetches = 0

    async def fetch(self, req: IncomingFetch) -> None:
        self.fetches += 1
        w = await req.accept(False, Location(0, len(self.payloads) - 1))
        for i, p in enumerate(self.payloads):
            await w.write_object(0, 0, i, 7, p)
            if self.fetches == 1:
                w.reset()
                return
        await w.finish()


async def test_a_source_that_resets_its_fetch_stream_is_a_failure_told_at_once(
        tmp_path: Path) -> None:
    """A publisher takes the relay's FETCH and resets the stream before it named the
    request. The relay does not wait out the consumer's FILL_TIMEOUT (60 s here, more than
    the test's bound) for a stream that cannot come, nor call the Track absent: it answers
    TIMEOUT (unknown) now, and the consumer's next FETCH is served."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    payloads = group_payloads(0, 3, size=1000)
    up = _ResettingFetchPublisher(payloads)
    try:
        pub = await client(r, handler=up)
        await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
        c = await client(r)
        with pytest.raises(RequestRejected) as refused:
            await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
                fill_timeout=60_000)), TIMEOUT)
        assert refused.value.code == RequestErrorCode.TIMEOUT
        _resp, got = await fetch_objects(c, name)
        assert got == {Location(0, i): p for i, p in enumerate(payloads)}
        assert up.fetches == 2
    finally:
        await r.close()
