"""The scale section of ``python -m benchmarks tree`` (issue 35, docs/relay.md "Request
streams"): a tree must hold under many consumers and many scopes, since request streams
between two relays are a bounded resource (a qh3 peer grants 100 at once).

* **N consumers with distinct prompts through one edge**: N publications (one per 16-block
  prompt) held at A, a lower relay of R; N consumers, each its own session at an edge B under
  R, run the consumer's discovery (``relay.peers.discovery.discover``: 16 prefixes each, asked
  of R by B) and FETCH the publication found. Every fetch must be served, and the last tenth
  as fast as the first (within 1.2x); B's link to R holds afterwards what it held before.
* **Depth 4**: a Track of BENCH_TREE_DEEP_MIB MiB (1,024 by default) published at a leaf four
  levels down, FETCHed at a relay under the root (five relays on the path), against the same
  FETCH at the leaf itself.
* **N scopes at a lower relay**: A restarts holding N publications, each in its own scope,
  in LMDB under a running R: the time until R knows all N, R's resident memory, then
  discovery and FETCH at a sibling S for a sample of the first and of the last tenth.

Each relay is its own ``kvcs relay`` process; N is ``BENCH_TREE_SCALE`` (1,000 by default,
10,000 for the full run). Streams in use are read from the relays' own /metrics
(``kvcs_relay_request_streams``).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_relay import _client, _RelayProcess
from relay.kvcs.namespace import content_prefix
from relay.moqt.codes import ObjectStatus
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, TrackNamespace
from relay.peers.discovery import discover
from relay.session import MoqtSession
from storage.interface import StoredObject
from storage.lmdb_store import LmdbStore

SIZE = 1200
BLOCKS = 16  # Block Keys per prompt: one discovery wave of 16 prefixes
CONCURRENCY = int(os.environ.get("BENCH_TREE_CONCURRENCY", "8"))  # consumers at once
SAMPLE = 20  # publications of each tenth asked at the sibling
TRACK = b"manifest"
METRICS = ("--metrics-listen", "127.0.0.1:0")


async def announced(session: MoqtSession, prefix: TrackNamespace, want: int,
                    timeout: float = 120.0) -> float:
    """Seconds until ``want`` namespaces under ``prefix`` were announced on ``session``."""
    nsub = await session.subscribe_namespace(prefix)
    t0 = time.perf_counter()
    seen: set[TrackNamespace] = set()
    async with asyncio.timeout(timeout):
        async for ev in nsub:
            if ev.active:
                seen.add(ev.namespace)
                if len(seen) >= want:
                    break
    nsub.cancel()
    return time.perf_counter() - t0


async def publish_track(session: MoqtSession, name: FullTrackName, layers: int, blocks: int,
                   payload: bytes | bytearray, end: bool) -> None:
    """A Track of ``layers`` Groups of ``blocks`` Objects pushed with PUBLISH (its namespace
    announced first), then End of Track if ``end``."""
    await session.publish_namespace(name.namespace)
    served = await session.publish(name.namespace, name.name)
    for g in range(layers):
        w = await served.open_subgroup(g, 0, (128 * g) // layers)
        for i in range(blocks):
            await w.write_object(i, bytes(payload))
        await w.write_status(blocks, ObjectStatus.END_OF_GROUP, fin=True)
    if end:
        w = await served.open_subgroup(layers, 0, 128)
        await w.write_status(0, ObjectStatus.END_OF_TRACK, fin=True)
        await served.done()


def _commit(store: LmdbStore, ns: TrackNamespace) -> None:
    store.commit_track((ns, TRACK), [[
        StoredObject(0, 0, 0, 0, ObjectStatus.NORMAL, b"", b"x" * 256),
        StoredObject(0, 0, 1, 0, ObjectStatus.END_OF_TRACK)]])


def _seed(data: Path, namespaces: list[TrackNamespace]) -> None:
    """Committed one-Object publications, written with the storage tier directly (what a
    relay that ran for a while holds)."""
    store = LmdbStore(os.fspath(data / "lmdb"), 8 << 30)
    try:
        for ns in namespaces:
            _commit(store, ns)
    finally:
        store.close()


async def _metric(port: int | None, name: str, **labels: str) -> float:
    """One sample of a relay's /metrics (0 if absent)."""
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    body = (await reader.read()).decode()
    writer.close()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in body.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            lbl = line[len(name):].split(" ")[0].strip("{}")
            if ",".join(sorted(lbl.split(","))) == want or (not labels and not lbl):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _up_in_use(r: _RelayProcess) -> float:
    return await _metric(r.metrics_port, "kvcs_relay_request_streams", link="upstream",
                         direction="out", state="in_use")


