"""The relay with real sessions on 127.0.0.1: push, fetch, live fan-out, persistence."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from relay_helpers import (
    TIMEOUT,
    PushedTrack,
    client,
    drain,
    fetch_objects,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.core.relay import RelayOptions
from relay.moqt.codes import (
    GroupOrder,
    ObjectStatus,
    ParameterType,
    RequestErrorCode,
    StreamResetCode,
)
from relay.moqt.kvp import KeyValuePair, encode_kvps
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.moqt.range_filter import Range, RangeFilter
from relay.session import (
    ReceivedObject,
    RequestRejected,
    SessionConfig,
    StreamEnded,
    Subscription,
)
from storage.interface import Tier


async def test_pushed_track_outlives_its_publisher_and_a_restart(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        track = await push_track(pub, name, layers=4)
        for g in range(4):
            await track.group(g, group_payloads(g, 6))
        await track.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
        await pub.aclose()

        sub = await client(r)
        resp, got = await fetch_objects(sub, name)
        assert resp.end_of_track and resp.end_location == Location(4, 0)
        assert got == track.sent
        await sub.aclose()
    finally:
        await r.close()

    # restart on the same data directory: LMDB serves the track bit-identical
    r2 = await relay_at(tmp_path)
    try:
        sub = await client(r2)
        params = Params(location_filter=LocationFilter.absolute_group_end(1, 0, 2),
                        group_order=GroupOrder.ASCENDING,
                        range_filters=(RangeFilter(ParameterType.OBJECTID_FILTER, 0,
                                                   (Range(0, 2),)),))
        resp = await asyncio.wait_for(sub.fetch(name.namespace, name.name, params), TIMEOUT)
        assert resp.end_location == Location(2, 6)  # the End of Group of Group 2
        assert not resp.end_of_track
        async with asyncio.timeout(TIMEOUT):
            events = await resp.collect()
        assert [e.location for e in events] == [Location(g, i) for g in (1, 2) for i in range(3)]
        assert all(bytes(e.payload) == track.sent[e.location] for e in events)
        assert r2.relay.counters.fetch.objects[Tier.LMDB] == 6
        await sub.aclose()
    finally:
        await r2.close()


async def test_live_subscribers_joining_at_random_moments_get_everything_once(
        tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"v.raw.s0")
    rng = random.Random(7)
    layers, blocks = 8, 5
    try:
        pub = await client(r)
        track = await push_track(pub, name, layers)
        subscribers = []
        joins = sorted(rng.randrange(0, layers * blocks) for _ in range(6))
        sessions = [await client(r) for _ in joins]
        step = 0
        for g in range(layers):
            payloads = group_payloads(g, blocks)
            w = await track.served.open_subgroup(g, 0, track.priority(g))
            for i, p in enumerate(payloads):
                while joins and joins[0] == step:
                    joins.pop(0)
                    s = sessions[len(subscribers)]
                    subscribers.append(await asyncio.wait_for(
                        s.subscribe(name.namespace, name.name, live_params()), TIMEOUT))
                await w.write_object(i, p)
                track.sent[Location(g, i)] = p
                step += 1
            await w.write_status(blocks, 3, fin=True)
        await track.end()
        async with asyncio.timeout(TIMEOUT):
            results = await asyncio.gather(*(drain(s) for s in subscribers))
        for got in results:
            assert got.duplicates == []
            assert got.objects == track.sent
            assert got.done is not None and got.done.status == 0x2
        # one upstream subscription (the PUBLISH) whatever the number of subscribers
        assert r.relay.counters.ok("PUBLISH") == 1
        assert r.relay.counters.upstream_subscriptions == 0
    finally:
        await r.close()


async def test_a_live_subscription_starts_right_after_l_not_at_l(tmp_path: Path) -> None:
    # A publisher PUBLISHes a Track whose Objects up to L = {0, 2} are still on their way
    # (LARGEST_OBJECT in PUBLISH): the relay's L is {0, 2} before it caches any of them. A
    # subscriber joining then gets {0,0}..L from its fill and only what is after L live;
    # a live start at L would hand it Object {0, 2} twice.
    r = await relay_at(tmp_path, options=RelayOptions(in_flight_wait=TIMEOUT))
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
        served = await asyncio.wait_for(pub.publish(
            name.namespace, name.name, Params(largest_object=Location(0, 2))), TIMEOUT)
        track = PushedTrack(pub, served, name, layers=2)
        await wait_cached(r, name, Location(0, 2))
        s = await client(r)
        sub = await asyncio.wait_for(s.subscribe(name.namespace, name.name, live_params()),
                                     TIMEOUT)
        assert sub.largest == Location(0, 2)
        for g in range(2):
            await track.group(g, group_payloads(g, 4))
        await track.end()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        assert got.duplicates == []
        assert got.objects == track.sent
        assert got.done is not None and got.done.status == 0x2
    finally:
        await r.close()


async def test_subscribe_to_unknown_track_and_fetch_past_the_end_are_refused(
        tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    try:
        s = await client(r)
        ns = make_ns()
        try:
            await asyncio.wait_for(s.subscribe(ns, b"k.raw.s0", live_params()), TIMEOUT)
        except RequestRejected as e:
            assert e.code == RequestErrorCode.DOES_NOT_EXIST
        else:
            raise AssertionError("SUBSCRIBE to a Track nobody publishes was accepted")
        try:
            await asyncio.wait_for(s.fetch(ns, b"k.raw.s0"), TIMEOUT)
        except RequestRejected as e:
            assert e.code == RequestErrorCode.DOES_NOT_EXIST
        else:
            raise AssertionError("FETCH of an unknown Track was accepted")
    finally:
        await r.close()


async def test_subscribe_after_the_publisher_left_gets_the_cache_then_track_ended(
        tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        track = await push_track(pub, name, layers=3)
        for g in range(3):
            await track.group(g, group_payloads(g, 4))
        await track.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
        await pub.aclose()
        s = await client(r)
        sub = await asyncio.wait_for(s.subscribe(name.namespace, name.name, live_params()),
                                     TIMEOUT)
        assert sub.largest == Location(3, 0)
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        assert got.objects == track.sent and got.duplicates == []
        assert got.done is not None and got.done.status == 0x2  # TRACK_ENDED
    finally:
        await r.close()


async def test_a_push_far_larger_than_the_receive_queue_loses_nothing(tmp_path: Path) -> None:
    # Regression: ending a subscription must never drop the Objects still queued for ingest.
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        track = await push_track(pub, name, layers=8)
        for g in range(8):
            await track.group(g, group_payloads(g, 128, size=1024))
        await track.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
        assert r.relay.counters.objects_received == 8 * 128
    finally:
        await r.close()


async def test_requests_for_unknown_tracks_do_not_grow_the_relay(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    try:
        s = await client(r)
        for i in range(20):
            ns = make_ns()
            for call in (s.subscribe(ns, b"t%d" % i), s.fetch(ns, b"t%d" % i)):
                try:
                    await asyncio.wait_for(call, TIMEOUT)
                except RequestRejected as e:
                    assert e.code == RequestErrorCode.DOES_NOT_EXIST
                else:
                    raise AssertionError("a request for an unknown Track was accepted")
        assert r.relay.tracks == {}
    finally:
        await r.close()


async def test_tracks_whose_objects_are_all_gone_leave_the_registry(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    r.relay.sweep_every = 4
    names = [FullTrackName(make_ns(), b"k.raw.s0") for _ in range(3)]
    try:
        pub = await client(r)
        for name in names:  # pushed, then the publisher fails: never committed
            t = await push_track(pub, name, layers=2)
            await t.group(0, group_payloads(0, 2))
            await wait_cached(r, name, Location(0, 2))
        await pub.aclose()
        for name in names[:2]:  # evicted from memory: nothing is left of them
            r.store.memory.drop_track(r.relay.tracks[name].key)
        async with asyncio.timeout(TIMEOUT):
            for n in names:  # each Track's ingest ends with its publisher's session
                while r.relay.tracks[n].upstreams:
                    await r.relay.tracks[n].wait_change(TIMEOUT)
        assert r.relay.sweep() == 2
        assert set(r.relay.tracks) == {names[2]}  # still cached, still known
    finally:
        await r.close()


async def test_track_properties_survive_in_lmdb_across_a_restart(tmp_path: Path) -> None:
    props = (KeyValuePair(0x0E, 3), KeyValuePair(0x3801, b"app-defined"))
    name = FullTrackName(make_ns(), b"k.raw.s0")
    r = await relay_at(tmp_path)
    try:
        pub = await client(r)
        await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
        served = await asyncio.wait_for(
            pub.publish(name.namespace, name.name, properties=props), TIMEOUT)
        track = PushedTrack(pub, served, name, 1)
        await track.group(0, group_payloads(0, 2))
        await track.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
    finally:
        await r.close()
    r2 = await relay_at(tmp_path)
    try:
        c = await client(r2)
        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name), TIMEOUT)
        assert tuple(resp.track_properties) == props
        no_props = await asyncio.wait_for(
            c.fetch(name.namespace, name.name, Params(include_properties=False)), TIMEOUT)
        assert tuple(no_props.track_properties) == ()
    finally:
        await r2.close()


async def test_a_publisher_closing_right_after_writing_loses_nothing(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        track = await push_track(pub, name, layers=4)
        for g in range(4):
            await track.group(g, group_payloads(g, 16, size=32 * 1024))
        await track.end()
        await pub.aclose()  # an orderly close drains what was written first
        assert await r.relay.wait_committed(name, TIMEOUT)
        assert r.relay.counters.objects_received == 4 * 16
    finally:
        await r.close()


async def test_a_forwarded_subgroup_stream_keeps_its_header(tmp_path: Path) -> None:
    """The downstream subgroup stream mirrors its upstream one (§11.2): Subgroup ID,
    Publisher Priority, FIRST_OBJECT and END_OF_GROUP as the publisher sent them, and each
    Object's Properties."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=2)
        c = await client(r)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name), TIMEOUT)
        # there from the start, but its window starts at Object 1
        mid = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_start(0, 1))), TIMEOUT)
        w = await t.served.open_subgroup(0, 3, 9, first_object=True, end_of_group=True)
        await w.write_object(0, b"zero")
        await w.write_object(1, b"one")
        await wait_cached(r, name, Location(0, 1))
        # joins after Object 1: its copy of the stream does not start with the first Object
        late = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.next_object())), TIMEOUT)
        await w.write_object(2, b"two")
        await wait_cached(r, name, Location(0, 2))
        # joins after the stream's last Object, before its FIN: it has no copy of the stream
        await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.next_object())), TIMEOUT)
        await w.finish()
        w = await t.served.open_subgroup(1, 5, 200, first_object=False, properties=True)
        await w.write_object(4, b"four", properties=encode_kvps([(0x40, 7)]), fin=True)
        w = await t.served.open_subgroup(1, 6, None)  # no priority: the Track's default
        await w.write_object(5, b"five", fin=True)
        heads: dict[Location, tuple[object, ...]] = {}
        async with asyncio.timeout(TIMEOUT):
            async for ev in sub:
                if isinstance(ev, ReceivedObject):
                    h = ev.stream.header
                    assert h is not None
                    heads[ev.location] = (ev.subgroup, ev.priority, h.subgroup_id,
                                          h.publisher_priority, h.first_object, h.end_of_group,
                                          bytes(ev.properties or b""))
                    if len(heads) == 5:
                        break
        assert heads == {Location(0, 0): (3, 9, 3, 9, True, True, b""),
                         Location(0, 1): (3, 9, 3, 9, True, True, b""),
                         Location(0, 2): (3, 9, 3, 9, True, True, b""),
                         Location(1, 4): (5, 200, 5, 200, False, False,
                                          encode_kvps([(0x40, 7)])),
                         Location(1, 5): (6, 128, 6, 128, True, False, b"")}
        for joined, first in ((late, Location(0, 2)), (mid, Location(0, 1))):
            async with asyncio.timeout(TIMEOUT):
                async for ev in joined:
                    if isinstance(ev, ReceivedObject):
                        assert ev.stream.header is not None
                        assert (ev.location, ev.stream.header.first_object) == (first, False)
                        break
        # all written: nothing left queued (what the subscriber_backlog_bytes metric sums)
        assert [f.backlog for f in r.relay.tracks[name].forwarders] == [0, 0, 0, 0]
    finally:
        await r.close()


