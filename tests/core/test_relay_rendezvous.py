"""RENDEZVOUS_TIMEOUT (§6.3, §14.4; docs/relay.md, "Rendezvous"): a SUBSCRIBE for a Track
nobody publishes is held up to its RENDEZVOUS_TIMEOUT (capped by max_rendezvous_timeout) for a
publisher, then refused with TIMEOUT; without one it is refused DOES_NOT_EXIST at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from relay_helpers import TIMEOUT, client, drain, group_payloads, make_ns, push_track, relay_at

from relay.core.relay import RelayOptions
from relay.moqt.codes import RequestErrorCode
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.service import RunningRelay
from relay.session import RequestRejected


async def _refused(r: RunningRelay, name: FullTrackName, params: Params) -> tuple[int, float]:
    """The REQUEST_ERROR code a SUBSCRIBE gets, and how long it took."""
    c = await client(r)
    started = time.monotonic()
    with pytest.raises(RequestRejected) as e:
        await asyncio.wait_for(c.subscribe(name.namespace, name.name, params), TIMEOUT)
    return e.value.code, time.monotonic() - started


async def _held(r: RunningRelay, n: int, within: float = TIMEOUT) -> None:
    """Until ``n`` SUBSCRIBEs are held (no event tells; a bounded poll)."""
    async with asyncio.timeout(within):
        while len(r.relay.rendezvous) != n:
            await asyncio.sleep(0.01)


async def test_a_held_subscribe_times_out_and_an_unheld_one_is_refused_at_once(
        tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "r", options=RelayOptions(max_rendezvous_timeout=250))
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        code, took = await _refused(r, name, Params(rendezvous_timeout=200))
        assert code == RequestErrorCode.TIMEOUT and 0.19 <= took < 2, (code, took)
        # the relay's cap applies: asked 5 s, held 250 ms
        code, took = await _refused(r, name, Params(rendezvous_timeout=5000))
        assert code == RequestErrorCode.TIMEOUT and 0.24 <= took < 2, (code, took)
        for params in (Params(), Params(rendezvous_timeout=0)):
            code, took = await _refused(r, name, params)
            assert code == RequestErrorCode.DOES_NOT_EXIST and took < 0.19, (code, took)
        assert len(r.relay.rendezvous) == 0 and name not in r.relay.tracks
    finally:
        await r.close()


async def test_a_publisher_appearing_within_the_window_gets_the_subscription_through(
        tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "r")
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        c = await client(r)
        sub_task = asyncio.ensure_future(
            c.subscribe(name.namespace, name.name, Params(rendezvous_timeout=5000)))
        await _held(r, 1)
        # a PUBLISH_NAMESPACE from a publisher that lacks the Track wakes it but does not
        # answer it; the PUBLISH of the Track does
        pub = await client(r)
        t = await push_track(pub, name, layers=2)
        sub = await asyncio.wait_for(sub_task, TIMEOUT)
        payloads = group_payloads(0, 3, size=100)
        await t.group(0, payloads)
        await t.group(1, payloads)
        await t.end()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        assert got.objects[Location(1, 2)] == payloads[2] and len(got.objects) == 6
        assert len(r.relay.rendezvous) == 0
    finally:
        await r.close()


async def test_a_subscriber_cancelling_while_held_frees_everything(tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "r")
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        c = await client(r)
        sub_task = asyncio.ensure_future(
            c.subscribe(name.namespace, name.name, Params(rendezvous_timeout=10000)))
        await _held(r, 1)
        sub_task.cancel()  # the client abandons the request: its stream is reset
        # freed at once, not when the 10 s window ends
        await _held(r, 0, within=2.0)
        async with asyncio.timeout(2.0):
            while name in r.relay.tracks:
                await asyncio.sleep(0.01)
        assert not c.closed
    finally:
        await r.close()
