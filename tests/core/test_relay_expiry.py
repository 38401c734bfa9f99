"""Expiry: the publisher's MAX_CACHE_DURATION (§12, §14.1) bounds how long either tier serves
an Object, and a Track leaving LMDB by expiry (that or lmdb_max_age) withdraws its
namespace with NAMESPACE_DONE, as eviction does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fake_clock import Clock
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

from relay.core.namespaces import CACHE
from relay.core.relay import RelayOptions
from relay.moqt.codes import EndOfRangeType, PropertyType
from relay.moqt.kvp import KeyValuePair
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.session import NamespaceEvent, RangeMarker, ReceivedObject, RequestRejected


def _duration(ms: int) -> tuple[KeyValuePair, ...]:
    return (KeyValuePair(PropertyType.MAX_CACHE_DURATION, ms),)


async def test_objects_past_max_cache_duration_are_not_served_from_cache(
        tmp_path: Path) -> None:
    clock = Clock()
    r = await relay_at(tmp_path, clock=clock, options=RelayOptions(in_flight_wait=0.05))
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=3, properties=_duration(10_000))
        payloads = {g: group_payloads(g, 3, size=300) for g in range(2)}
        for g in range(2):
            await t.group(g, payloads[g])
        await wait_cached(r, name, Location(1, 3))
        c = await client(r)
        group0 = Params(location_filter=LocationFilter.absolute_range(Location(0, 0),
                                                                      Location(0, 2)),
                        fill_timeout=2000)
        _, got = await fetch_objects(c, name, group0)
        assert got == {Location(0, i): p for i, p in enumerate(payloads[0])}

        clock.now += 10  # the publisher's 10 s are up for every cached Object
        asked = r.relay.counters.fetch.upstream_lookups
        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, group0), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            events = await resp.collect()
        # not served, not called absent: unknown, and asked for upstream first
        assert not [e for e in events if isinstance(e, ReceivedObject)]
        assert [e.type for e in events if isinstance(e, RangeMarker)] == \
            [EndOfRangeType.UNKNOWN]
        assert r.relay.counters.fetch.upstream_lookups > asked

        # the Objects arrive again: a fresh copy is served again
        await t.group(0, payloads[0])
        track = r.relay.tracks[name]
        async with asyncio.timeout(TIMEOUT):
            while r.store.memory.get(track.key, Location(0, 2)) is None:
                await track.wait_change(TIMEOUT)
        _, got = await fetch_objects(c, name, group0)
        assert got == {Location(0, i): p for i, p in enumerate(payloads[0])}
    finally:
        await r.close()


@pytest.mark.parametrize("kind", ["lmdb_max_age", "max_cache_duration"])
async def test_expiry_from_lmdb_sends_namespace_done(tmp_path: Path, kind: str) -> None:
    """Real time, short: the relay's own expiry timer has to fire."""
    life = 0.8
    r = await relay_at(tmp_path, lmdb_max_age=life if kind == "lmdb_max_age" else None)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    ns = name.namespace
    try:
        c = await client(r)
        nsub = await asyncio.wait_for(c.subscribe_namespace(ns[:4]), TIMEOUT)
        pub = await client(r)
        start = asyncio.get_running_loop().time()  # nothing can expire before start + life
        t = await push_track(pub, name, layers=2, properties=_duration(int(life * 1000))
                             if kind == "max_cache_duration" else ())
        for g in range(2):
            await t.group(g, group_payloads(g, 3, size=300))
        await t.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
        await pub.aclose()
        # the publisher is gone; only the relay's LMDB copy keeps the namespace announced
        async with asyncio.timeout(TIMEOUT):
            while any(e.source is not CACHE for e in r.relay.namespaces.publishers_for(ns)):
                await asyncio.sleep(0)
        seen: list[bool] = []
        async with asyncio.timeout(TIMEOUT):
            async for ev in nsub:
                if isinstance(ev, NamespaceEvent) and ev.namespace == ns:
                    seen.append(ev.active)
                    if not ev.active:
                        break
        # the LMDB copy held the namespace until it expired (not merely until the publisher
        # left): decided on the clock, since a loaded machine may reach expiry before here
        assert asyncio.get_running_loop().time() - start >= life
        assert seen == [True, False]
        assert r.relay.counters.lmdb_expired_tracks == 1
        assert not r.store.durable.info(name_key := r.relay.tracks[name].key)
        if kind == "max_cache_duration":  # the memory copy is as old: nothing is served
            try:
                resp = await asyncio.wait_for(c.fetch(ns, name.name), TIMEOUT)
                async with asyncio.timeout(TIMEOUT):
                    events = await resp.collect()
            except RequestRejected:
                events = []
            assert not [e for e in events if isinstance(e, ReceivedObject)], name_key
    finally:
        await r.close()