async def test_forward_end_location_and_an_upstream_reset_on_the_live_path(
        tmp_path: Path) -> None:
    """A subscription with Forward 0 gets no Object until an update sets it (§7.4); one with
    an Absolute Range gets its End Location, inclusive, and nothing after it (§6.2); a stream
    the publisher resets is reset downstream (INTERNAL_ERROR), never FINed as if whole."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=4)
        # (a stream reset before its header arrived is never seen: don't linger for it)
        c = await client(r, config=SessionConfig(done_linger=0.2))
        paused = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            forward=False)), TIMEOUT)
        ranged = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_range(Location(0, 0), Location(1, 3)))),
            TIMEOUT)
        cut = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.absolute_range(Location(2, 0), Location(2, 1)))),
            TIMEOUT)
        watcher = await asyncio.wait_for(c.subscribe(name.namespace, name.name), TIMEOUT)
        for g in range(2):
            await t.group(g, group_payloads(g, 3, size=100))
        await wait_cached(r, name, Location(1, 3))
        await asyncio.wait_for(paused.update(Params(forward=True)), TIMEOUT)
        await t.group(2, group_payloads(2, 3, size=100))
        w = await t.served.open_subgroup(3, 0, 0)
        await w.write_object(0, b"cut short")

        async def until_reset(sub: Subscription, seen: asyncio.Event
                              ) -> tuple[set[Location], list[StreamEnded]]:
            objects: set[Location] = set()
            ends: list[StreamEnded] = []
            async with asyncio.timeout(TIMEOUT):
                async for ev in sub:
                    if isinstance(ev, ReceivedObject) and ev.status == ObjectStatus.NORMAL:
                        objects.add(ev.location)
                        if ev.location == Location(3, 0):
                            seen.set()
                    elif isinstance(ev, StreamEnded):
                        ends.append(ev)
                        if ev.stream.header is not None and ev.stream.header.group_id == 3:
                            break
            return objects, ends

        # the reset once both have Group 3's first Object: a stream reset before the relay
        # wrote its header to them would never be seen (a loaded machine once did that)
        seen = {sub: asyncio.Event() for sub in (watcher, paused)}
        reading = {sub: asyncio.ensure_future(until_reset(sub, seen[sub]))
                   for sub in (watcher, paused)}
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in seen.values())), TIMEOUT)
        w.reset(0x9)

        objects, ends = await asyncio.wait_for(reading[watcher], TIMEOUT)  # the last reset
        assert len(objects) == 3 * 3 + 1
        assert [(e.fin, e.reset_code) for e in ends][-1] == (False, StreamResetCode.INTERNAL_ERROR)
        assert all(e.fin for e in ends[:-1])
        objects, _ = await asyncio.wait_for(reading[paused], TIMEOUT)
        assert objects == {Location(2, i) for i in range(3)} | {Location(3, 0)}
        await t.end()  # PUBLISH_DONE follows everything queued before it
        async with asyncio.timeout(TIMEOUT):
            got = await drain(ranged)
        # Group 2 goes on past this End Location: its stream must not end with FIN (that
        # says the Subgroup's later Objects were sent, §11.5); it is reset, and the reset
        # may even overtake its header
        fins: list[int] = []
        async with asyncio.timeout(TIMEOUT):
            async for ev in cut:
                if isinstance(ev, StreamEnded) and ev.fin and ev.stream.header is not None:
                    fins.append(ev.stream.header.group_id)
        assert 2 not in fins
        # up to Group 1's End of Group, {1,3}, the End Location itself
        assert set(got.objects) == {Location(g, i) for g in range(2) for i in range(3)}
        assert got.statuses == {Location(0, 3): ObjectStatus.END_OF_GROUP,
                                Location(1, 3): ObjectStatus.END_OF_GROUP}
    finally:
        await r.close()


async def test_the_cache_holds_no_receive_chunk_for_a_small_payload(tmp_path: Path) -> None:
    """Small Objects arrive several to a receive chunk; each cached payload must not keep a
    buffer at least twice its size alive, or the memory tier holds more than it counts."""
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        track = await push_track(pub, name, layers=1)
        await track.group(0, group_payloads(0, 64, size=200))
        await wait_cached(r, name, Location(0, 63))
        key = r.relay.tracks[name].key
        held = [o.payload for o in r.store.memory.read(key, Location(0, 0), Location(0, 63))]
        assert [bytes(p) for p in held] == [track.sent[Location(0, i)] for i in range(64)]
        pinned = [p for p in held if isinstance(p, memoryview)
                  and isinstance(p.obj, bytes | bytearray) and len(p.obj) >= 2 * p.nbytes]
        assert not pinned, f"{len(pinned)} of 64 payloads pin a buffer >= twice their size"
    finally:
        await r.close()
