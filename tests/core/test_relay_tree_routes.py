"""Relay trees that route both ways (MOQT-PROFILE §14.4 "Announcing upward", docs/relay.md
"Trees"): a Track published at any relay is found and served from every other, cached at
every hop, and nothing loops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    PushedTrack,
    client,
    complete_track,
    drain,
    fetch_objects,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.core.namespaces import PublisherEntry
from relay.core.relay import RelayOptions
from relay.core.routing import RELAY_IMPLEMENTATION
from relay.moqt.codes import RequestErrorCode
from relay.moqt.primitives import FullTrackName, Location, TrackNamespace
from relay.service import RunningRelay
from relay.session import MoqtSession, NamespaceEvent, RequestRejected, SessionConfig
from relay.session.tokens import tokens_of
from storage.interface import Tier


async def until_namespace(session: MoqtSession, prefix: TrackNamespace,
                          namespace: TrackNamespace) -> AsyncIterator[NamespaceEvent]:
    """SUBSCRIBE_NAMESPACE on ``prefix`` and read until ``namespace`` is announced; the
    event iterator, for what comes next."""
    nsub = await asyncio.wait_for(session.subscribe_namespace(prefix), TIMEOUT)
    events = aiter(nsub)
    async with asyncio.timeout(TIMEOUT):
        while True:
            ev = await anext(events)
            if ev.active and ev.namespace == namespace:
                return events


def requests_served(r: RunningRelay) -> int:
    """Every request a relay answered for its clients (lower relays included)."""
    return sum(r.relay.counters.requests.values())


def sources(r: RunningRelay, ns: TrackNamespace) -> list[PublisherEntry]:
    return r.relay.namespaces.sources_of(ns)


async def test_depth_three_tree_serves_a_publication_at_a_leaf_everywhere(
        tmp_path: Path) -> None:
    # R at the root; M under R; A under M; B under R; publisher at A
    r = await relay_at(tmp_path / "r")
    m = await relay_at(tmp_path / "m", upstream=[r.url])
    a = await relay_at(tmp_path / "a", upstream=[m.url])
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    relays = [a, m, r, b]
    ns = make_ns()
    k, v = FullTrackName(ns, b"k.raw.s0"), FullTrackName(ns, b"v.raw.s0")
    try:
        pub = await client(a)
        tracks: list[PushedTrack] = [await push_track(pub, k, layers=4),
                                     await push_track(pub, v, layers=4, announce=False)]
        for g in (0, 1):
            for t in tracks:
                await t.group(g, group_payloads(g, 3))

        # discovery: every relay of the tree finds the publication
        for x in relays:
            await until_namespace(await client(x), ns[:4], ns)
        # the root learned the namespace from M, M from A, each as its own (announced up)
        assert [e.upstream for e in sources(r, ns)] == [False]
        assert [e.upstream for e in sources(m, ns)] == [False]

        # a live subscription at B joined mid-production gets the past (fill) and the rest
        sb = await client(b)
        sub = await asyncio.wait_for(sb.subscribe(k.namespace, k.name, live_params()),
                                     TIMEOUT)
        for g in (2, 3):
            for t in tracks:
                await t.group(g, group_payloads(g, 3))
        for t in tracks:
            await t.end()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        assert got.objects == tracks[0].sent and got.duplicates == []

        # FETCH at every relay, bit for bit, from what the tree cached
        for x in (r, m, b):
            c = await client(x)
            for t in tracks:
                _resp, objects = await fetch_objects(c, t.full_name)
                assert objects == t.sent, (x.url, t.full_name.name)

        # nothing goes back to A once the tree holds it: a second consumer at B is served
        # by B, a consumer at a fourth relay D by R
        d = await relay_at(tmp_path / "d", upstream=[r.url])
        relays.append(d)
        at_a, at_m = requests_served(a), requests_served(m)
        at_r = requests_served(r)
        b_up = b.relay.counters.upstream_fetches
        for x in (b, d):
            c = await client(x)
            for t in tracks:
                _resp, objects = await fetch_objects(c, t.full_name)
                assert objects == t.sent
        assert b.relay.counters.upstream_fetches == b_up
        assert requests_served(a) == at_a and requests_served(m) == at_m
        assert requests_served(r) > at_r  # D's requests were R's to answer
    finally:
        for x in reversed(relays):
            await x.close()


async def test_a_restarted_leaf_announces_its_lmdb_tracks_to_a_new_root(
        tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "r")
    a = await relay_at(tmp_path / "a", upstream=[r.url])
    name = FullTrackName(make_ns(), b"kv.raw.s0")
    try:
        pub = await client(a)
        t = await complete_track(pub, name, layers=3, per_group=4)
        assert await a.relay.wait_committed(name, TIMEOUT)
        await pub.aclose()
    finally:
        await a.close()
        await r.close()
    # a new root that never saw it, A restarted under it, B beside: A's LMDB is announced
    r2 = await relay_at(tmp_path / "r2")
    a2 = await relay_at(tmp_path / "a", upstream=[r2.url])
    b = await relay_at(tmp_path / "b", upstream=[r2.url])
    try:
        c = await client(b)
        await until_namespace(c, name.namespace[:4], name.namespace)
        _resp, got = await fetch_objects(c, name)
        assert got == t.sent
        assert a2.relay.counters.lmdb_committed_tracks == 0  # served from A's LMDB
        assert a2.relay.counters.fetch.objects[Tier.LMDB] > 0
    finally:
        await b.close()
        await a2.close()
        await r2.close()


async def test_announcements_never_loop_or_echo(tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "r")
    a = await relay_at(tmp_path / "a", upstream=[r.url])
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    ns_a, ns_b = make_ns(), make_ns()
    try:
        # a consumer at each of A and B subscribes to both prefixes: each relay then holds
        # an upstream namespace subscription at R covering the other's namespace and its own
        pa, pb = await client(a), await client(b)
        await asyncio.wait_for(pa.publish_namespace(ns_a), TIMEOUT)
        await asyncio.wait_for(pb.publish_namespace(ns_b), TIMEOUT)
        ca, cb = await client(a), await client(b)
        await until_namespace(ca, (b"kvcs-1",), ns_b)
        await until_namespace(cb, (b"kvcs-1",), ns_a)
        # the root holds each namespace once, from the relay it was published at
        assert [(e.source in r.relay.sessions, e.upstream) for e in sources(r, ns_a)] == \
            [(True, False)]
        assert len(sources(r, ns_b)) == 1
        # what A learned from R is not its own, and R never told A of A's own namespace
        assert [e.upstream for e in sources(a, ns_b)] == [True]
        assert [e.upstream for e in sources(a, ns_a)] == [False]
        # nothing learned from above went up again: one announcement per relay (for all
        # of KVCS), and R learned only each relay's own namespace under it
        for x in (a, b):
            assert x.relay.announcer is not None
            assert x.relay.announcer.announced == [(b"kvcs-1",)]
        assert r.relay.announcer is None

        # a request for a Track nobody publishes under A's namespace travels B -> R -> A
        # once and ends DOES_NOT_EXIST: A answers from its own sources, never back up
        before_r = r.relay.counters.upstream_subscriptions
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(cb.subscribe(ns_a, b"k.raw.s9", live_params()), TIMEOUT)
        assert e.value.code == RequestErrorCode.DOES_NOT_EXIST
        refused = ("SUBSCRIBE", RequestErrorCode.DOES_NOT_EXIST)
        assert a.relay.counters.requests.get(refused) == 1
        assert a.relay.counters.upstream_subscriptions == 0
        assert r.relay.counters.upstream_subscriptions == before_r
    finally:
        for x in (b, a, r):
            await x.close()


async def test_withdrawn_at_the_leaf_is_withdrawn_everywhere(tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "r")
    a = await relay_at(tmp_path / "a", upstream=[r.url])
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    ns1 = make_ns()
    ns2 = (*ns1[:4], b"second")  # same scope and anchor: one announcement carries both
    try:
        p1, p2 = await client(a), await client(a)
        await asyncio.wait_for(p1.publish_namespace(ns1), TIMEOUT)
        h2 = await asyncio.wait_for(p2.publish_namespace(ns2), TIMEOUT)
        events = await until_namespace(await client(b), ns1[:4], ns1)
        assert a.relay.announcer is not None
        async with asyncio.timeout(TIMEOUT):
            while (ev := await anext(events)).namespace != ns2:
                pass
            assert ev.active
            assert a.relay.announcer.announced == [ns1[:1]]  # aggregated: one for both
            h2.withdraw()
            ev = await anext(events)
            assert (ev.namespace, ev.active) == (ns2, False)
            await p1.aclose()  # the last source under the prefix: the announcement ends
            ev = await anext(events)
            assert (ev.namespace, ev.active) == (ns1, False)
            assert a.relay.announcer.announced == []
    finally:
        for x in (b, a, r):
            await x.close()


@pytest.mark.parametrize("leaf_knows_token", [False, True])
async def test_announcing_up_is_authorized_per_scope(tmp_path: Path,
                                                     leaf_knows_token: bool) -> None:
    """The lower relay's --upstream-token needs `publish` for what it announces. It
    announces one wide prefix ("kvcs-1"), which the upstream accepts from a lower relay
    whose token covers any of it, and admits each namespace under it by that token: an
    uncovered scope is counted, stays served at the lower relay, and breaks nothing else. A
    lower relay whose own token table holds that token never shows the upstream a scope it
    does not cover."""
    covered, other = make_ns(), make_ns()
    grants: list[dict[str, object]] = [
        {"token": "relay-a", "prefixes": [f"kvcs-1/hex:{covered[1].hex()}"],
         "roles": ["publish", "subscribe"]},
        {"token": "relay-b", "prefixes": ["kvcs-1"], "roles": ["subscribe"]}]
    r = await relay_at(tmp_path / "r", auth_tokens=grants)
    # A's own table: the tree's, plus its publishers' token
    own = [*grants, {"token": "pub", "prefixes": ["kvcs-1"], "roles": ["publish", "subscribe"]}]
    a = await relay_at(tmp_path / "a", upstream=[r.url], upstream_token=b"relay-a",
                       auth_tokens=own if leaf_knows_token else None)
    b = await relay_at(tmp_path / "b", upstream=[r.url], upstream_token=b"relay-b")
    token = {"config": SessionConfig(authorization_tokens=tokens_of(b"pub"))} \
        if leaf_knows_token else {}
    try:
        pub = await client(a, **token)
        names = [FullTrackName(ns, b"kv.raw.s0") for ns in (other, covered)]
        tracks = [await push_track(pub, n, layers=1) for n in names]
        for t in tracks:
            await t.group(0, group_payloads(0, 2))
            await t.end()
        c = await client(b)
        await until_namespace(c, covered[:4], covered)
        _resp, got = await fetch_objects(c, names[1])
        assert got == tracks[1].sent
        counters = a.relay.counters
        if leaf_knows_token:  # decided at A: never shown to R
            assert counters.upstream_announcements_uncovered == 1
            assert r.relay.counters.auth_failures == 0
        else:  # decided at R: listed by A, not admitted, counted there
            async with asyncio.timeout(TIMEOUT):
                while r.relay.counters.auth_failures == 0:
                    await asyncio.sleep(0)
            assert counters.upstream_announcements_uncovered == 0
        assert counters.upstream_announcements_refused == 0
        assert a.relay.announcer is not None
        assert a.relay.announcer.announced == [(b"kvcs-1",)]
        # R routes the covered namespace down to A, and knows nothing of the other one
        assert sources(r, other) == [] and sources(r, (b"kvcs-1",)) == []
        [entry] = sources(r, covered)  # learned from A, on A's upstream session
        # the uncovered scope is served where it was published, and unknown above
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(c.fetch(other, b"kv.raw.s0"), TIMEOUT)
        assert e.value.code == RequestErrorCode.DOES_NOT_EXIST
        _resp, got = await fetch_objects(await client(a, **token), names[0])
        assert got == tracks[0].sent
        # the upstream may ask A for what A offered it: with A's token known at A, never
        # for a scope that token does not cover (otherwise A trusts the upstream it dialled,
        # which admitted nothing of that scope and so routes nothing of it down)
        down = entry.source
        assert down.peer_setup.moqt_implementation == RELAY_IMPLEMENTATION
        if leaf_knows_token:
            with pytest.raises(RequestRejected) as e:
                await asyncio.wait_for(down.fetch(other, b"kv.raw.s0"), TIMEOUT)
            assert e.value.code == RequestErrorCode.UNAUTHORIZED
        _resp, got = await fetch_objects(down, names[1])
        assert got == tracks[1].sent
        up = a.relay.upstream
        assert up is not None and up.connects == 1 and up.lost == 0
    finally:
        for x in (b, a, r):
            await x.close()


@pytest.mark.parametrize("push", [True, False])
async def test_pushed_up_tracks_outlive_the_lower_relay(tmp_path: Path, push: bool) -> None:
    """upstream_push: what A's publisher PUBLISHes reaches R as it arrives, so R serves it
    after A has gone; without it, R knew it only through A."""
    r = await relay_at(tmp_path / "r")
    a = await relay_at(tmp_path / "a", upstream=[r.url],
                       options=RelayOptions(upstream_push=push))
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    name = FullTrackName(make_ns(), b"kv.raw.s0")
    try:
        pub = await client(a)
        t = await complete_track(pub, name, layers=3, per_group=4)
        if push:  # the root holds the whole Track: its Largest Object alone is not enough,
            # the End of Track can overtake a Group still on its way (another stream); and
            # wait_committed answers False at once for a Track the root has not met yet
            await wait_cached(r, name, Location(3, 0))
            assert await r.relay.wait_committed(name, TIMEOUT)
        await a.close()
        c = await client(b)
        if push:
            _resp, got = await fetch_objects(c, name)
            assert got == t.sent
            assert a.relay.counters.upstream_pushes == 1
            assert r.relay.counters.upstream_fetches == 0  # nothing pulled from A
        else:
            with pytest.raises(RequestRejected) as e:
                await asyncio.wait_for(c.fetch(name.namespace, name.name), TIMEOUT)
            assert e.value.code == RequestErrorCode.DOES_NOT_EXIST
            assert a.relay.counters.upstream_pushes == 0
    finally:
        for x in (b, a, r):
            await x.close()


async def test_announced_again_after_failover_to_the_next_upstream(tmp_path: Path) -> None:
    """The upstream session lost, the link fails over to the next --upstream URL and every
    announcement is made again there."""
    r1 = await relay_at(tmp_path / "r1")
    r2 = await relay_at(tmp_path / "r2")
    a = await relay_at(tmp_path / "a", upstream=[r1.url, r2.url])
    ns = make_ns()
    closed = False
    try:
        pub = await client(a)
        await asyncio.wait_for(pub.publish_namespace(ns), TIMEOUT)
        await until_namespace(await client(r1), ns[:4], ns)
        up = a.relay.upstream
        assert up is not None and up.connects == 1
        await r1.close()  # the first upstream goes away
        closed = True
        await until_namespace(await client(r2), ns[:4], ns)
        assert up.connects == 2
        assert a.relay.announcer is not None and a.relay.announcer.announced == [ns[:1]]
    finally:
        await a.close()
        await r2.close()
        if not closed:
            await r1.close()


async def test_what_an_edge_keeps_of_a_gone_upstream_is_never_announced_up(
        tmp_path: Path) -> None:
    """Found by tests/net (a cut link): an edge holding Objects of a namespace it learned
    from its upstream keeps it discoverable when that upstream goes, as learned, not as its
    own. Announced up once the link is back, the upstream would route the edge's own
    request for the Track back down to the edge (which waits for its request up): 5 s of
    no answer. Here the link fails over to a second root, which must never hear of it."""
    r1 = await relay_at(tmp_path / "r1")
    r2 = await relay_at(tmp_path / "r2")
    edge = await relay_at(tmp_path / "e", upstream=[r1.url, r2.url])
    ns = make_ns()
    name = FullTrackName(ns, b"k.raw.s0")
    closed = False
    try:
        pub = await client(r1)
        t = await complete_track(pub, name, layers=2, per_group=2)
        c = await client(edge)
        await until_namespace(c, ns[:2], ns)
        _resp, got = await fetch_objects(c, name)
        assert got == t.sent
        up = edge.relay.upstream
        # learned from R1 and kept (the edge holds the Track): both learned, neither own
        assert up is not None and [e.upstream for e in sources(edge, ns)] == [True, True]
        first = up.session
        assert first is not None
        await r1.close()
        closed = True
        await asyncio.wait_for(first.wait_closed(), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            while any(e.source is first for e in sources(edge, ns)):  # the edge noticed
                await asyncio.sleep(0)
        # kept: still discoverable and served at the edge, still learned
        assert [e.upstream for e in sources(edge, ns)] == [True]
        assert edge.relay.announcer is not None and not edge.relay.announcer.offered(ns)
        _resp, got = await fetch_objects(await client(edge), name)
        assert got == t.sent
        # a request that reaches r2 dials the second root; it hears nothing of ns
        with pytest.raises(RequestRejected):
            await asyncio.wait_for(c.fetch(make_ns(), b"k.raw.s0"), TIMEOUT)
        assert up.connects == 2
        assert edge.relay.announcer.announced == [] and sources(r2, ns) == []
    finally:
        await edge.close()
        await r2.close()
        if not closed:
            await r1.close()


async def test_an_edge_serves_what_it_learned_of_absence_while_its_origin_is_dead(
        tmp_path: Path) -> None:
    """Issue 26 item 3: a publication fetched once through an edge (its manifest.cose
    answered DOES_NOT_EXIST by the origin), then the origin dies: the edge still serves the
    publication, and says manifest.cose does not exist rather than "upstream unreachable";
    a Track it learned nothing about is still TIMEOUT."""
    origin = await relay_at(tmp_path / "o")
    edge = await relay_at(tmp_path / "e", upstream=[origin.url])
    ns = make_ns()
    name = FullTrackName(ns, b"manifest")
    closed = False
    try:
        pub = await client(origin)
        t = await push_track(pub, name, layers=1)
        await t.group(0, group_payloads(0, 2))
        await t.end()
        c = await client(edge)
        for code in (RequestErrorCode.DOES_NOT_EXIST, RequestErrorCode.DOES_NOT_EXIST):
            with pytest.raises(RequestRejected) as e:  # asked twice: learned once is enough
                await asyncio.wait_for(c.fetch(ns, b"manifest.cose"), TIMEOUT)
            assert e.value.code == code
        _resp, got = await fetch_objects(c, name)
        assert got == t.sent
        await origin.close()
        closed = True
        up = edge.relay.upstream
        assert up is not None
        async with asyncio.timeout(TIMEOUT):
            while up.session is not None:  # the edge noticed (the origin closed its session)
                await asyncio.sleep(0)
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(c.fetch(ns, b"manifest.cose"), TIMEOUT)
        assert e.value.code == RequestErrorCode.DOES_NOT_EXIST
        _resp, got = await fetch_objects(c, name)
        assert got == t.sent
        for ask in (c.fetch(ns, b"k.raw.s0"), c.track_status(ns, b"k.raw.s0")):
            with pytest.raises(RequestRejected) as e:
                await asyncio.wait_for(ask, TIMEOUT)
            assert e.value.code == RequestErrorCode.TIMEOUT
    finally:
        await edge.close()
        if not closed:
            await origin.close()
