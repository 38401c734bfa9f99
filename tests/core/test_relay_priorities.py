"""Scheduling under a bottleneck downstream (§13, kvcs-draft 3.4): lower Publisher Priority
first, and Subscriber Priority between subscriptions of one session."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

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

from relay.core.scheduler import DEFAULT_SUBSCRIBER_PRIORITY
from relay.moqt.codes import ObjectStatus
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.session import FetchResponse, ReceivedObject, SessionConfig, Subscription
from relay.transport import QuicSettings

GROUPS = 8


async def _push(track: PushedTrack, priority: int, groups: int) -> None:
    for g in range(groups):
        w = await track.served.open_subgroup(g, 0, priority)
        for i, p in enumerate(group_payloads(g, 8, size=32 * 1024)):
            await w.write_object(i, p)
        await w.write_status(8, ObjectStatus.END_OF_GROUP, fin=True)


async def _arrival_order(streams: dict[str, Subscription | FetchResponse]) -> list[str]:
    """Read every ``GROUPS`` x 8 Objects of each (tag: subscription or FETCH) concurrently;
    the tags in the order the Objects arrived."""
    order: list[str] = []

    async def read(s: Subscription | FetchResponse, tag: str) -> None:
        async for ev in s:
            if isinstance(ev, ReceivedObject) and ev.status == ObjectStatus.NORMAL:
                order.append(tag)
                if order.count(tag) == GROUPS * 8:
                    return

    async with asyncio.timeout(TIMEOUT):
        await asyncio.gather(*(read(s, tag) for tag, s in streams.items()))
    return order


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

        order = await _arrival_order({"low": s_low, "high": s_high})
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


async def _fill_or_fetch(c: Any, name: FullTrackName, path: str, priority: int) -> Any:
    """A FETCH of the whole Track, or a subscription whose fill replays it: with SUBSCRIBE,
    or with the fill's own Subscriber Priority; for "update-fill" a subscription with that
    priority and no fill yet (its REQUEST_UPDATE asks for it)."""
    if path == "fetch":
        return await asyncio.wait_for(c.fetch(name.namespace, name.name), TIMEOUT)
    if path == "fetch-priority":  # the later layers' own 200; the earlier ones' default
        return await asyncio.wait_for(c.fetch(name.namespace, name.name, Params(
            subscriber_priority=priority if priority > DEFAULT_SUBSCRIBER_PRIORITY else None)),
            TIMEOUT)
    if path == "fill":
        params = live_params()
    elif path == "fill-priority":  # the fill's own priority, the subscription's default
        params = Params(location_filter=LocationFilter.next_object(),
                        fill=Params(location_filter=LocationFilter.absolute_start(0, 0),
                                    subscriber_priority=priority))
    else:
        params = Params(location_filter=LocationFilter.next_object(),
                        subscriber_priority=priority)
    return await asyncio.wait_for(c.subscribe(name.namespace, name.name, params), TIMEOUT)


@pytest.mark.parametrize("path", ["fetch", "fill", "fetch-priority", "fill-priority",
                                  "update-fill"])
async def test_fills_and_fetches_take_their_turn_by_priority(tmp_path: Path,
                                                             path: str) -> None:
    """Earlier layers first whichever path carries them: Objects on fill and fetch streams
    are scheduled with the session's other writes (§13, §9.4), not written around them.
    By Publisher Priority for a FETCH and a fill; by Subscriber Priority (the later layers'
    200, the earlier ones' 1, equal Publisher Priorities) for a fill that gives its own and
    for a fill a REQUEST_UPDATE asks for (the subscription's); for FETCHes, the later
    layers' 200 against the default of one that gives none."""
    r = await relay_at(tmp_path, send_buffer_bytes=64 * 1024)
    ns = make_ns()
    late, early = FullTrackName(ns, b"k.raw.s1"), FullTrackName(ns, b"k.raw.s0")
    by_publisher = path in ("fetch", "fill")
    updates: list[asyncio.Future[Any]] = []
    try:
        pub = await client(r)
        for name, prio in ((late, 200), (early, 1)):
            t = await push_track(pub, name, layers=GROUPS, announce=name == late)
            await _push(t, prio if by_publisher else 64, GROUPS)
            await wait_cached(r, name, Location(GROUPS - 1, 8))
        # This subscriber reads nothing until both requests are answered. On aioquic, its
        # credit follows its reads, so the relay stops at the windows and the second answer
        # still comes. A qh3 client instead stops reading its socket once half its windows
        # wait unread (docs/transport.md), and the later layers' first flight (131 KB at
        # qh3's 64 KiB datagrams on loopback) filled them before the second answer came:
        # the subscriber is aioquic's on both relays.
        sub = await client(r, config=SessionConfig(receive_queue=2),
                           settings=QuicSettings(max_data=128 * 1024, backend="aioquic",
                                                 max_stream_data=64 * 1024))
        # the later layers are asked for first, the earlier ones after them; both are
        # being written before the subscriber reads anything
        resp_late = await _fill_or_fetch(sub, late, path, 200)
        resp_early = await _fill_or_fetch(sub, early, path, 1)
        served = r.relay.counters.fetch if path.startswith("fetch") else r.relay.counters.fill
        if path == "update-fill":
            # the replies may wait behind the fills: they are awaited after reading
            fill = Params(fill=Params(location_filter=LocationFilter.absolute_start(0, 0)))
            for n, s in enumerate((resp_late, resp_early)):
                updates.append(asyncio.ensure_future(s.update(fill)))
                async with asyncio.timeout(TIMEOUT):
                    while served.in_flight.count <= n:
                        await asyncio.sleep(0)
        async with asyncio.timeout(TIMEOUT):
            while served.in_flight.count < 2:
                await asyncio.sleep(0)
        order = await _arrival_order({"late": resp_late, "early": resp_early})
        last_early = max(i for i, t in enumerate(order) if t == "early")
        tail = order[last_early + 1:]
        # only what was already in flight precedes the last of the earlier layers
        assert tail == ["late"] * len(tail) and len(tail) >= GROUPS * 8 - 16, order
        await asyncio.wait_for(asyncio.gather(*updates), TIMEOUT)
    finally:
        for u in updates:
            u.cancel()
        await r.close()


async def test_a_subscription_blocked_by_flow_control_does_not_stall_the_others(
        tmp_path: Path) -> None:
    """The subscriber never reads one subscription: its stream's flow-control window closes
    and the relay's buffer for it fills. The session's other subscription keeps flowing."""
    r = await relay_at(tmp_path, send_buffer_bytes=256 * 1024)
    ns = make_ns()
    stuck_name, flowing_name = FullTrackName(ns, b"k.raw.s0"), FullTrackName(ns, b"v.raw.s0")
    try:
        pub = await client(r)
        stuck = await push_track(pub, stuck_name, layers=1)
        flowing = await push_track(pub, flowing_name, layers=4, announce=False)
        # aioquic on the subscriber side whatever the pair: it withholds credit per stream
        # (a qh3 client that falls behind stops reading its whole socket instead, which
        # would stall every subscription of that session at the subscriber's own end)
        sub = await client(r, config=SessionConfig(receive_queue=2),
                           settings=QuicSettings(backend="aioquic", max_stream_data=64 * 1024,
                                                 max_data=8 << 20))
        params = Params(location_filter=LocationFilter.next_object())
        s_stuck = await asyncio.wait_for(sub.subscribe(ns, stuck_name.name, params), TIMEOUT)
        s_flowing = await asyncio.wait_for(sub.subscribe(ns, flowing_name.name, params),
                                           TIMEOUT)
        # far more than the subscriber's stream window plus the relay's stream buffer
        w = await stuck.served.open_subgroup(0, 0, 0)
        for i in range(48):
            await w.write_object(i, os.urandom(16 * 1024))
        await wait_cached(r, stuck_name, Location(0, 47))
        for g in range(4):
            await flowing.group(g, group_payloads(g, 8, size=16 * 1024))
        got: dict[Location, bytes] = {}
        async with asyncio.timeout(TIMEOUT):
            async for ev in s_flowing:
                if isinstance(ev, ReceivedObject) and ev.status == ObjectStatus.NORMAL:
                    got[ev.location] = bytes(ev.payload)
                    if len(got) == len(flowing.sent):
                        break
        assert got == flowing.sent
        # ... while the unread subscription is still held back (the test did block it)
        fwd = next(iter(r.relay.tracks[stuck_name].forwarders))
        assert fwd.pending > 0  # Objects of it still wait to be sent
        s_stuck.cancel()
    finally:
        await r.close()
