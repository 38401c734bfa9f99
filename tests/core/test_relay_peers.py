"""Peer relays of one tier (``--peer``, docs/relay.md "A root of several replicas"): replicas
linked as siblings route to what any of them learned from its lower relays, each skips its
own URL in the peer list, a peer's requests are served from own sources only (no loops),
with tokens a peer link needs the tier's peer token; a lower relay that loses its upstream
dials the URL after it, and ``upstream_spread`` picks the first."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
from cli_harness import free_udp_port
from relay_helpers import (
    TIMEOUT,
    client,
    complete_track,
    fetch_objects,
    make_ns,
    relay_at,
    wait_namespace,
)

from relay import service
from relay.core.upstream import spread
from relay.moqt.codes import RequestErrorCode
from relay.moqt.primitives import FullTrackName
from relay.options import RelayConfig
from relay.service import RunningRelay, start_relay
from relay.session import RequestRejected, SessionConfig
from relay.session.tokens import tokens_of


async def _tier(tmp: Path, n: int, **kw: Any) -> list[RunningRelay]:
    """``n`` relays, each given every one's URL as its peers (its own included, as a chart
    renders one list for every replica); returns once every link is up."""
    ports = [free_udp_port() for _ in range(n)]
    urls = [f"moqt://127.0.0.1:{p}/" for p in ports]
    tier = [await relay_at(tmp / f"r{i}", port=p, peer=urls, **kw)
            for i, p in enumerate(ports)]
    async with asyncio.timeout(TIMEOUT):
        while not all(r.peers is not None and len(r.peers.linked) == n - 1 and r.peers.itself
                      for r in tier):
            await asyncio.sleep(0.01)
    return tier


async def test_a_tier_of_peers_routes_to_what_any_replica_learned(tmp_path: Path) -> None:
    tier = await _tier(tmp_path, 3)
    r0, r1, r2 = tier
    a = await relay_at(tmp_path / "a", upstream=[r1.url])
    b = await relay_at(tmp_path / "b", upstream=[r2.url])
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        for r in tier:  # its own URL recognised, never linked; the two others linked
            assert r.peers is not None and r.peers.itself == {r.url}
            assert r.peers.linked == {x.url for x in tier} - {r.url}
            assert len(r.relay.siblings) == 2
            [links] = [m for m in r.metrics.registry.collect()
                       if m.name == "kvcs_relay_sibling_links"]
            assert [x.value for x in links.samples] == [2]
        t = await complete_track(await client(a), name, layers=3, per_group=2)
        c = await client(b)
        # A's namespace reaches R2 from R1 (its sibling) a moment after A published: until
        # then R2 truly knows no publisher of it (DOES_NOT_EXIST, once in a loaded suite)
        await wait_namespace(c, name.namespace)
        _resp, got = await fetch_objects(c, name)  # B -> R2 -> its peer R1 -> A
        assert got == t.sent
        assert r2.relay.counters.upstream_fetches >= 1 and name in r1.relay.tracks
        assert r0.relay.counters.upstream_fetches == 0 and name not in r0.relay.tracks
        # a Track A does not have, under its namespace: A's answer comes back at once,
        # the request not passed on from peer to peer until a timeout
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(c.fetch(name.namespace, b"v.raw.s0"), TIMEOUT)
        assert e.value.code == RequestErrorCode.DOES_NOT_EXIST
        assert loop.time() - started < 2.0
        # a peer's session is a sibling's: not a client session (A's and B's links are)
        assert [len(r.relay.sessions) for r in tier] == [0, 1, 1]
    finally:
        for x in (b, a, *tier):
            await x.close()


async def test_with_tokens_peers_present_the_token_their_tier_shares(tmp_path: Path) -> None:
    grants: list[dict[str, object]] = [
        {"token": "edge", "prefixes": ["kvcs-1"], "roles": ["publish", "subscribe"]}]
    r0, r1 = tier = await _tier(tmp_path, 2, auth_tokens=grants, peer_token=b"tier-secret")
    a = await relay_at(tmp_path / "a", upstream=[r0.url], upstream_token=b"edge")
    b = await relay_at(tmp_path / "b", upstream=[r1.url], upstream_token=b"edge")
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        t = await complete_track(await client(a), name, layers=2, per_group=2)
        _resp, got = await fetch_objects(await client(b), name)
        assert got == t.sent
        assert r0.relay.counters.auth_failures == r1.relay.counters.auth_failures == 0
        # the peer token is granted everything, and nothing else is
        tok = {"config": SessionConfig(authorization_tokens=tokens_of(b"tier-secret"))}
        _resp, got = await fetch_objects(await client(r1, **tok), name)
        assert got == t.sent
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for((await client(r1)).fetch(name.namespace, name.name),
                                   TIMEOUT)
        assert e.value.code == RequestErrorCode.UNAUTHORIZED
    finally:
        for x in (b, a, *tier):
            await x.close()


async def test_spread_picks_the_first_upstream_and_a_lost_one_is_followed_by_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """upstream_spread: pod 1 of a StatefulSet starts at the second root. A root tier's
    replicas are equals: after losing one, the link dials the one after it (a lost upstream
    is likely dead), not the first, though the first is up."""
    roots = [await relay_at(tmp_path / f"r{i}") for i in range(3)]
    monkeypatch.setattr(service.socket, "gethostname", lambda: "edge-kvcs-relay-1")
    edge = await start_relay(RelayConfig(
        listen_port=0, data_dir=tmp_path / "e", upstream=[r.url for r in roots],
        upstream_insecure=True, upstream_spread=True))
    ns = make_ns()
    link = edge.relay.upstream
    assert link is not None

    async def announced_to(r: RunningRelay) -> None:
        async with asyncio.timeout(TIMEOUT):
            while not r.relay.namespaces.sources_of(ns):
                await asyncio.sleep(0.01)

    try:
        pub = await client(edge)
        await asyncio.wait_for(pub.publish_namespace(ns), TIMEOUT)
        await announced_to(roots[1])
        await roots[1].close()
        await announced_to(roots[2])
        assert link.connects == 2 and not roots[0].relay.namespaces.sources_of(ns)
    finally:
        await edge.close()
        for r in roots:
            await r.close()


def test_spread_gives_statefulset_pods_consecutive_upstreams() -> None:
    assert [spread(f"edge-kvcs-relay-{i}", 3) for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert spread("edge-kvcs-relay-4", 1) == 0
    names = [f"edge-7d9f8-{x}x" for x in range(30)]  # no ordinal: a stable hash
    assert [spread(n, 3) for n in names] == [spread(n, 3) for n in names]
    assert {spread(n, 3) for n in names} == {0, 1, 2}
