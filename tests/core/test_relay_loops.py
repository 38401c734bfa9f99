"""Cycles in relay trees are refused (docs/relay.md, "Trees", "Cycles"): an upstream that
leads back to the relay is a start error, and a loop formed after start is refused (the
relay that finds it has no upstream while it lasts), so a request for an unknown Track is
answered DOES_NOT_EXIST at once instead of circling until its FILL_TIMEOUT."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from processes import free_udp_port
from relay_helpers import TIMEOUT, client, make_ns, relay_at

from relay.core.loops import PROBE_FIELD, RelayLoop
from relay.core.routing import RELAY_IMPLEMENTATION
from relay.core.upstream import UNREACHABLE
from relay.moqt.codes import RequestErrorCode
from relay.service import RunningRelay
from relay.session import RequestRejected, SessionConfig

QUICK = 2.0  # seconds: what "at once" allows on a loaded 2-core machine (FILL_TIMEOUT is 5)


def url(port: int) -> str:
    return f"moqt://127.0.0.1:{port}/"


async def refused(aw: Awaitable[Any]) -> tuple[RequestRejected, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RequestRejected) as e:
        await asyncio.wait_for(aw, TIMEOUT)
    return e.value, loop.time() - started


async def unknown_is_absent_at_once(r: RunningRelay) -> None:
    """FETCH, SUBSCRIBE and TRACK_STATUS of a Track nobody has: DOES_NOT_EXIST, quickly."""
    c = await client(r)
    asks: list[Callable[..., Awaitable[Any]]] = [c.fetch, c.subscribe, c.track_status]
    for ask in asks:
        e, took = await refused(ask(make_ns(), b"k.raw.s0"))
        assert e.code == RequestErrorCode.DOES_NOT_EXIST, (ask.__name__, e)
        assert took < QUICK, (ask.__name__, took)


async def test_a_relay_that_is_its_own_upstream_does_not_start(tmp_path: Path) -> None:
    port = free_udp_port()
    with pytest.raises(RelayLoop) as e:
        await relay_at(tmp_path, port=port, upstream=[url(port)])
    assert "relay loop" in str(e.value) and url(port) in str(e.value)


async def test_of_two_relays_each_the_others_upstream_the_second_does_not_start(
        tmp_path: Path) -> None:
    pb = free_udp_port()
    # A first, while B is not up: its dial (bounded by the idle timeout) finds nobody
    a = await relay_at(tmp_path / "a", upstream=[url(pb)], upstream_idle_timeout=0.5)
    try:
        with pytest.raises(RelayLoop) as e:
            await relay_at(tmp_path / "b", port=pb, upstream=[a.url])
        assert f":{a.port}/" in str(e.value) and f":{pb}/" in str(e.value)
        # B's probe made A dial B at once. If B refused A's own probe before it stopped, A
        # knows its upstream leads back and serves on as a root (DOES_NOT_EXIST at once);
        # if B stopped first (a race of the two starts, 1 run in 3 on qh3 here), B is
        # only an upstream that is down: A answers at once that it is unreachable
        # (TIMEOUT). Either way A answers at once and nothing circles (see the notes:
        # A could learn the loop from the loop answer it passed on for B)
        link = a.relay.upstream
        assert link is not None
        if link.looped is not None:
            await unknown_is_absent_at_once(a)
        else:  # (A's dial may still end in the loop's refusal meanwhile: either answer)
            c = await client(a)
            e, took = await refused(c.fetch(make_ns(), b"k.raw.s0"))
            assert took < QUICK
            assert (e.code == RequestErrorCode.DOES_NOT_EXIST and link.looped is not None) or \
                (e.code, e.reason) == (RequestErrorCode.TIMEOUT, UNREACHABLE), e
    finally:
        await a.close()


async def test_the_relay_closing_a_cycle_of_three_does_not_start(tmp_path: Path) -> None:
    py, pz = free_udp_port(), free_udp_port()
    x = await relay_at(tmp_path / "x", upstream=[url(py)], upstream_idle_timeout=0.5)
    y = None
    try:
        y = await relay_at(tmp_path / "y", port=py, upstream=[url(pz)],
                           upstream_idle_timeout=0.5)
        with pytest.raises(RelayLoop) as e:
            await relay_at(tmp_path / "z", port=pz, upstream=[x.url])
        # the reason names the cycle, Z -> X -> Y -> Z
        assert [f":{p}/" in str(e.value) for p in (x.port, py, pz)] == [True] * 3
    finally:
        if y is not None:
            await y.close()
        await x.close()


async def test_a_loop_made_after_start_is_refused_not_circled(tmp_path: Path) -> None:
    """A's upstreams are [C, B], B's is A. With C up, A -> C and B -> A is a tree; once C
    is gone, A fails over to B, which leads back to A: A refuses it, and requests at A and
    at B are answered from what they have (DOES_NOT_EXIST), not circled; a relay starting
    under A is not refused. C back: healed."""
    c = await relay_at(tmp_path / "c")
    pb, pc = free_udp_port(), c.port
    # a short idle timeout bounds A's dial of a C that is gone
    a = await relay_at(tmp_path / "a", upstream=[c.url, url(pb)], upstream_idle_timeout=0.5)
    b = await relay_at(tmp_path / "b", port=pb, upstream=[a.url])
    link = a.relay.upstream
    assert link is not None
    c2 = None
    try:
        first = link.session
        assert first is not None and a.relay.counters.upstream_loops == 0
        await c.close()
        await asyncio.wait_for(first.wait_closed(), TIMEOUT)
        await unknown_is_absent_at_once(a)
        assert link.looped is not None and link.looped[0] == url(pb)
        assert a.relay.counters.upstream_loops >= 1 and link.session is None
        assert await a.readiness() == ["upstream relay loop"]
        await unknown_is_absent_at_once(b)
        assert b.relay.upstream is not None and b.relay.upstream.looped is None
        # A refusing B is a root meanwhile: a relay starting under it is no loop, and its
        # probe does not make A dial the loop again
        refusals = a.relay.counters.upstream_loops
        x = await relay_at(tmp_path / "x", upstream=[a.url])
        try:
            assert x.relay.upstream is not None and x.relay.upstream.session is not None
            assert a.relay.counters.upstream_loops == refusals
        finally:
            await x.close()
        c2 = await relay_at(tmp_path / "c", port=pc)  # the configuration heals
        async with asyncio.timeout(TIMEOUT):
            while await link.get(wait=True) is None:
                pass
        assert link.looped is None and not link.unreachable
    finally:
        for r in (b, a, c2):
            if r is not None:
                await r.close()


async def test_a_probe_is_answered_for_lower_relays_and_never_counted(tmp_path: Path) -> None:
    """Only a lower relay's probe is looked at (a client's is a reserved namespace); a trail
    at the namespace's 32 fields counts as a loop; probes are not client requests."""
    r = await relay_at(tmp_path)
    me = r.relay.relay_id.encode()
    try:
        plain = await client(r)
        e, _ = await refused(plain.track_status((PROBE_FIELD, me), b"probe"))
        assert e.code == RequestErrorCode.DOES_NOT_EXIST
        lower = await client(r, config=SessionConfig(implementation=RELAY_IMPLEMENTATION))
        e, _ = await refused(lower.track_status((PROBE_FIELD, b"other", me), b"probe"))
        assert e.code == RequestErrorCode.NOT_SUPPORTED and e.reason.startswith("relay loop")
        others = tuple(b"r%d" % i for i in range(31))
        e, _ = await refused(lower.track_status((PROBE_FIELD, *others), b"probe"))
        assert e.code == RequestErrorCode.NOT_SUPPORTED and "31 relays" in e.reason
        e, _ = await refused(lower.track_status((PROBE_FIELD, *others[:30]), b"probe"))
        assert e.code == RequestErrorCode.DOES_NOT_EXIST  # no upstream: no loop
        assert r.relay.counters.requests == {}
    finally:
        await r.close()
