"""A cold relay's own fill upstream starts where the fill of the subscriber that made it
subscribe starts (docs/relay.md, "One upstream subscription per Track"): a subscriber of the
current Group (Relative Start 1: the KVCS manifest, moq-rs) waits for that Group alone, not
for the whole history crossing first. The history is FETCHed when someone asks for it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from relay_helpers import (
    TIMEOUT,
    client,
    drain,
    fill_objects,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.core.relay import RelayOptions
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location


async def test_a_cold_relay_fills_upstream_from_where_its_subscriber_fills(
        tmp_path: Path) -> None:
    """b is cold when a subscriber joins with a fill of the current Group: b asks a for that
    fill too, so Group 3 alone crosses. A second subscriber at b fills from {0,0}: b's
    upstream subscription will never bring Groups 0-2 (before its fill's start, at or below
    its Largest Object), so b FETCHes them at once instead of waiting for them in flight
    (``in_flight_wait`` is longer than the test's bound; waiting would end the fill at its
    FILL_TIMEOUT with Groups 0-2 missing). The FIN of b's fill proves absent only what lies
    between its start and L, never the Groups before it."""
    a = await relay_at(tmp_path / "a")
    b = await relay_at(tmp_path / "b", upstream=[a.url],
                       options=RelayOptions(in_flight_wait=10 * TIMEOUT))
    name = FullTrackName(make_ns(), b"manifest")
    try:
        pub = await client(a)
        t = await push_track(pub, name, layers=5)
        for g in range(4):
            await t.group(g, group_payloads(g, 3, size=300))
        await wait_cached(a, name, Location(3, 3))
        c = await client(b)
        current = await asyncio.wait_for(c.subscribe(name.namespace, name.name, Params(
            location_filter=LocationFilter.next_object(),
            fill=Params(location_filter=LocationFilter.relative_start(1)))), TIMEOUT)
        assert current.largest == Location(3, 3)
        track = b.relay.tracks[name]
        later = await asyncio.wait_for(c.subscribe(name.namespace, name.name, live_params()),
                                       TIMEOUT)
        history = [(loc, p) for loc, p in t.sent.items() if loc.group <= 3]
        assert await fill_objects(later) == history  # in order, each once
        await t.group(4, group_payloads(4, 3, size=300))
        await t.end()
        async with asyncio.timeout(TIMEOUT):
            got_current, got_later = await asyncio.gather(drain(current), drain(later))
    finally:
        await b.close()
        await a.close()
    assert got_current.objects == {loc: p for loc, p in t.sent.items() if loc.group >= 3}
    assert got_later.objects == {loc: p for loc, p in t.sent.items() if loc.group == 4}
    assert got_current.duplicates == got_later.duplicates == []
    # b's own fill brought Group 3, the live part Group 4; Groups 0-2 came in one FETCH
    assert b.relay.counters.objects_received == 6
    assert b.relay.counters.upstream_fetches == 1
    assert not [loc for loc in t.sent for s, e in track.absent if s <= loc <= e]
