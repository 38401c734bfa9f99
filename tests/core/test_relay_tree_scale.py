"""Trees under load (issue 35): request streams between relays are a bounded resource (a qh3
peer grants 100 bidirectional streams, our aioquic relay 256), so nothing a tree holds per
consumer, per prefix or per scope may grow with their number (docs/relay.md, "Request
streams"). Each test asks for more than either peer grants."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
from relay_helpers import (
    TIMEOUT,
    client,
    complete_track,
    fetch_objects,
    make_ns,
    relay_at,
    serve_peer,
)

from relay.admin import links_state
from relay.core.namespaces import CACHE, PublisherEntry
from relay.core.relay import RelayOptions
from relay.kvcs.namespace import content_prefix
from relay.kvcs.plan import PublicationPlan
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens
from relay.metrics import request_streams_metric
from relay.moqt.codes import ObjectStatus
from relay.moqt.primitives import FullTrackName, Location
from relay.peers.connect import RelayAccess
from relay.peers.discovery import discover
from relay.peers.errors import EXIT_OK
from relay.peers.publisher import PublishOptions, publish_plan
from relay.peers.subscriber import RetrieveOptions, retrieve
from relay.service import RunningRelay
from relay.session import (
    IncomingPublishNamespace,
    MoqtSession,
    ReceivedObject,
    SessionHandler,
)
from storage.interface import StoredObject
from storage.lmdb_store import LmdbStore

SCOPE_KEY = bytes(range(32))
BLOCK_TOKENS = 4
PROMPTS, BLOCKS = 20, 16  # 320 distinct discovery prefixes in all
SCOPES = 300


def _access(r: RunningRelay) -> RelayAccess:
    return RelayAccess((r.url,), ca_file=r.certfile)


async def _until(cond: object, what: str) -> None:
    """Until ``cond()`` holds, re-checked at every turn of the loop (bounded)."""
    async with asyncio.timeout(TIMEOUT):
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.01)  # poll step: stream credit moves with no event here
    assert cond(), what  # type: ignore[operator]


async def _holds_nothing_upstream(edge: RunningRelay) -> None:
    """Until the edge holds no namespace subscription and no request at its upstream."""
    held, link = edge.relay.routing.upstream_namespaces, edge.relay.upstream
    assert held is not None and link is not None
    await _until(lambda: held.held == [] and _out_in_use(link.session) == 0,
                 "the edge holds nothing at its upstream")


def _gauge(r: RunningRelay, link: str, direction: str, state: str) -> float:
    """A sample of kvcs_relay_request_streams as the relay's /metrics reports it."""
    metric = request_streams_metric(r.relay)
    [value] = [s.value for s in metric.samples
               if s.labels == {"link": link, "direction": direction, "state": state}]
    return value


def _out_in_use(session: MoqtSession | None) -> int:
    return session.request_streams().out_in_use if session is not None else 0


async def test_consumers_at_an_edge_ask_hundreds_of_prefixes_and_give_them_back(
        tmp_path: Path) -> None:
    """20 consumers with distinct 16-block prompts at an edge B under a root R: B asks R
    for 320 distinct prefixes in all, more than R grants at once; every retrieval is
    complete and bit for bit, and B's link to R holds no request afterwards."""
    r = await relay_at(tmp_path / "r")
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    d = synthetic_descriptor(2, 1, 8, "float16", block_tokens=BLOCK_TOKENS)
    try:
        caches = []
        for seed in range(PROMPTS):
            k, v = synthetic_kv(2, 1, 8, BLOCKS * BLOCK_TOKENS, "float16", seed)
            tokens = synthetic_tokens(BLOCKS * BLOCK_TOKENS, seed + 1000)
            caches.append((k, v, tokens))
            await asyncio.wait_for(publish_plan(
                PublicationPlan(k, v, d, SCOPE_KEY, tokens), _access(r), PublishOptions()),
                TIMEOUT)
        link = b.relay.upstream
        assert link is not None
        up = await asyncio.wait_for(link.get(), TIMEOUT)
        baseline = _out_in_use(up)
        asked = r.relay.counters.ok("SUBSCRIBE_NAMESPACE")
        for k, v, tokens in caches:
            got = await asyncio.wait_for(retrieve(RetrieveOptions(
                _access(b), d, SCOPE_KEY, tokens)), TIMEOUT)
            assert got.exit_code == EXIT_OK, got.report
            assert np.array_equal(got.k, k) and np.array_equal(got.v, v)
        # B asked R for every consumer's prefixes: more than R lets B hold at once
        assert r.relay.counters.ok("SUBSCRIBE_NAMESPACE") - asked >= PROMPTS * BLOCKS
        held = b.relay.routing.upstream_namespaces
        assert held is not None
        await _until(lambda: held.held == [] and _out_in_use(link.session) == baseline,
                     "B's requests at R given back")
        # and R sees the same on its side of the link
        [b_at_r] = [x for x in r.relay.sessions if r.relay.routing.is_tree_relay(x)]
        await _until(lambda: b_at_r.request_streams().in_in_use == baseline,
                     "R holds no more of B's requests than before")
        # as reported: B's /metrics and /admin/state, R's /metrics from its side
        [upstream] = [e for e in links_state(b.relay) if e["link"] == "upstream"]
        assert upstream["requests_out"]["in_use"] == baseline
        assert upstream["namespace_subscriptions"] == []
        assert upstream["requests_out"]["granted"] >= 100
        assert _gauge(b, "upstream", "out", "in_use") == baseline
        assert _gauge(r, "lower_relay", "in", "in_use") == baseline
        assert _gauge(r, "lower_relay", "in", "granted") >= 100
    finally:
        await b.close()
        await r.close()


