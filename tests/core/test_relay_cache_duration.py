"""MAX_CACHE_DURATION (§12) counts from when a Track's Objects first arrived, also for its
LMDB copy: a Track committed late (its last Group came long after the first) expires from
LMDB at first arrival + duration, not at commit + duration (relay/core/relay.py, _commit)."""

from __future__ import annotations

from pathlib import Path

from fake_clock import Clock
from relay_helpers import (
    TIMEOUT,
    client,
    group_payloads,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.moqt.codes import PropertyType
from relay.moqt.kvp import KeyValuePair
from relay.moqt.primitives import FullTrackName, Location


async def test_lmdb_copy_expires_a_duration_after_the_first_arrival_not_the_commit(
        tmp_path: Path) -> None:
    clock = Clock()
    r = await relay_at(tmp_path, clock=clock)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=2, properties=(
            KeyValuePair(PropertyType.MAX_CACHE_DURATION, 10_000),))  # 10 s
        await t.group(0, group_payloads(0, 3, size=300))
        await wait_cached(r, name, Location(0, 3))
        first = clock.now  # Group 0 arrived now
        clock.now += 6  # the rest of the Track comes 6 s later: the commit is at first + 6
        await t.group(1, group_payloads(1, 3, size=300))
        await t.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
        await pub.aclose()
        key = r.relay.tracks[name].key
        assert r.store.durable is not None
        clock.now = first + 9.9
        assert r.store.durable.info(key) is not None  # served from LMDB until then ...
        clock.now = first + 10
        assert r.store.durable.info(key) is None  # ... and not at first + 10 (nor to + 16)
    finally:
        await r.close()
