"""Namespace discovery and relay trees (kvcs-draft 5.1, profile §14.4)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from relay_helpers import (
    TIMEOUT,
    client,
    complete_track,
    drain,
    fetch_objects,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
)

from relay.moqt.codes import RequestErrorCode
from relay.moqt.primitives import FullTrackName
from relay.session import RequestRejected


async def test_subscribe_namespace_sees_present_and_later_publications(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    try:
        ns1 = make_ns()
        anchor_prefix = ns1[:4]
        ns2 = (*anchor_prefix, b"second-publication")
        other = make_ns()  # another anchor: must not be announced
        pub1 = await client(r)
        await asyncio.wait_for(pub1.publish_namespace(ns1), TIMEOUT)
        await asyncio.wait_for(pub1.publish_namespace(other), TIMEOUT)

        consumer = await client(r)
        nsub = await asyncio.wait_for(consumer.subscribe_namespace(anchor_prefix), TIMEOUT)
        it = aiter(nsub)
        ev = await asyncio.wait_for(anext(it), TIMEOUT)
        assert ev.active and ev.namespace == ns1 and ev.suffix == (ns1[4],)

        pub2 = await client(r)
        handle = await asyncio.wait_for(pub2.publish_namespace(ns2), TIMEOUT)
        ev = await asyncio.wait_for(anext(it), TIMEOUT)
        assert ev.active and ev.namespace == ns2

        handle.withdraw()
        ev = await asyncio.wait_for(anext(it), TIMEOUT)
        assert not ev.active and ev.namespace == ns2

        await pub1.aclose()  # its session ends: its namespaces are done
        ev = await asyncio.wait_for(anext(it), TIMEOUT)
        assert not ev.active and ev.namespace == ns1

        # an overlapping prefix on the same session is refused (§2.7)
        try:
            await asyncio.wait_for(consumer.subscribe_namespace(anchor_prefix[:2]), TIMEOUT)
        except RequestRejected as e:
            assert e.code == RequestErrorCode.PREFIX_OVERLAP
        else:
            raise AssertionError("overlapping SUBSCRIBE_NAMESPACE accepted")
    finally:
        await r.close()


async def test_a_prefix_asked_again_right_after_its_cancel_is_answered(tmp_path: Path) -> None:
    """A consumer that runs discovery twice on one session withdraws its requests and sends
    the same prefixes at once: the cancel reached the relay first, so no PREFIX_OVERLAP."""
    r = await relay_at(tmp_path)
    try:
        ns = make_ns()
        pub = await client(r)
        await asyncio.wait_for(pub.publish_namespace(ns), TIMEOUT)
        consumer = await client(r)
        for _ in range(5):
            sub = await asyncio.wait_for(consumer.subscribe_namespace(ns[:4]), TIMEOUT)
            ev = await asyncio.wait_for(anext(aiter(sub)), TIMEOUT)
            assert ev.active and ev.namespace == ns
            sub.cancel()
    finally:
        await r.close()


async def test_publisher_to_relay_a_to_relay_b_to_three_subscribers(tmp_path: Path) -> None:
    a = await relay_at(tmp_path / "a")
    b = await relay_at(tmp_path / "b", upstream=[a.url])
    names = [FullTrackName(make_ns(), b"k.raw.s0")]
    names.append(FullTrackName(names[0].namespace, b"v.raw.s0"))
    try:
        pub = await client(a)
        tracks = [await push_track(pub, n, layers=3, announce=(i == 0))
                  for i, n in enumerate(names)]
        await tracks[0].group(0, group_payloads(0, 4))
        await tracks[1].group(0, group_payloads(0, 4))

        # discovery through the tree: B asks A for the namespace
        c = await client(b)
        nsub = await asyncio.wait_for(c.subscribe_namespace(names[0].namespace[:4]), TIMEOUT)
        ev = await asyncio.wait_for(anext(aiter(nsub)), TIMEOUT)
        assert ev.namespace == names[0].namespace

        subs_sessions = [await client(b) for _ in range(3)]
        subs = [[await asyncio.wait_for(s.subscribe(n.namespace, n.name, live_params()),
                                        TIMEOUT) for n in names] for s in subs_sessions]
        for g in (1, 2):
            for t in tracks:
                await t.group(g, group_payloads(g, 4))
        for t in tracks:
            await t.end()
        async with asyncio.timeout(TIMEOUT):
            results = await asyncio.gather(*(drain(s) for row in subs for s in row))
        for i, got in enumerate(results):
            assert got.duplicates == []
            missing = sorted(set(tracks[i % 2].sent) - set(got.objects))
            assert got.objects == tracks[i % 2].sent, (i, missing, got.resets)
        # A holds exactly one subscription per Track from B, whatever B's fan-out
        assert b.relay.counters.upstream_subscriptions == len(names)
        assert a.relay.counters.ok("SUBSCRIBE") == len(names)

        # B FETCHes what it lacks from A after the publisher has gone
        await pub.aclose()
        late = await client(b)
        _resp, got = await fetch_objects(late, names[1])
        assert got == tracks[1].sent
    finally:
        await b.close()
        await a.close()


async def test_cold_relay_b_fetches_a_completed_track_through_a(tmp_path: Path) -> None:
    a = await relay_at(tmp_path / "a")
    b = await relay_at(tmp_path / "b", upstream=[a.url])
    name = FullTrackName(make_ns(), b"kv.zstd.s0")
    try:
        pub = await client(a)
        t = await complete_track(pub, name, layers=2, per_group=3)
        assert await a.relay.wait_committed(name, TIMEOUT)
        await pub.aclose()
        c = await client(b)
        _resp, got = await fetch_objects(c, name)
        assert got == t.sent
        assert b.relay.counters.upstream_fetches >= 1
    finally:
        await b.close()
        await a.close()


async def test_committed_publications_stay_discoverable_after_publisher_and_restart(
        tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=1)
        await t.group(0, group_payloads(0, 2))
        await t.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
        await pub.aclose()
        c = await client(r)
        nsub = await asyncio.wait_for(c.subscribe_namespace(name.namespace[:4]), TIMEOUT)
        ev = await asyncio.wait_for(anext(aiter(nsub)), TIMEOUT)
        assert ev.active and ev.namespace == name.namespace
    finally:
        await r.close()
    r2 = await relay_at(tmp_path)
    try:
        c = await client(r2)
        nsub = await asyncio.wait_for(c.subscribe_namespace(name.namespace[:4]), TIMEOUT)
        ev = await asyncio.wait_for(anext(aiter(nsub)), TIMEOUT)
        assert ev.active and ev.namespace == name.namespace
    finally:
        await r2.close()


async def test_a_namespace_evicted_from_lmdb_is_done(tmp_path: Path) -> None:
    r = await relay_at(tmp_path, lmdb_bytes=400 * 1024)
    first, second = (FullTrackName(make_ns(), b"k.raw.s0") for _ in range(2))
    try:
        watcher = await client(r)
        nsub = await asyncio.wait_for(watcher.subscribe_namespace((b"kvcs-1",)), TIMEOUT)
        events = aiter(nsub)
        for name in (first, second):  # each ~250 KiB: the second commit evicts the first
            pub = await client(r)
            t = await push_track(pub, name, layers=1)
            await t.group(0, group_payloads(0, 5, size=50_000))
            await t.end()
            assert await r.relay.wait_committed(name, TIMEOUT)
            await pub.aclose()
        seen: list[tuple[tuple[bytes, ...], bool]] = []
        async with asyncio.timeout(TIMEOUT):
            while (first.namespace, False) not in seen:
                ev = await anext(events)
                seen.append((ev.namespace, ev.active))
        assert (second.namespace, False) not in seen
        assert r.store.durable is not None and r.store.durable.evicted_tracks >= 1
    finally:
        await r.close()


def _pending_namespace_waits() -> list[asyncio.Task[object]]:
    """Tasks still waiting for a namespace event on behalf of some SUBSCRIBE_NAMESPACE."""
    return [t for t in asyncio.all_tasks() if not t.done() and "Queue.get" in repr(t.get_coro())]


async def test_a_cancelled_namespace_subscription_leaves_nothing_behind(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    table = r.relay.namespaces
    try:
        s = await client(r)
        before = len(_pending_namespace_waits())
        for _ in range(3):
            nsub = await asyncio.wait_for(s.subscribe_namespace((b"kvcs-1",)), TIMEOUT)
            assert table.listener_count() == 1
            nsub.cancel()
            # the relay drops the listener and the wait it had pending for it
            async with asyncio.timeout(TIMEOUT):
                while table.listener_count() or len(_pending_namespace_waits()) > before:
                    await asyncio.sleep(0)
        # and still answers a new one from the same session (no PREFIX_OVERLAP)
        await asyncio.wait_for(s.subscribe_namespace((b"kvcs-1",)), TIMEOUT)
    finally:
        await r.close()