async def _publish_scope(session: MoqtSession, name: FullTrackName, payload: bytes) -> None:
    """A complete one-Object Track pushed with PUBLISH alone (its namespace is listed while
    it is pushed, and held in LMDB once complete)."""
    served = await asyncio.wait_for(session.publish(name.namespace, name.name), TIMEOUT)
    w = await served.open_subgroup(0, 0, 0)
    await w.write_object(0, payload)
    await w.write_status(1, ObjectStatus.END_OF_GROUP, fin=True)
    w = await served.open_subgroup(1, 0, 0)
    await w.write_status(0, ObjectStatus.END_OF_TRACK, fin=True)
    await served.done()


async def _fetch_all(r: RunningRelay, names: list[FullTrackName],
                     payloads: dict[FullTrackName, bytes]) -> None:
    c = await client(r)
    for name in names:
        resp = await asyncio.wait_for(c.fetch(name.namespace, name.name), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            got = {e.location: bytes(e.payload) for e in await resp.collect()}
        assert got == {Location(0, 0): payloads[name]}, name
    await c.aclose()


async def test_hundreds_of_scopes_at_a_lower_relay_are_announced_and_served(
        tmp_path: Path) -> None:
    """300 scopes published at A under R (more than R grants A's session at once): all
    announced with one request, all fetchable at a sibling S of A; again at a new sibling
    after A restarts on its LMDB."""
    r = await relay_at(tmp_path / "r")
    a = await relay_at(tmp_path / "a", upstream=[r.url])
    s = await relay_at(tmp_path / "s", upstream=[r.url])
    names = [FullTrackName(make_ns(), b"k.raw.s0") for _ in range(SCOPES)]
    payloads = {n: n.namespace[1] * 8 for n in names}
    relays = [r, a, s]
    try:
        pub = await client(a)
        for n in names:
            await _publish_scope(pub, n, payloads[n])
        for n in names:
            assert await a.relay.wait_committed(n, TIMEOUT)
        await pub.aclose()
        await _until(lambda: all(r.relay.namespaces.sources_of(n.namespace) for n in names),
                     "R knows every scope")
        ann = a.relay.announcer
        assert ann is not None and ann.announced == [(b"kvcs-1",)]
        # A's link to R holds one announcement (R holds one namespace subscription down)
        assert a.relay.upstream is not None and _out_in_use(a.relay.upstream.session) == 1
        await _fetch_all(s, names, payloads)

        await a.close()
        relays.remove(a)
        a = await relay_at(tmp_path / "a", upstream=[r.url])
        relays.append(a)
        s2 = await relay_at(tmp_path / "s2", upstream=[r.url])
        relays.append(s2)
        await _until(lambda: all(
            any(e.source is not None and not getattr(e.source, "closed", False)
                for e in r.relay.namespaces.sources_of(n.namespace)) for n in names),
            "R knows every scope from the restarted A")
        await _fetch_all(s2, names, payloads)
        assert a.relay.counters.lmdb_committed_tracks == 0  # served from A's LMDB
    finally:
        for x in reversed(relays):
            await x.close()


async def test_a_wider_prefix_takes_over_narrower_ones_at_the_upstream(
        tmp_path: Path) -> None:
    """One session holds no overlapping SUBSCRIBE_NAMESPACE (§2.7): a consumer at B asking
    a prefix wider than one B holds at R gets everything R knows under it (B's subscription
    is replaced by the wider one), and the consumer of the narrower prefix sees no
    namespace withdrawn meanwhile; both gone, B holds nothing at R."""
    r = await relay_at(tmp_path / "r")
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    ns1, ns2 = make_ns(), make_ns()
    ns3 = (*ns1[:4], b"third")
    try:
        pub = await client(r)
        for ns in (ns1, ns2):
            await asyncio.wait_for(pub.publish_namespace(ns), TIMEOUT)
        c1, c2 = await client(b), await client(b)
        narrow = await asyncio.wait_for(c1.subscribe_namespace(ns1[:4]), TIMEOUT)
        events1 = aiter(narrow)
        ev = await asyncio.wait_for(anext(events1), TIMEOUT)
        assert (ev.namespace, ev.active) == (ns1, True)
        held = b.relay.routing.upstream_namespaces
        assert held is not None and held.held == [ns1[:4]]
        wide = await asyncio.wait_for(c2.subscribe_namespace((b"kvcs-1",)), TIMEOUT)
        events2 = aiter(wide)
        seen = set()
        async with asyncio.timeout(TIMEOUT):
            while seen != {ns1, ns2}:
                ev = await anext(events2)
                assert ev.active
                seen.add(ev.namespace)
        assert held.held == [(b"kvcs-1",)]
        await asyncio.wait_for(pub.publish_namespace(ns3), TIMEOUT)
        ev = await asyncio.wait_for(anext(events1), TIMEOUT)  # nothing withdrawn before it
        assert (ev.namespace, ev.active) == (ns3, True)
        wide.cancel()
        narrow.cancel()
        await _holds_nothing_upstream(b)
    finally:
        await b.close()
        await r.close()


class _AnswersTheSecondTime(SessionHandler):
    """An upstream that never answers the first PUBLISH_NAMESPACE (no stream credit, a lost
    packet, a busy relay: the announcement times out), and accepts the next one."""

    def __init__(self) -> None:
        self.asked = 0
        self.accepted = asyncio.Event()

    async def publish_namespace(self, req: IncomingPublishNamespace) -> None:
        self.asked += 1
        if self.asked == 1:
            await asyncio.Event().wait()  # never: the lower relay gives it up
        await req.accept()
        self.accepted.set()
        await req.withdrawn.wait()


async def test_an_announcement_that_failed_is_sent_again(tmp_path: Path) -> None:
    upstream = _AnswersTheSecondTime()
    srv = await serve_peer(tmp_path / "tls", upstream)
    a = await relay_at(tmp_path / "a", upstream=[f"moqt://127.0.0.1:{srv.port}/"],
                       options=RelayOptions(default_fill_timeout=0.3))
    try:
        pub = await client(a)
        await asyncio.wait_for(pub.publish_namespace(make_ns()), TIMEOUT)
        await asyncio.wait_for(upstream.accepted.wait(), TIMEOUT)
        assert upstream.asked == 2 and a.relay.counters.upstream_announcements_retried == 1
        ann = a.relay.announcer
        assert ann is not None
        await _until(lambda: ann.announced == [(b"kvcs-1",)], "announced on the retry")
    finally:
        await a.close()
        await srv.close()


async def test_many_consumers_discovering_at_once_at_an_edge_all_find_theirs(
        tmp_path: Path) -> None:
    """16 consumers at once at an edge, each discovering its own 16-block prompt: 256
    prefixes asked of the root together, more than the edge may hold there at once (half of
    what the root grants). Each finds its publication (the oldest answered subscriptions
    give their place up, keeping what they announced), and the edge holds nothing after."""
    scope, compat = os.urandom(32), os.urandom(32)
    prompts = [[os.urandom(32) for _ in range(BLOCKS)] for _ in range(16)]
    namespaces = [(*content_prefix(scope, compat, p[-1]), os.urandom(16)) for p in prompts]
    store = LmdbStore(os.fspath(tmp_path / "r" / "lmdb"), 64 << 20)
    try:
        for ns in namespaces:
            store.commit_track((ns, b"manifest"), [[
                StoredObject(0, 0, 0, 0, ObjectStatus.NORMAL, b"", b"x" * 64),
                StoredObject(0, 0, 1, 0, ObjectStatus.END_OF_TRACK)]])
    finally:
        store.close()
    r = await relay_at(tmp_path / "r")
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    try:
        sessions = [await client(b) for _ in prompts]
        found = await asyncio.wait_for(asyncio.gather(*(
            discover(s, scope, compat, p, window=0.0) for s, p in zip(sessions, prompts,
                                                                       strict=True))),
            TIMEOUT)
        assert [f[0].namespace.fields if f else None for f in found] == namespaces
        held = b.relay.routing.upstream_namespaces
        assert held is not None and held.frozen > 0  # more than it could hold at once
        for s in sessions:
            await s.aclose()
        await _holds_nothing_upstream(b)
    finally:
        await b.close()
        await r.close()


async def test_more_live_tracks_than_the_upstream_grants_streams_are_followed(
        tmp_path: Path) -> None:
    """An edge follows one upstream subscription per live Track, each holding a stream of its
    session to the root for as long as the Track lives. More live Tracks than the root
    grants streams at once (qh3: 100, our aioquic relay: 256): the edge opens another session
    to the root for what finds no stream left, so every one is followed and a FETCH still
    gets through."""
    r = await relay_at(tmp_path / "r")
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    try:
        probe = await client(r)
        n = probe.request_streams().out_granted + 20  # what the root grants a session, and more
        ns = make_ns()
        names = [FullTrackName(ns, b"k.raw.s%d" % i) for i in range(n)]
        per_session = 90  # the root grants each publisher session at least 100
        publishers = [await client(r) for _ in range(0, n, per_session)]
        await asyncio.wait_for(publishers[0].publish_namespace(ns), TIMEOUT)
        served = [await asyncio.wait_for(
            publishers[i // per_session].publish(name.namespace, name.name), TIMEOUT)
            for i, name in enumerate(names)]
        consumers = [await client(b) for _ in range(0, n, per_session)]
        subs = [await asyncio.wait_for(
            consumers[i // per_session].subscribe(name.namespace, name.name), TIMEOUT)
            for i, name in enumerate(names)]
        link = b.relay.upstream
        assert link is not None and len(link.sessions()) >= 2  # one could not carry them all
        assert b.relay.counters.upstream_subscriptions == n
        # and the Tracks are live through the edge: an Object on the last one arrives
        w = await served[-1].open_subgroup(0, 0, 0)
        await w.write_object(0, b"live")
        async with asyncio.timeout(TIMEOUT):
            async for ev in subs[-1]:
                if isinstance(ev, ReceivedObject):
                    assert bytes(ev.payload) == b"live"
                    break
        other = FullTrackName(make_ns(), b"k.raw.s0")
        await complete_track(await client(r), other, layers=1, per_group=2)
        _resp, got = await fetch_objects(await client(b), other)
        assert len(got) == 2
    finally:
        await b.close()
        await r.close()


async def test_a_pushed_track_stays_listed_until_lmdb_holds_it(tmp_path: Path) -> None:
    """The namespace of a Track pushed with PUBLISH alone stays listed after the push ended
    until LMDB holds the Track (then for LMDB's sake), with no gap between, also when End of
    Track came before its last Group was whole (a first commit attempt then found it
    incomplete, and the relay above would otherwise forget the namespace meanwhile)."""
    r = await relay_at(tmp_path / "r")
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        track = r.relay.track(name)
        entry = PublisherEntry(name.namespace, CACHE)
        r.relay.namespaces.add_publisher(entry)
        store = r.relay.store
        store.append(track.key, StoredObject(0, 0, 0, 0, ObjectStatus.NORMAL, b"", b"first"))
        store.append(track.key, StoredObject(1, 0, 0, 0, ObjectStatus.END_OF_TRACK))
        track.maybe_commit()  # End of Track known, Group 0 not whole: not committed
        attempt = track.pending_commit
        assert attempt is not None
        await asyncio.wait_for(attempt, TIMEOUT)
        assert not track.committed
        r.relay.list_until_committed(track, entry)  # the push has ended
        for _ in range(3):
            await asyncio.sleep(0)  # its task runs its first look
        assert entry in r.relay.namespaces.sources_of(name.namespace)
        store.append(track.key, StoredObject(0, 0, 1, 0, ObjectStatus.END_OF_GROUP))
        track.maybe_commit()
        assert await r.relay.wait_committed(name, TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            while entry in r.relay.namespaces.sources_of(name.namespace):
                await asyncio.sleep(0)
        assert r.relay.namespaces.sources_of(name.namespace)  # listed for LMDB's sake now
    finally:
        await r.close()
