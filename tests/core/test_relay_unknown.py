"""Unknown stays unknown down a relay tree (§11.7, §14.7, §14.9): a lower relay that gets
End of Unknown Range markers from upstream reports them downstream and asks again later,
never recording the span as absent."""

from __future__ import annotations

import asyncio
from pathlib import Path

from relay_helpers import (
    TIMEOUT,
    client,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.core.relay import RelayOptions
from relay.moqt.codes import EndOfRangeType
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.session import MoqtSession, RangeMarker, ReceivedObject


async def _fetch_group(c: MoqtSession, name: FullTrackName, g: int) -> list[object]:
    """FETCH Objects 0..2 of Group ``g``."""
    resp = await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
        location_filter=LocationFilter.absolute_range(Location(g, 0), Location(g, 2)),
        fill_timeout=3000)), TIMEOUT)
    async with asyncio.timeout(TIMEOUT):
        return list(await resp.collect())


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
        # the origin loses Group 1 of the live Track (memory pressure)
        key = origin.relay.tracks[name].key
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
