"""Through the relay vs direct, in the same run: 1 publisher → relay → 1 and → 8 subscribers,
32 KiB Objects, L layers × B blocks (default 8 × 64 = 16 MiB per Track; set
BENCH_RELAY_LAYERS=32 BENCH_RELAY_BLOCKS=256 for the full 256 MiB KVCS shape), plus FETCH of
the completed publication served from memory vs from LMDB.

"direct" is the publisher → subscriber session with no relay (bench_session's setup), so
``relay_ratio`` = relay throughput per subscriber / direct throughput. Latency is per Object:
publisher write → subscriber receipt (both ends in this process, one clock).
Run: ``python -m benchmarks relay``.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._report import report
from benchmarks.bench_session import _session
from relay.core.relay import RelayOptions
from relay.moqt.codes import ObjectStatus
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName
from relay.service import RelayConfig, RunningRelay, start_relay
from relay.session import MoqtSession, ReceivedObject, open_session
from relay.transport import QuicSettings

MiB = 1024 * 1024
OBJECT = 32 * 1024


async def _relay(tmp: Path, size: int, memory: int = 1 << 30) -> RunningRelay:
    return await start_relay(RelayConfig(
        listen_port=0, data_dir=tmp, memory_bytes=memory, lmdb_bytes=2 << 30,
        max_datagram_size=size, options=RelayOptions(max_backlog_bytes=1 << 30)))


async def _client(r: RunningRelay, size: int) -> MoqtSession:
    return await open_session(r.url, settings=QuicSettings(max_datagram_size=size),
                              ca_file=r.certfile)


async def fan_out(tmp: Path, size: int, layers: int, blocks: int, subscribers: int
                  ) -> tuple[float, float]:
    """(MB/s per subscriber, median per-Object latency ms) through one relay."""
    r = await _relay(tmp, size)
    name = FullTrackName((b"kvcs-1", os.urandom(32), b"bench"), b"k.raw.s0")
    payload = os.urandom(OBJECT)
    sent_at: dict[tuple[int, int], float] = {}
    try:
        pub = await _client(r, size)
        await pub.publish_namespace(name.namespace)
        served = await pub.publish(name.namespace, name.name)
        subs = []
        for _ in range(subscribers):
            s = await _client(r, size)
            subs.append(await s.subscribe(name.namespace, name.name, Params(
                location_filter=LocationFilter.next_object())))
        total = layers * blocks
        latencies: list[float] = []

        async def consume(sub: Any) -> float:
            got = 0
            async for ev in sub:
                if isinstance(ev, ReceivedObject) and ev.status == ObjectStatus.NORMAL:
                    latencies.append(time.perf_counter() - sent_at[(ev.group, ev.object_id)])
                    got += 1
                    if got == total:
                        return time.perf_counter()
            raise RuntimeError("subscription ended early")

        consumers = [asyncio.ensure_future(consume(s)) for s in subs]
        t0 = time.perf_counter()
        for g in range(layers):
            w = await served.open_subgroup(g, 0, (128 * g) // layers)
            for i in range(blocks):
                sent_at[(g, i)] = time.perf_counter()
                await w.write_object(i, payload)
            await w.write_status(blocks, ObjectStatus.END_OF_GROUP, fin=True)
        ends = await asyncio.wait_for(asyncio.gather(*consumers), 600)
        nbytes = total * OBJECT
        mbps = statistics.mean(nbytes / (t - t0) / 1e6 for t in ends)
        return mbps, statistics.median(latencies) * 1000
    finally:
        await r.close()


async def fetch_tiers(tmp: Path, size: int, layers: int, blocks: int) -> tuple[float, float]:
    """(MB/s FETCH from memory, MB/s FETCH from LMDB) of a completed Track."""
    r = await _relay(tmp, size)
    name = FullTrackName((b"kvcs-1", os.urandom(32), b"bench-fetch"), b"v.raw.s0")
    payload = os.urandom(OBJECT)
    try:
        pub = await _client(r, size)
        await pub.publish_namespace(name.namespace)
        served = await pub.publish(name.namespace, name.name)
        for g in range(layers):
            w = await served.open_subgroup(g, 0, 0)
            for i in range(blocks):
                await w.write_object(i, payload)
            await w.write_status(blocks, ObjectStatus.END_OF_GROUP, fin=True)
        w = await served.open_subgroup(layers, 0, 0)
        await w.write_status(0, ObjectStatus.END_OF_TRACK, fin=True)
        await served.done()
        assert await r.relay.wait_committed(name, 120)
        rates = []
        for evict in (False, True):
            if evict:
                for g in range(layers + 1):
                    r.store.memory.discard_group(r.relay.tracks[name].key, g)
            c = await _client(r, size)
            t0 = time.perf_counter()
            resp = await c.fetch(name.namespace, name.name)
            n = 0
            async for _ in resp:
                n += 1
            dt = time.perf_counter() - t0
            assert n == layers * blocks, n
            rates.append(n * OBJECT / dt / 1e6)
            await c.aclose()
        tier_counts = r.relay.counters.values
        assert tier_counts.get("fetch_objects_lmdb", 0) == layers * blocks, tier_counts
        return rates[0], rates[1]
    finally:
        await r.close()


async def _run(size: int, layers: int, blocks: int) -> list[list[Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        direct, _, _ = await _session(layers * blocks * OBJECT, size)
        for n in (1, 8):
            mbps, lat = await fan_out(Path(d) / f"fan{n}", size, layers, blocks, n)
            rows.append([f"relay 1->{n}", size, round(direct, 1), round(mbps, 1),
                         round(mbps / direct, 3), round(lat, 1)])
        mem, lmdb = await fetch_tiers(Path(d) / "fetch", size, layers, blocks)
        rows.append(["FETCH memory", size, round(direct, 1), round(mem, 1),
                     round(mem / direct, 3), ""])
        rows.append(["FETCH lmdb", size, round(direct, 1), round(lmdb, 1),
                     round(lmdb / direct, 3), ""])
    return rows


def main() -> None:
    layers = int(os.environ.get("BENCH_RELAY_LAYERS", "8"))
    blocks = int(os.environ.get("BENCH_RELAY_BLOCKS", "64"))
    size = int(os.environ.get("BENCH_RELAY_DATAGRAM", "8952"))
    rows = asyncio.run(_run(size, layers, blocks))
    report("relay", ["case", "max_datagram_size", "direct_MB/s", "MB/s_per_subscriber",
                     "ratio_to_direct", "median_latency_ms"], rows,
           extra={"layers": layers, "blocks": blocks, "object_bytes": OBJECT,
                  "note": "direct = publisher->subscriber session without a relay, same run"})


if __name__ == "__main__":
    main()
