"""The relay on both QUIC backends, side by side in one run: 1 publisher -> relay -> 1 and
-> 8 subscribers, and FETCH of the completed publication from memory and from LMDB, at 1200-
and 8952-byte datagrams and at the default (``auto``: the route's MTU, 16384 on loopback);
plus the same 1 -> 1 and 1 -> 8 through the moq-rs wheel's own server
(``benchmarks/_moqrs.py``), the relay a user would pick instead.

32 KiB Objects, L layers x B blocks (default 8 x 64 = 16 MiB per Track; BENCH_RELAY_LAYERS /
BENCH_RELAY_BLOCKS change it). The relay runs as its own process (``kvcs relay
--quic-backend ...``), as deployed; each subscriber runs in its own process
(``benchmarks/_subscriber.py``) on the same backend; the publisher and the FETCH client run
here. ``qh3/aioquic`` is the ratio per row. Latency is per Object: the publisher writes its
send time into the payload, the subscriber subtracts it from the receipt time.
Run: ``python -m benchmarks relay``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._proc import cpu_per_gb, cpu_seconds
from benchmarks._report import report
from relay.moqt.codes import ObjectStatus
from relay.moqt.primitives import FullTrackName
from relay.session import MoqtSession, open_session
from relay.transport import QuicSettings

MiB = 1024 * 1024
OBJECT = 32 * 1024


class _RelayProcess:
    """``kvcs relay`` in its own process (as deployed): the relay gets its own core, so the
    comparison with the direct path is not skewed by sharing one Python thread. With
    ``workers`` > 1, a supervisor and its workers in a process group of their own; ``pids``
    is the supervisor's (or lone relay's) then each worker's."""

    def __init__(self, data_dir: Path, size: int | str, backend: str = "aioquic",
                 extra: tuple[str, ...] = (), workers: int = 1) -> None:
        self.data_dir = data_dir
        self.size = size
        self.backend = backend
        self.extra = extra
        self.workers = workers
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.metrics_port: int | None = None  # with "--metrics-listen 127.0.0.1:0" in extra
        self.pids: list[int] = []

    async def __aenter__(self) -> _RelayProcess:
        # (a later --memory-bytes or --metrics-listen in ``extra`` wins: click takes the last)
        # BENCH_PROFILE=path: each relay runs under cProfile, into path.<data dir's name>
        profile = os.environ.get("BENCH_PROFILE")
        profile = profile and f"{profile}.{self.data_dir.parent.name}.{self.data_dir.name}"
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, *(("-m", "cProfile", "-o", profile) if profile else ()),
            "-m", "relay.cli", "relay", "--listen", "127.0.0.1:0",
            "--data-dir", str(self.data_dir), "--max-datagram-size", str(self.size),
            "--memory-bytes", str(2 << 30), "--quic-backend", self.backend,
            "--metrics-listen", "off",
            *(("--workers", str(self.workers)) if self.workers > 1 else ()), *self.extra,
            stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            start_new_session=self.workers > 1)
        assert self.proc.stderr is not None
        # a supervisor says "ready ... with W workers (pids a,b)" once every worker is
        # ready (each worker's own "ready" line comes before it); a lone relay, "ready on"
        want = r"with \d+ workers \(pids ([\d,]+)\)" if self.workers > 1 else r"ready on"
        async with asyncio.timeout(30 * self.workers):
            while True:
                line = (await self.proc.stderr.readline()).decode()
                if not line:
                    raise RuntimeError("relay exited before it was ready")
                done = re.search(want, line)
                m = re.search(r"ready on moqt://127\.0\.0\.1:(\d+)/", line)
                if done and m:
                    self.port = int(m.group(1))
                    metrics = re.search(r"metrics=127\.0\.0\.1:(\d+)", line)
                    self.metrics_port = int(metrics.group(1)) if metrics else None
                    self.pids = [self.proc.pid] + (
                        [int(p) for p in done.group(1).split(",")] if self.workers > 1 else [])
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
            if self.workers > 1:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
            await self.proc.wait()
        await self._drainer

    @property
    def url(self) -> str:
        return f"moqt://127.0.0.1:{self.port}/"

    @property
    def certfile(self) -> Path:
        return self.data_dir / "tls" / "cert.pem"


async def _client(r: _RelayProcess, size: int | str) -> MoqtSession:
    return await open_session(r.url, settings=QuicSettings(max_datagram_size=size,
                                                           backend=r.backend),
                              ca_file=r.certfile)


_STAMP = struct.Struct("<d")


