"""Write-behind (docs/relay.md, "Persistence"): a complete Track is written to LMDB at the
first quiet moment (no Object in or out for ``QUIET``), at most ``lmdb_commit_delay`` after it
completed, at once when the memory tier is three quarters full, and before the relay closes.

``QUIET`` is set here to half a second or a minute (the product's is 50 ms) so that a test's own
pauses on a loaded machine never make a quiet moment it does not mean to."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    client,
    complete_track,
    group_payloads,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.core import persistence
from relay.moqt.primitives import FullTrackName, Location
from relay.options import RelayOptions
from relay.service import RunningRelay
from storage.lmdb_store import LmdbStore

HOUR = 3_600_000  # milliseconds: a commit delay no test waits out


def _committed(r: RunningRelay) -> int:
    return r.relay.counters.lmdb_committed_tracks


def _waiting(r: RunningRelay) -> float:
    """What /metrics says waits for its LMDB write."""
    [g] = [m for m in r.metrics.registry.collect()
           if m.name == "kvcs_relay_lmdb_commits_waiting"]
    return sum(s.value for s in g.samples)


async def test_a_complete_track_waits_for_the_traffic_to_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While another Track's Objects keep arriving (never half a second apart), the complete
    one stays in memory only, for three quiet half-seconds; once they stop it is written."""
    monkeypatch.setattr(persistence, "QUIET", 0.5)
    r = await relay_at(tmp_path, options=RelayOptions(lmdb_commit_delay=HOUR))
    ns = make_ns()
    done, busy = FullTrackName(ns, b"k.raw.s0"), FullTrackName(ns, b"v.raw.s0")
    try:
        pub = await client(r)
        flowing = await push_track(pub, busy, layers=1)
        w = await flowing.served.open_subgroup(0, 0, 128)
        i = 0

        async def one_more() -> None:
            nonlocal i
            await w.write_object(i, b"x" * 1000)
            await wait_cached(r, busy, Location(0, i))
            i += 1

        await one_more()  # the traffic is there before the Track completes
        await complete_track(pub, done, layers=2, per_group=2)
        await wait_cached(r, done, Location(2, 0))
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.5  # three quiet moments' worth of traffic
        while loop.time() < end:
            await one_more()
        assert _committed(r) == 0 and not r.relay.tracks[done].committed
        assert _waiting(r) == 1
        assert await r.relay.wait_committed(done, TIMEOUT)
        assert _committed(r) == 1 and _waiting(r) == 0
    finally:
        await r.close()


async def test_the_commit_delay_bounds_the_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No quiet moment ever comes (a minute of quiet needed): the Track is written once its
    ``lmdb_commit_delay`` has passed; with 0 it is written as soon as it is complete."""
    monkeypatch.setattr(persistence, "QUIET", 60.0)
    for delay_ms in (300, 0):
        r = await relay_at(tmp_path / str(delay_ms),
                           options=RelayOptions(lmdb_commit_delay=delay_ms))
        name = FullTrackName(make_ns(), b"k.raw.s0")
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            await complete_track(await client(r), name, layers=2, per_group=2)
            assert await r.relay.wait_committed(name, TIMEOUT)
            took = loop.time() - started
            assert took >= delay_ms / 1000, took
            assert took < TIMEOUT / 2  # not held to some other bound
        finally:
            await r.close()


async def test_a_filling_memory_tier_writes_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past three quarters of the memory tier a complete Track does not wait: left in
    memory, it could be evicted before it was ever written."""
    monkeypatch.setattr(persistence, "QUIET", 60.0)
    r = await relay_at(tmp_path, memory_bytes=4 << 20,
                       options=RelayOptions(lmdb_commit_delay=HOUR))
    small, large = FullTrackName(make_ns(), b"k.raw.s0"), FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        await complete_track(pub, small, layers=2, per_group=2)  # 8 KB: no hurry
        await wait_cached(r, small, Location(2, 0))
        assert not r.relay.tracks[small].committed
        t = await push_track(pub, large, layers=4)
        for g in range(4):  # 3.6 MB of 4 MiB
            await t.group(g, group_payloads(g, 9, size=100_000))
        # End of Track last (on its own stream it could overtake a Group: the commit would
        # then start waiting before the memory tier had filled, and look again a QUIET later)
        await wait_cached(r, large, Location(3, 8))
        await t.end()
        assert await r.relay.wait_committed(large, TIMEOUT)
        assert not r.relay.tracks[small].committed  # its next look is a QUIET away
    finally:
        await r.close()


async def test_closing_writes_what_waits(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A Track still waiting for a quiet moment when the relay closes is written first: the
    next run of the relay serves it from LMDB."""
    monkeypatch.setattr(persistence, "QUIET", 60.0)
    r = await relay_at(tmp_path, options=RelayOptions(lmdb_commit_delay=HOUR))
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        await complete_track(await client(r), name, layers=2, per_group=2)
        await wait_cached(r, name, Location(2, 0))
        track = r.relay.tracks[name]
        assert not track.committed
    finally:
        await r.close()
    store = LmdbStore(tmp_path / "lmdb", 1 << 30)
    try:
        info = store.info(track.key)
        assert info is not None and info.end_of_track == Location(2, 0)
    finally:
        store.close()


async def test_hundreds_of_tracks_wait_together_and_are_all_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment's burst completes many Tracks at once: each waits (one look per QUIET),
    and at the quiet moment after the burst every one of them is written, one commit after
    another without a new wait between them."""
    monkeypatch.setattr(persistence, "QUIET", 1.0)
    r = await relay_at(tmp_path, options=RelayOptions(lmdb_commit_delay=HOUR))
    ns = make_ns()
    names = [FullTrackName(ns, f"k.raw.s{i}".encode()) for i in range(200)]
    try:
        pub = await client(r)
        async with asyncio.timeout(TIMEOUT):
            await asyncio.gather(*(complete_track(pub, n, layers=1, per_group=1, size=100)
                                   for n in names))
            for n in names:
                await wait_cached(r, n, Location(1, 0))
        # nothing written beside the burst: all of it waits
        assert _committed(r) == 0 and _waiting(r) == len(names)
        async with asyncio.timeout(TIMEOUT):
            for n in names:
                assert await r.relay.wait_committed(n, TIMEOUT)
        assert _committed(r) == len(names) and _waiting(r) == 0
    finally:
        await r.close()
