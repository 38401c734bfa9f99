"""Through the relay vs direct, in the same run: 1 publisher → relay → 1 and → 8 subscribers,
32 KiB Objects, L layers × B blocks (default 8 × 64 = 16 MiB per Track; set
BENCH_RELAY_LAYERS=32 BENCH_RELAY_BLOCKS=256 for the full 256 MiB KVCS shape), plus FETCH of
the completed publication served from memory vs from LMDB.

The relay runs as its own process (``kvcs relay``), as deployed; publisher and subscribers
share this one. "direct" is the publisher → subscriber session with no relay
(bench_session's setup), so
``relay_ratio`` = relay throughput per subscriber / direct throughput. Latency is per Object:
publisher write → subscriber receipt (both ends in this process, one clock).
Run: ``python -m benchmarks relay``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._report import report
from benchmarks.bench_session import _session
from relay.moqt.codes import ObjectStatus
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName
from relay.session import MoqtSession, ReceivedObject, open_session
from relay.transport import QuicSettings

MiB = 1024 * 1024
OBJECT = 32 * 1024


class _RelayProcess:
    """``kvcs relay`` in its own process (as deployed): the relay gets its own core, so the
    comparison with the direct path is not skewed by sharing one Python thread."""

    def __init__(self, data_dir: Path, size: int) -> None:
        self.data_dir = data_dir
        self.size = size
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    async def __aenter__(self) -> _RelayProcess:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "relay.cli", "relay", "--listen", "127.0.0.1:0",
            "--data-dir", str(self.data_dir), "--max-datagram-size", str(self.size),
            "--memory-bytes", str(2 << 30),
            stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL)
        assert self.proc.stderr is not None
        async with asyncio.timeout(30):
            while True:
                line = (await self.proc.stderr.readline()).decode()
                if not line:
                    raise RuntimeError("relay exited before it was ready")
                m = re.search(r"ready on moqt://127\.0\.0\.1:(\d+)/", line)
                if m:
                    self.port = int(m.group(1))
                    break
        self._drainer = asyncio.ensure_future(self._drain())
        return self

    async def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while await self.proc.stderr.readline():
            pass

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()

    @property
    def url(self) -> str:
        return f"moqt://127.0.0.1:{self.port}/"

    @property
    def certfile(self) -> Path:
        return self.data_dir / "tls" / "cert.pem"


async def _client(r: _RelayProcess, size: int) -> MoqtSession:
    return await open_session(r.url, settings=QuicSettings(max_datagram_size=size),
                              ca_file=r.certfile)


async def fan_out(tmp: Path, size: int, layers: int, blocks: int, subscribers: int
                  ) -> tuple[float, float]:
    """(MB/s per subscriber, median per-Object latency ms) through one relay."""
    name = FullTrackName((b"kvcs-1", os.urandom(32), b"bench"), b"k.raw.s0")
    payload = os.urandom(OBJECT)
    sent_at: dict[tuple[int, int], float] = {}
    async with _RelayProcess(tmp, size) as r:
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


async def fetch_tiers(tmp: Path, size: int, layers: int, blocks: int) -> tuple[float, float]:
    """(MB/s FETCH from memory, MB/s FETCH from LMDB) of a completed Track: the first FETCH
    right after publication (memory), the second after a relay restart (LMDB only)."""
    name = FullTrackName((b"kvcs-1", os.urandom(32), b"bench-fetch"), b"v.raw.s0")
    payload = os.urandom(OBJECT)
    rates = []
    async with _RelayProcess(tmp, size) as r:
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
        rates.append(await _fetch_all(r, name, size, layers * blocks))
        await pub.aclose()
    async with _RelayProcess(tmp, size) as r:
        rates.append(await _fetch_all(r, name, size, layers * blocks))
    return rates[0], rates[1]


async def _fetch_all(r: _RelayProcess, name: FullTrackName, size: int, total: int) -> float:
    c = await _client(r, size)
    t0 = time.perf_counter()
    for _ in range(100):  # the publication may still be arriving: retry until all is there
        resp = await c.fetch(name.namespace, name.name)
        n = 0
        async for _ in resp:
            n += 1
        if n == total and resp.end_of_track:
            break
        t0 = time.perf_counter()
    dt = time.perf_counter() - t0
    await c.aclose()
    return total * OBJECT / dt / 1e6


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