async def _subscriber(r: _RelayProcess, name: FullTrackName, total: int
                      ) -> asyncio.subprocess.Process:
    ns = "/".join(f.hex() for f in name.namespace)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks._subscriber", r.url, str(r.certfile), ns,
        name.name.decode(), str(total), str(r.size), r.backend,
        stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        line = await proc.stdout.readline()
    if line.strip() != b"ready":
        raise RuntimeError(f"subscriber did not start: {line!r}")
    return proc


async def fan_out(tmp: Path, size: int | str, layers: int, blocks: int, subscribers: int,
                  backend: str, workers: int = 1
                  ) -> tuple[float, float, float | str, str]:
    """(MB/s per subscriber, median per-Object latency ms, the relay process's CPU seconds
    per delivered GB, "publisher / subscriber" CPU seconds per GB each of them handled)
    through one relay; the relay's CPU only with one worker (the supervisor's own figure
    would not count live workers). The publisher's is this process's (it only publishes
    then); a subscriber's is its own, from its subscription to its last Object."""
    name = FullTrackName((b"kvcs-1", os.urandom(32), b"bench"), b"k.raw.s0")
    payload = bytearray(os.urandom(OBJECT))
    total = layers * blocks
    extra = ("--workers", str(workers)) if workers > 1 else ()
    async with _RelayProcess(tmp, size, backend, extra) as r:
        pub = await _client(r, size)
        await pub.publish_namespace(name.namespace)
        served = await pub.publish(name.namespace, name.name)
        if workers > 1:
            await _until_every_worker_knows(r, name)
        procs = [await _subscriber(r, name, total) for _ in range(subscribers)]
        assert r.proc is not None
        try:
            cpu0, pub_cpu0 = cpu_seconds(r.proc.pid), time.process_time()
            t0 = time.time()
            for g in range(layers):
                w = await served.open_subgroup(g, 0, (128 * g) // layers)
                for i in range(blocks):
                    _STAMP.pack_into(payload, 0, time.time())
                    await w.write_object(i, bytes(payload))
                await w.write_status(blocks, ObjectStatus.END_OF_GROUP, fin=True)
            results = []
            async with asyncio.timeout(600):
                for p in procs:
                    assert p.stdout is not None
                    out = json.loads(await p.stdout.readline())
                    assert out["bytes"] == total * OBJECT, out
                    results.append(out)
            cpu = cpu_seconds(r.proc.pid) - cpu0
            pub_cpu = time.process_time() - pub_cpu0
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                await p.wait()
        await pub.aclose()
    nbytes = total * OBJECT
    mbps = statistics.mean(nbytes / (o["end"] - t0) / 1e6 for o in results)
    per_gb = round(cpu_per_gb(cpu, nbytes * subscribers), 2) if workers == 1 else ""
    ends = (f"{cpu_per_gb(pub_cpu, nbytes):.2f} / "
            f"{statistics.mean(cpu_per_gb(o['cpu_s'], nbytes) for o in results):.2f}")
    return mbps, statistics.median(o["latency_ms"] for o in results), per_gb, ends


async def _until_every_worker_knows(r: _RelayProcess, name: FullTrackName) -> None:
    """With workers, a subscriber may land on a worker that has not yet heard of the Track
    from its sibling: discover it once per fresh session until every session finds it."""
    for _ in range(16):
        s = await _client(r, r.size)
        nsub = await s.subscribe_namespace(name.namespace[:1])
        try:
            async with asyncio.timeout(10):
                async for ev in nsub:
                    if getattr(ev, "namespace", None) == name.namespace:
                        break
        finally:
            await s.aclose()


async def fetch_tiers(tmp: Path, size: int | str, layers: int, blocks: int, backend: str
                      ) -> tuple[float, float]:
    """(MB/s FETCH from memory, MB/s FETCH from LMDB) of a completed Track: the first FETCH
    right after publication (memory), the second after a relay restart (LMDB only)."""
    name = FullTrackName((b"kvcs-1", os.urandom(32), b"bench-fetch"), b"v.raw.s0")
    payload = os.urandom(OBJECT)
    rates = []
    async with _RelayProcess(tmp, size, backend) as r:
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
    async with _RelayProcess(tmp, size, backend) as r:
        rates.append(await _fetch_all(r, name, size, layers * blocks))
    return rates[0], rates[1]
async def _fetch_all(r: _RelayProcess, name: FullTrackName, size: int | str,
                     total: int) -> float:
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


BACKENDS = ("aioquic", "qh3")


async def _run(sizes: list[int | str], layers: int, blocks: int, fanouts: list[int],
               workers: int) -> list[list[Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for size in sizes:
            res: dict[str, dict[str, tuple[float, Any, Any]]] = {b: {} for b in BACKENDS}
            for backend in BACKENDS:
                tmp = Path(d) / f"{backend}-{size}"
                for n in fanouts:
                    res[backend][f"relay 1->{n}"] = await fan_out(
                        tmp / f"fan{n}", size, layers, blocks, n, backend)
                mem, lmdb = await fetch_tiers(tmp / "fetch", size, layers, blocks, backend)
                res[backend]["FETCH memory"] = (mem, "", "", "")
                res[backend]["FETCH lmdb"] = (lmdb, "", "", "")
                n = max(fanouts)
                if workers > 1:
                    res[backend][f"relay 1->{n}, {workers} workers"] = await fan_out(
                        tmp / "workers", size, layers, blocks, n, backend, workers)
            for case in res["aioquic"]:
                (a, a_lat, a_cpu, a_ends), (q, q_lat, q_cpu, q_ends) = \
                    res["aioquic"][case], res["qh3"][case]
                rows.append([case, size, round(a, 1), round(q, 1), round(q / a, 2),
                             _ms(a_lat), _ms(q_lat), a_cpu, q_cpu, a_ends, q_ends])
    return rows


def _ms(v: Any) -> Any:
    return round(v, 1) if isinstance(v, float) else v


async def _moqrs_rows(layers: int, blocks: int, fanouts: list[int],
                      qh3_rows: list[list[Any]]) -> list[list[Any]]:
    """The same fan-out through moq-rs's own server, next to our qh3 relay at 1200 bytes and
    at the default (``auto``, the route's MTU: 16384 on loopback). moq-rs (quinn) starts at
    1200 and probes the path up to 1452 at most, whatever the interface allows."""
    from benchmarks import _moqrs

    rows = []
    for n in fanouts:
        r = await _moqrs.moqrs_fanout(layers * blocks * OBJECT, OBJECT, n, layers)
        theirs, their_cpu = r["mbps_per_subscriber"], r["server_cpu_s_per_gb"]
        rows.append([f"moq-rs server 1->{n}", "~1200", "", round(theirs, 1), "",
                     "", round(r["median_latency_ms"], 1), "", round(their_cpu, 2), "", ""])
        for size in (1200, "auto"):
            ours = next((row for row in qh3_rows if row[0] == f"relay 1->{n}"
                         and row[1] == size), None)
            if ours is None:
                continue
            rows.append([f"our qh3 relay / moq-rs, 1->{n}: MB/s", size, "", "",
                         round(ours[3] / theirs, 2), "", "", "", "", "", ""])
            if ours[8] != "" and their_cpu:
                rows.append([f"our qh3 relay / moq-rs, 1->{n}: CPU/GB", size, "", "",
                             round(float(ours[8]) / their_cpu, 2), "", "", "", "", "", ""])
    return rows


def main() -> None:
    layers = int(os.environ.get("BENCH_RELAY_LAYERS", "8"))
    blocks = int(os.environ.get("BENCH_RELAY_BLOCKS", "64"))
    sizes: list[int | str] = [x if x == "auto" else int(x) for x in
                              os.environ.get("BENCH_RELAY_SIZES", "1200,8952,auto").split(",")]
    fanouts = [int(x) for x in os.environ.get("BENCH_RELAY_FANOUT", "1,8").split(",")]
    workers = int(os.environ.get("BENCH_RELAY_WORKERS", "2"))
    rows = asyncio.run(_run(sizes, layers, blocks, fanouts, workers))
    if os.environ.get("BENCH_RELAY_MOQRS", "1") == "1":
        rows += asyncio.run(_moqrs_rows(layers, blocks, fanouts, rows))
    report("relay", ["case", "max_datagram_size", "aioquic_MB/s", "qh3_MB/s",
                     "qh3/aioquic", "aioquic_latency_ms", "qh3_latency_ms",
                     "aioquic_cpu_s/GB", "qh3_cpu_s/GB", "aioquic_pub/sub_cpu_s/GB",
                     "qh3_pub/sub_cpu_s/GB"], rows,
           extra={"layers": layers, "blocks": blocks, "object_bytes": OBJECT,
                  "workers": workers,
                  "note": "MB/s per subscriber; relay and each subscriber in their own "
                          "process, publisher and FETCH client in the benchmark's; moq-rs "
                          "rows: qh3_MB/s column holds moq-rs's figure; the 'our qh3 relay / "
                          "moq-rs' rows' qh3/aioquic column holds the ratio at that "
                          "datagram size (moq-rs: quinn's own, 1200 probed up); cpu_s/GB: "
                          "the relay "
                          "process's (or moq-rs server's) utime + stime from /proc over the "
                          "transfer, per GB delivered to all subscribers; pub/sub: the "
                          "publisher's (this process's) and a subscriber's own CPU seconds "
                          "per GB each handled (mean over subscribers)"})


if __name__ == "__main__":
    main()
