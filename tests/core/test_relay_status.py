"""TRACK_STATUS answers for every Track the relay can serve: one held only in LMDB after a
restart, one only its upstream knows; with the Track Properties (§7.11, §12, §14)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from relay_helpers import TIMEOUT, client, group_payloads, make_ns, push_track, relay_at

from relay.core.upstream import UNREACHABLE
from relay.moqt.codes import RequestErrorCode
from relay.moqt.kvp import KeyValuePair
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName
from relay.session import RequestRejected


async def test_track_status_of_lmdb_only_and_upstream_tracks(tmp_path: Path) -> None:
    props = (KeyValuePair(0x0E, 3), KeyValuePair(0x3801, b"app-defined"))
    name = FullTrackName(make_ns(), b"k.raw.s0")
    r = await relay_at(tmp_path / "origin")
    try:
        track = await push_track(await client(r), name, 1, properties=props)
        await track.group(0, group_payloads(0, 2))
        await track.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
        largest = r.relay.tracks[name].largest()
    finally:
        await r.close()
    r2 = await relay_at(tmp_path / "origin")  # restarted: the Track is in LMDB only
    edge = await relay_at(tmp_path / "edge", upstream=[r2.url])
    try:
        for relay in (r2, edge):  # the edge never saw the Track: it asks upstream
            c = await client(relay)
            ok = await asyncio.wait_for(c.track_status(name.namespace, name.name), TIMEOUT)
            assert ok.params.largest_object == largest
            assert tuple(ok.track_properties) == props
            bare = await asyncio.wait_for(c.track_status(
                name.namespace, name.name, Params(include_properties=False)), TIMEOUT)
            assert tuple(bare.track_properties) == ()
        try:
            await asyncio.wait_for(c.track_status(name.namespace, b"nothing"), TIMEOUT)
        except RequestRejected as e:
            assert e.code == RequestErrorCode.DOES_NOT_EXIST
        else:
            raise AssertionError("a Track nobody has was answered")
        assert FullTrackName(name.namespace, b"nothing") not in edge.relay.tracks
    finally:
        await edge.close()
        await r2.close()


async def test_the_first_track_status_during_an_outage_is_timeout(tmp_path: Path) -> None:
    """The relay's very first request to a dead upstream (its dial fails while the request
    waits for it) is TIMEOUT "upstream unreachable", never DOES_NOT_EXIST; and so is a
    FETCH or SUBSCRIBE of a Track the relay knows nothing of while it is unreachable."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))  # a port nothing answers on
        port = s.getsockname()[1]
        r = await relay_at(tmp_path, upstream=[f"moqt://127.0.0.1:{port}/"],
                           upstream_idle_timeout=0.5)  # the dial's bound: it never answers
    try:
        c = await client(r)
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(c.track_status(make_ns(), b"k.raw.s0"), TIMEOUT)
        assert e.value.code == RequestErrorCode.TIMEOUT
        assert e.value.reason == UNREACHABLE
        # a FETCH or SUBSCRIBE of a Track only the upstream relay could have: TIMEOUT too
        for ask in (c.fetch, c.subscribe):
            with pytest.raises(RequestRejected) as e:
                await asyncio.wait_for(ask(make_ns(), b"k.raw.s0"), TIMEOUT)
            assert e.value.code == RequestErrorCode.TIMEOUT
            assert e.value.reason == UNREACHABLE
    finally:
        await r.close()


async def test_a_fetch_answered_does_not_exist_before_an_outage_stays_so(
        tmp_path: Path) -> None:
    """A FETCH refused DOES_NOT_EXIST (the upstream relay reachable, nobody publishes the
    Track) is remembered: once the upstream relay is gone, the same FETCH is still
    DOES_NOT_EXIST, not TIMEOUT "upstream unreachable" (what was learned still holds)."""
    a = await relay_at(tmp_path / "a")
    b = await relay_at(tmp_path / "b", upstream=[a.url], upstream_idle_timeout=0.5)
    ns = make_ns()
    try:
        c = await client(b)
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(c.fetch(ns, b"k.raw.s0", Params(fill_timeout=3000)),
                                   TIMEOUT)
        assert e.value.code == RequestErrorCode.DOES_NOT_EXIST
        await a.close()
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(c.fetch(ns, b"k.raw.s0", Params(fill_timeout=3000)),
                                   TIMEOUT)
        assert e.value.code == RequestErrorCode.DOES_NOT_EXIST
        assert b.relay.upstream is not None and b.relay.upstream.unreachable
        with pytest.raises(RequestRejected) as e:  # a Track never asked for: TIMEOUT
            await asyncio.wait_for(c.fetch(make_ns(), b"k.raw.s0", Params(fill_timeout=3000)),
                                   TIMEOUT)
        assert e.value.code == RequestErrorCode.TIMEOUT
    finally:
        await b.close()
        await a.close()