async def _settled(r: _RelayProcess, value: float, timeout: float = 10.0) -> float:
    """The relay's upstream streams in use once back at ``value`` (or what they are after
    ``timeout``): the cancellations of the last requests take a round trip."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while (now := await _up_in_use(r)) != value and loop.time() < end:
        await asyncio.sleep(0.1)  # poll step: a metric has no event
    return now


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _tenths(latencies: list[tuple[int, float, float]], n: int) -> dict[str, float]:
    tenth = max(1, n // 10)
    first = [x for x in latencies if x[0] < tenth]
    last = [x for x in latencies if x[0] >= n - tenth]
    out: dict[str, float] = {}
    for key, col in (("discovery", 1), ("fetch", 2)):
        out[f"{key}_first_ms"] = statistics.median(x[col] for x in first) * 1000
        out[f"{key}_last_ms"] = statistics.median(x[col] for x in last) * 1000
    return out


async def consumers(tmp: Path, n: int, backend: str) -> dict[str, Any]:
    scope, compat = os.urandom(32), os.urandom(32)
    prompts = [[os.urandom(32) for _ in range(BLOCKS)] for _ in range(n)]
    namespaces = [(*content_prefix(scope, compat, p[-1]), os.urandom(16)) for p in prompts]
    _seed(tmp / "a", namespaces)
    async with _RelayProcess(tmp / "r", SIZE, backend, METRICS) as r:
        up = ("--upstream", r.url, "--upstream-ca", str(r.certfile))
        watcher = await _client(r, SIZE)
        known = asyncio.ensure_future(announced(watcher, (b"kvcs-1", scope), n, 600))
        async with _RelayProcess(tmp / "a", SIZE, backend, up), \
                _RelayProcess(tmp / "b", SIZE, backend, (*up, *METRICS)) as b:
            await known
            first = await _client(b, SIZE)  # B's upstream link up, before the baseline
            await first.track_status(namespaces[0], TRACK)
            await first.aclose()
            baseline = await _up_in_use(b)
            gate = asyncio.Semaphore(CONCURRENCY)
            served = 0

            async def one(i: int) -> tuple[int, float, float]:
                nonlocal served
                async with gate:
                    s = await _client(b, SIZE)
                    try:
                        t0 = time.perf_counter()
                        found = await asyncio.wait_for(
                            discover(s, scope, compat, prompts[i], window=0.0), 60)
                        t1 = time.perf_counter()
                        assert found and found[0].namespace.fields == namespaces[i], i
                        resp = await asyncio.wait_for(s.fetch(namespaces[i], TRACK), 60)
                        got = await asyncio.wait_for(resp.collect(), 60)
                        t2 = time.perf_counter()
                        served += len(got) == 1
                        return i, t1 - t0, t2 - t1
                    finally:
                        await s.aclose(drain=0)

            t0 = time.perf_counter()
            results = await asyncio.gather(*(one(i) for i in range(n)))
            wall = time.perf_counter() - t0
            after = await _settled(b, baseline)
        await watcher.aclose()
    return {"served": served, "wall_s": wall, "prefixes": n * BLOCKS,
            "streams_before": baseline, "streams_after": after, **_tenths(results, n)}


async def _ask(c: MoqtSession, ns: TrackNamespace) -> tuple[float, float]:
    """(discovery ms, FETCH ms) of one publication at a relay."""
    t0 = time.perf_counter()
    await announced(c, ns[:4], 1, 60)
    t1 = time.perf_counter()
    resp = await asyncio.wait_for(c.fetch(ns, TRACK), 60)
    got = await asyncio.wait_for(resp.collect(), 60)
    assert len(got) == 1, ns
    return (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000


async def scopes(tmp: Path, n: int, backend: str) -> dict[str, Any]:
    namespaces = [(b"kvcs-1", os.urandom(32), os.urandom(32), os.urandom(32), os.urandom(16))
                  for _ in range(n)]
    _seed(tmp / "a", namespaces)
    async with _RelayProcess(tmp / "r", SIZE, backend, METRICS) as r:
        up = ("--upstream", r.url, "--upstream-ca", str(r.certfile))
        watcher = await _client(r, SIZE)
        known = asyncio.ensure_future(announced(watcher, (b"kvcs-1",), n, 600))
        t0 = time.perf_counter()
        async with _RelayProcess(tmp / "a", SIZE, backend, (*up, *METRICS)) as a:
            ready = time.perf_counter() - t0
            await known
            everything = time.perf_counter() - t0
            assert r.proc is not None
            rss = _rss_mb(r.proc.pid)
            a_streams = await _up_in_use(a)
            async with _RelayProcess(tmp / "s", SIZE, backend, (*up, *METRICS)) as s:
                c = await _client(s, SIZE)
                tenth = max(1, n // 10)
                firsts = [await _ask(c, ns) for ns in namespaces[:min(SAMPLE, tenth)]]
                lasts = [await _ask(c, ns) for ns in namespaces[n - min(SAMPLE, tenth):]]
                await c.aclose()
                s_streams = await _settled(s, 0)
        await watcher.aclose()
    return {"ready_s": ready, "all_known_s": everything, "root_rss_mb": rss,
            "a_streams": a_streams, "s_streams": s_streams,
            "discovery_first_ms": statistics.median(x[0] for x in firsts),
            "discovery_last_ms": statistics.median(x[0] for x in lasts),
            "fetch_first_ms": statistics.median(x[1] for x in firsts),
            "fetch_last_ms": statistics.median(x[1] for x in lasts)}


DEEP_OBJECT = 256 * 1024  # one token block of a large model's layer


async def _fetch_mb_s(r: _RelayProcess, ns: TrackNamespace, name: bytes, total: int) -> float:
    """MB/s of one FETCH of the whole Track at ``r``, to its last Object."""
    c = await _client(r, SIZE)
    try:
        t0 = time.perf_counter()
        # the consumer's own budget, as `kvcs fetch` gives it (a relay's default is 5 s)
        resp = await asyncio.wait_for(c.fetch(ns, name, Params(fill_timeout=600_000)), 600)
        got = 0
        async with asyncio.timeout(600):
            async for ev in resp:
                payload = getattr(ev, "payload", None)
                if payload is not None:
                    got += len(payload)
        took = time.perf_counter() - t0
    finally:
        await c.aclose(drain=0)
    assert got == total, (got, total)
    return total / took / 1e6


async def deep(tmp: Path, mib: int, backend: str) -> dict[str, float]:
    """A Track of ``mib`` MiB published at a leaf L four levels down (R <- M1 <- M2 <- L),
    FETCHed at S, a relay under R (pulled S <- R <- M1 <- M2 <- L), against the same FETCH
    at L itself (one relay, same run)."""
    ns = (b"kvcs-1", os.urandom(32), b"bench-deep")
    name = b"k.raw.s0"
    blocks = 64
    layers = max(1, mib * (1 << 20) // (blocks * DEEP_OBJECT))
    total = layers * blocks * DEEP_OBJECT
    payload = os.urandom(DEEP_OBJECT)
    async with _RelayProcess(tmp / "r", SIZE, backend) as r:
        up_r = ("--upstream", r.url, "--upstream-ca", str(r.certfile))
        async with _RelayProcess(tmp / "m1", SIZE, backend, up_r) as m1:
            up_m1 = ("--upstream", m1.url, "--upstream-ca", str(m1.certfile))
            async with _RelayProcess(tmp / "m2", SIZE, backend, up_m1) as m2:
                up_m2 = ("--upstream", m2.url, "--upstream-ca", str(m2.certfile))
                async with _RelayProcess(tmp / "l", SIZE, backend, up_m2) as leaf, \
                        _RelayProcess(tmp / "s", SIZE, backend, up_r) as s:
                    pub = await _client(leaf, SIZE)
                    await publish_track(pub, FullTrackName(ns, name), layers, blocks, payload,
                                        end=True)
                    watcher = await _client(s, SIZE)
                    await announced(watcher, ns, 1, 60)  # routable from S
                    await watcher.aclose()
                    one = await _fetch_mb_s(leaf, ns, name, total)
                    tree = await _fetch_mb_s(s, ns, name, total)
                    await pub.aclose()
    return {"mib": total / (1 << 20), "one_mb_s": one, "tree_mb_s": tree}


def _ratio(a: float, b: float) -> float | str:
    return round(a / b, 2) if b else ""


def rows(backend: str, n: int, con: dict[str, Any], sc: dict[str, Any],
         dp: dict[str, float]) -> list[list[Any]]:
    """The scale section's rows of the tree table (ratio: last tenth / first tenth; depth:
    tree / one relay)."""
    return [
        [backend, f"FETCH of {dp['mib']:.0f} MiB at L itself (one relay, baseline)",
         round(dp["one_mb_s"], 1), "MB/s", ""],
        [backend, "... at S, pulled through depth 4 (S <- R <- M1 <- M2 <- L)",
         round(dp["tree_mb_s"], 1), "MB/s", _ratio(dp["tree_mb_s"], dp["one_mb_s"])],
        [backend, f"{n} consumers at edge B, distinct prompts: fetches served",
         f"{con['served']} of {n}", f"({con['prefixes']} prefixes asked of R)", ""],
        [backend, "... all of them, 8 at a time", round(con["wall_s"], 1), "s", ""],
        [backend, "... discovery, first tenth / last tenth (median)",
         f"{con['discovery_first_ms']:.1f} / {con['discovery_last_ms']:.1f}", "ms",
         _ratio(con["discovery_last_ms"], con["discovery_first_ms"])],
        [backend, "... FETCH, first tenth / last tenth (median)",
         f"{con['fetch_first_ms']:.1f} / {con['fetch_last_ms']:.1f}", "ms",
         _ratio(con["fetch_last_ms"], con["fetch_first_ms"])],
        [backend, "... B's request streams to R in use, before / after",
         f"{con['streams_before']:.0f} / {con['streams_after']:.0f}", "streams", ""],
        [backend, f"{n} scopes at lower relay A (LMDB): A ready", round(sc["ready_s"], 2), "s",
         ""],
        [backend, "... until R knows all of them", round(sc["all_known_s"], 2), "s", ""],
        [backend, "... R's resident memory then", round(sc["root_rss_mb"], 1), "MB", ""],
        [backend, "... A's request streams to R in use", f"{sc['a_streams']:.0f}", "streams",
         ""],
        [backend, "... discovery at sibling S, first tenth / last tenth",
         f"{sc['discovery_first_ms']:.1f} / {sc['discovery_last_ms']:.1f}", "ms",
         _ratio(sc["discovery_last_ms"], sc["discovery_first_ms"])],
        [backend, "... FETCH at S (pulled S -> R -> A), first / last tenth",
         f"{sc['fetch_first_ms']:.1f} / {sc['fetch_last_ms']:.1f}", "ms",
         _ratio(sc["fetch_last_ms"], sc["fetch_first_ms"])],
        [backend, "... S's request streams to R in use afterwards", f"{sc['s_streams']:.0f}",
         "streams", ""],
    ]
