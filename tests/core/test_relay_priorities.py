"""Scheduling under a bottleneck downstream (§13, kvcs-draft 3.4): lower Publisher Priority
first, and Subscriber Priority between subscriptions of one session."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    PushedTrack,
    client,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.moqt.codes import ObjectStatus
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.session import ReceivedObject, SessionConfig, Subscription
from relay.transport import QuicSettings

GROUPS = 8


async def _push(track: PushedTrack, priority: int, groups: int) -> None:
    for g in range(groups):
        w = await track.served.open_subgroup(g, 0, priority)
        for i, p in enumerate(group_payloads(g, 8, size=32 * 1024)):
            await w.write_object(i, p)
        await w.write_status(8, ObjectStatus.END_OF_GROUP, fin=True)


@pytest.mark.parametrize("which", ["publisher", "subscriber"])
async def test_more_important_objects_overtake_under_contention(tmp_path: Path,
                                                                which: str) -> None:
    # small relay send buffers so that the backlog waits in the relay's scheduler
    r = await relay_at(tmp_path, send_buffer_bytes=64 * 1024)
    ns = make_ns()
    low, high = FullTrackName(ns, b"k.raw.s0"), FullTrackName(ns, b"v.raw.s0")
    try:
        pub = await client(r)
        t_low = await push_track(pub, low, layers=GROUPS)
        t_high = await push_track(pub, high, layers=GROUPS, announce=False)
        # a slow link: small QUIC windows and a small receive queue, not read at first
        # (aioquic withholds credit; a qh3 client stops reading its socket: both slow the
        # relay down, docs/transport.md)
        sub = await client(r, config=SessionConfig(receive_queue=2),
                           settings=QuicSettings(max_data=128 * 1024,
                                                 max_stream_data=64 * 1024))

        def params(prio: int) -> Params:
            p = live_params()
            return Params(location_filter=p.location_filter, subscriber_priority=prio)

        sub_prio = {"publisher": (128, 128), "subscriber": (200, 1)}[which]
        pub_prio = {"publisher": (200, 1), "subscriber": (64, 64)}[which]
        s_low = await asyncio.wait_for(sub.subscribe(ns, low.name, params(sub_prio[0])), TIMEOUT)
        s_high = await asyncio.wait_for(sub.subscribe(ns, high.name, params(sub_prio[1])),
                                        TIMEOUT)
        # the less important Track is published first, the more important one after it
        await _push(t_low, pub_prio[0], GROUPS)
        await _push(t_high, pub_prio[1], GROUPS)
        # everything is at the relay (most of it queued there) before the subscriber reads
        await wait_cached(r, low, Location(GROUPS - 1, 8))
        await wait_cached(r, high, Location(GROUPS - 1, 8))

        order: list[str] = []

        async def read(s: Subscription, tag: str) -> None:
            async for ev in s:
                if isinstance(ev, ReceivedObject) and ev.status == ObjectStatus.NORMAL:
                    order.append(tag)
                    if order.count(tag) == GROUPS * 8:
                        return

        async with asyncio.timeout(TIMEOUT):
            await asyncio.gather(read(s_low, "low"), read(s_high, "high"))
        last_high = max(i for i, t in enumerate(order) if t == "high")
        last_low = max(i for i, t in enumerate(order) if t == "low")
        # FIFO would finish "high" last; priority scheduling finishes it well before "low"
        assert last_high < last_low
        # only what was already in flight when reading started precedes the last "high"
        tail = order[last_high + 1:]
        assert order.index("high") < 16 and tail == ["low"] * len(tail)
        assert len(tail) >= GROUPS * 8 - 16
    finally:
        await r.close()
