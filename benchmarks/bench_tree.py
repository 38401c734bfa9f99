"""Relay trees (docs/relay.md, "Trees"), each figure next to a baseline from the same run:

* **1 -> 1 through A -> R -> B** (publisher at A, subscriber at B, three relay processes)
  against 1 -> 1 through one relay, MB/s per subscriber and the ratio: relays forward as
  Objects arrive, so the tree should cost little throughput.
* **First layer at B, pulled or pushed**: a completed publication at A, FETCHed at B; time to
  the first whole layer and to the last, with ``upstream_push`` off (B -> R -> A pull) and on
  (A pushed it to R as it arrived: B pulls from R only).
* **Announcing 10,000 publications**: A restarts holding N committed publications in LMDB
  (one scope) under a running R: A's time to ready, the time until R has learned every one of
  them (a watcher's NAMESPACE count at R), and the worst TRACK_STATUS round trip at A
  meanwhile (its sessions must not stall), against the same round trip on an idle A.

* **Scale** (benchmarks/_tree_scale.py): N consumers with distinct prompts through one edge,
  a Track pulled through depth 4, N scopes at a lower relay (N = BENCH_TREE_SCALE, 1,000 by
  default; 10,000 for the full run): every fetch served, the last tenth against the first,
  announcing time, root memory, request streams in use.

Run: ``python -m benchmarks tree`` (BENCH_TREE_BACKENDS, BENCH_TREE_LAYERS, BENCH_TREE_BLOCKS,
BENCH_TREE_PUBLICATIONS, BENCH_TREE_SCALE, BENCH_TREE_DEEP_MIB change it;
BENCH_TREE_SECTIONS=flow or =scale runs one section).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _tree_scale
from benchmarks._report import report
from benchmarks._tree_scale import announced, publish_track
from benchmarks.bench_relay import OBJECT, _client, _RelayProcess, _subscriber, fan_out
from relay.moqt.codes import ObjectStatus
from relay.moqt.primitives import FullTrackName
from storage.interface import StoredObject
from storage.lmdb_store import LmdbStore

SIZE = 1200


def _cpu(*procs: _RelayProcess) -> float:
    """CPU seconds (user + system) the relay processes used so far (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for r in procs:
        assert r.proc is not None
        fields = Path(f"/proc/{r.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def tree_live(tmp: Path, layers: int, blocks: int, backend: str) -> tuple[float, float]:
    """(MB/s of one live subscriber at B of a Track published at A through R, cores the
    three relays used meanwhile)."""
    name = FullTrackName((b"kvcs-1", os.urandom(32), b"bench-tree"), b"k.raw.s0")
    payload = bytearray(os.urandom(OBJECT))
    total = layers * blocks
    async with _RelayProcess(tmp / "r", SIZE, backend) as r:
        up = ("--upstream", r.url, "--upstream-ca", str(r.certfile))
        async with _RelayProcess(tmp / "a", SIZE, backend, up) as a, \
                _RelayProcess(tmp / "b", SIZE, backend, up) as b:
            pub = await _client(a, SIZE)
            await pub.publish_namespace(name.namespace)
            served = await pub.publish(name.namespace, name.name)
            watcher = await _client(b, SIZE)
            await announced(watcher, name.namespace[:2], 1, 30)  # routable from B
            proc = await _subscriber(b, name, total)
            try:
                cpu0 = _cpu(r, a, b)
                t0 = time.time()
                for g in range(layers):
                    w = await served.open_subgroup(g, 0, (128 * g) // layers)
                    for i in range(blocks):
                        await w.write_object(i, bytes(payload))
                    await w.write_status(blocks, ObjectStatus.END_OF_GROUP, fin=True)
                assert proc.stdout is not None
                async with asyncio.timeout(600):
                    out = json.loads(await proc.stdout.readline())
                assert out["bytes"] == total * OBJECT, out
                cores = (_cpu(r, a, b) - cpu0) / (time.time() - t0)
            finally:
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()
            await pub.aclose()
            await watcher.aclose()
    return total * OBJECT / (out["end"] - t0) / 1e6, cores


async def first_layer(tmp: Path, layers: int, blocks: int, backend: str, push: bool
                      ) -> tuple[float, float]:
    """(ms to the first whole layer, ms to the last) of a FETCH at B of a completed
    publication made at A, with or without ``--upstream-push`` at A."""
    name = FullTrackName((b"kvcs-1", os.urandom(32), b"bench-push"), b"v.raw.s0")
    payload = bytearray(os.urandom(OBJECT))
    async with _RelayProcess(tmp / "r", SIZE, backend) as r:
        up = ("--upstream", r.url, "--upstream-ca", str(r.certfile))
        extra = (*up, "--upstream-push") if push else up
        async with _RelayProcess(tmp / "a", SIZE, backend, extra) as a, \
                _RelayProcess(tmp / "b", SIZE, backend, up) as b:
            pub = await _client(a, SIZE)
            await publish_track(pub, name, layers, blocks, payload, end=True)
            c = await _client(b, SIZE)
            await announced(c, name.namespace[:2], 1, 30)
            if push:  # the push has reached R: B's first FETCH finds it there
                probe = await _client(r, SIZE)
                for _ in range(200):
                    ts = await probe.track_status(name.namespace, name.name)
                    if ts.params.largest_object is not None and \
                            ts.params.largest_object.group >= layers:
                        break
                    await asyncio.sleep(0.05)
                await probe.aclose()
            t0 = time.perf_counter()
            first = None
            n = 0
            resp = await c.fetch(name.namespace, name.name)
            async for ev in resp:
                if getattr(ev, "status", None) == ObjectStatus.NORMAL:
                    n += 1
                    if n == blocks:
                        first = time.perf_counter() - t0
            last = time.perf_counter() - t0
            assert n == layers * blocks, n
            await c.aclose()
            await pub.aclose()
    assert first is not None
    return first * 1000, last * 1000


def _seed_lmdb(data: Path, publications: int) -> tuple[bytes, ...]:
    """``publications`` committed one-Object Tracks of one scope, written with the storage
    tier directly (what a relay that ran for a while holds). Returns the scope prefix."""
    scope = (b"kvcs-1", os.urandom(32))
    store = LmdbStore(os.fspath(data / "lmdb"), 8 << 30)
    try:
        for i in range(publications):
            key = ((*scope, b"compat", i.to_bytes(4, "big"), b"pub"), b"kv.raw.s0")
            store.commit_track(key, [[StoredObject(0, 0, 0, 0, ObjectStatus.NORMAL, b"",
                                                   b"x" * 64),
                                      StoredObject(0, 0, 1, 0, ObjectStatus.END_OF_TRACK)]])
    finally:
        store.close()
    return scope


async def announce_scale(tmp: Path, publications: int, backend: str) -> dict[str, float]:
    scope = _seed_lmdb(tmp / "a", publications)
    async with _RelayProcess(tmp / "r", SIZE, backend) as r:
        watcher = await _client(r, SIZE)
        counting = asyncio.ensure_future(announced(watcher, scope, publications, 300))
        up = ("--upstream", r.url, "--upstream-ca", str(r.certfile))
        t0 = time.perf_counter()
        async with _RelayProcess(tmp / "a", SIZE, backend, up) as a:
            ready = time.perf_counter() - t0
            probe = await _client(a, SIZE)
            rtts: list[float] = []
            name = FullTrackName((*scope, b"compat", (0).to_bytes(4, "big"), b"pub"),
                                 b"kv.raw.s0")
            while not counting.done():
                s = time.perf_counter()
                await probe.track_status(name.namespace, name.name)
                rtts.append(time.perf_counter() - s)
            await counting
            everything = time.perf_counter() - t0
            idle = []
            for _ in range(50):
                s = time.perf_counter()
                await probe.track_status(name.namespace, name.name)
                idle.append(time.perf_counter() - s)
            await probe.aclose()
        await watcher.aclose()
    return {"ready_s": ready, "all_announced_s": everything,
            "worst_rtt_ms": max(rtts) * 1000 if rtts else 0.0,
            "median_rtt_ms": statistics.median(rtts) * 1000 if rtts else 0.0,
            "idle_rtt_ms": statistics.median(idle) * 1000}


async def _run(backends: list[str], layers: int, blocks: int, publications: int,
               scale: int, deep_mib: int, sections: set[str]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory() as d:
        for backend in backends:
            tmp = Path(d) / backend
            if "scale" in sections:
                con = await _tree_scale.consumers(tmp / "consumers", scale, backend)
                sc = await _tree_scale.scopes(tmp / "scopes", scale, backend)
                dp = await _tree_scale.deep(tmp / "deep", deep_mib, backend)
                rows += _tree_scale.rows(backend, scale, con, sc, dp)
            if "flow" not in sections:
                continue
            one, *_ = await fan_out(tmp / "one", SIZE, layers, blocks, 1, backend)
            tree, cores = await tree_live(tmp / "tree", layers, blocks, backend)
            rows.append([backend, "1->1 one relay (baseline)", round(one, 1), "MB/s", ""])
            rows.append([backend, "1->1 A->R->B", round(tree, 1), "MB/s",
                         round(tree / one, 2)])
            rows.append([backend, "... CPU of the three relays meanwhile", round(cores, 2),
                         f"cores (of {os.cpu_count()})", ""])
            pull = await first_layer(tmp / "pull", layers, blocks, backend, push=False)
            push = await first_layer(tmp / "push", layers, blocks, backend, push=True)
            rows.append([backend, "FETCH at B, first layer, pulled through R from A",
                         round(pull[0], 1), "ms", ""])
            rows.append([backend, "FETCH at B, first layer, pushed to R (upstream_push)",
                         round(push[0], 1), "ms", round(push[0] / pull[0], 2)])
            rows.append([backend, "FETCH at B, last layer, pulled", round(pull[1], 1), "ms",
                         ""])
            rows.append([backend, "FETCH at B, last layer, pushed", round(push[1], 1), "ms",
                         round(push[1] / pull[1], 2)])
            sc = await announce_scale(tmp / "scale", publications, backend)
            rows.append([backend, f"A restarts with {publications} publications: ready",
                         round(sc["ready_s"], 2), "s", ""])
            rows.append([backend, "... all announced and known at R",
                         round(sc["all_announced_s"], 2), "s", ""])
            rows.append([backend, "... TRACK_STATUS at A meanwhile, worst (median)",
                         round(sc["worst_rtt_ms"], 1), f"ms ({sc['median_rtt_ms']:.1f})",
                         round(sc["worst_rtt_ms"] / sc["idle_rtt_ms"], 1)])
            rows.append([backend, "... TRACK_STATUS at A idle, median",
                         round(sc["idle_rtt_ms"], 2), "ms", ""])
    return rows


def main() -> None:
    backends = os.environ.get("BENCH_TREE_BACKENDS", "qh3,aioquic").split(",")
    layers = int(os.environ.get("BENCH_TREE_LAYERS", "8"))
    blocks = int(os.environ.get("BENCH_TREE_BLOCKS", "64"))
    publications = int(os.environ.get("BENCH_TREE_PUBLICATIONS", "10000"))
    scale = int(os.environ.get("BENCH_TREE_SCALE", "1000"))
    sections = set(os.environ.get("BENCH_TREE_SECTIONS", "flow,scale").split(","))
    deep_mib = int(os.environ.get("BENCH_TREE_DEEP_MIB", "1024"))
    rows = asyncio.run(_run(backends, layers, blocks, publications, scale, deep_mib,
                            sections))
    report("tree", ["backend", "case", "value", "unit", "ratio"], rows,
           extra={"layers": layers, "blocks": blocks, "object_bytes": OBJECT,
                  "max_datagram_size": SIZE, "publications": publications, "scale": scale,
                  "deep_mib": deep_mib,
                  "note": "ratio: tree / one relay (throughput), pushed / pulled (times), "
                          "worst / idle (round trips), last tenth / first tenth (scale); "
                          "every relay its own process"})


if __name__ == "__main__":
    main()
