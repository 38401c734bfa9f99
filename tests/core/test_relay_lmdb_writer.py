"""LMDB's one writer under a stalled FETCH consumer: commits that need the map to grow, and a
commit LMDB refuses once, still end up committed and served (issue 12, part 3)."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    client,
    fetch_objects,
    group_payloads,
    make_ns,
    push_track,
    relay_at,
)

import relay.service
from relay.moqt.primitives import FullTrackName
from relay.session import SessionConfig
from relay.transport import QuicSettings
from storage.interface import StorageFullError, TrackKey
from storage.lmdb_store import LmdbStore

MiB = 1 << 20


async def _publish(r: relay.service.RunningRelay, name: FullTrackName, groups: int,
                   size: int = 32 * 1024) -> dict:
    pub = await client(r)
    track = await push_track(pub, name, layers=groups)
    for g in range(groups):
        await track.group(g, group_payloads(g, 16, size=size))
    await track.end()
    return track.sent


async def test_commits_needing_map_growth_finish_while_a_fetch_consumer_stalls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Injected: a map that starts small (a relay's starts at its limit), so every commit
    # below has to grow it, and a resize gives up quickly if a read session is in its way.
    monkeypatch.setattr(relay.service, "LmdbStore", functools.partial(
        LmdbStore, initial_map_size=1 * MiB, resize_wait=0.2))
    ns = make_ns()
    held = FullTrackName(ns, b"k.raw.s0")
    r = await relay_at(tmp_path, lmdb_bytes=64 * MiB)
    try:
        sent = {held: await _publish(r, held, groups=8)}  # 4 MiB
        assert await r.relay.wait_committed(held, TIMEOUT)
    finally:
        await r.close()

    r = await relay_at(tmp_path, lmdb_bytes=64 * MiB)  # memory is empty: LMDB serves `held`
    try:
        durable = r.store.durable
        assert durable is not None
        map_before = durable.stats()["map_size"]
        # The stalled consumer reads nothing: its queue, its QUIC windows and the relay's
        # send buffer fill up long before the 4 MiB FETCH response is written.
        stalled = await client(r, config=SessionConfig(receive_queue=2),
                               settings=QuicSettings(backend="aioquic",
                                                     max_stream_data=64 * 1024,
                                                     max_data=256 * 1024))
        resp = await asyncio.wait_for(stalled.fetch(held.namespace, held.name), TIMEOUT)
        assert r.relay.counters.fetch.in_flight.count == 1

        # Injected: LMDB refuses the first attempt of one commit (a full disk).
        names = [FullTrackName(ns, f"k.raw.s{i}".encode()) for i in (1, 2, 3)]
        refused: list[TrackKey] = []
        real_commit = durable.commit_track

        def disk_full_once(key: TrackKey, *args: object, **kw: object) -> int:
            if key == (tuple(names[1].namespace), names[1].name) and not refused:
                refused.append(key)
                raise StorageFullError("disk full: injected")
            return real_commit(key, *args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(durable, "commit_track", disk_full_once)
        for name in names:
            sent[name] = await _publish(r, name, groups=4)  # 2 MiB each
        for name in names:
            assert await r.relay.wait_committed(name, TIMEOUT), name
        # ... all while the FETCH walk over LMDB was still held up by its consumer
        assert r.relay.counters.fetch.in_flight.count == 1
        assert durable.stats()["map_size"] > map_before
        assert refused and r.relay.counters.lmdb_full == 1

        async with asyncio.timeout(TIMEOUT):  # the consumer reads again: intact after remaps
            got = {e.location: bytes(e.payload) for e in await resp.collect()}
        assert got == sent[held]
        reader = await client(r)
        for name in names:
            _, objs = await fetch_objects(reader, name)
            assert objs == sent[name]
    finally:
        await r.close()

    r = await relay_at(tmp_path, lmdb_bytes=64 * MiB)  # what was committed, from LMDB alone
    try:
        reader = await client(r)
        for name, objects in sent.items():
            _, objs = await fetch_objects(reader, name)
            assert objs == objects, name
    finally:
        await r.close()
