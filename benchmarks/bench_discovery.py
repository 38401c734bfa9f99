"""Cost as the store grows (issue 23 item 8): a relay restarts holding N committed
publications of one model and scope in LMDB; its time to ready and resident memory, and the
time ``kvcs fetch``'s discovery (``relay.peers.discovery.discover``, what the CLI runs) takes
for a 4,096-token prompt (256 Block Keys of 16 tokens) whose publication is
* the whole prompt (found in the first wave of per-Anchor-Key requests),
* its first 10 blocks (found in the last of 4 waves),
* absent (every wave answered, nothing found; no extra waiting window).
Each against the same relay holding none of the N (the baseline, same run): the ratio shows
whether discovery grows with the store (it should not: one request per Anchor Key, never a
model-wide one answered with every publication).

Run: ``python -m benchmarks discovery`` (BENCH_DISCOVERY_PUBLICATIONS, BENCH_DISCOVERY_BACKEND).
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
from benchmarks.bench_relay import _client, _RelayProcess
from relay.kvcs.namespace import content_prefix
from relay.moqt.codes import ObjectStatus
from relay.peers.discovery import discover
from storage.interface import StoredObject
from storage.lmdb_store import LmdbStore

SIZE = 1200
KEYS = 256  # 4,096 tokens in blocks of 16
REPEAT = 5


def _seed(data: Path, scope: bytes, compat: bytes, publications: int,
          prompt: list[bytes]) -> None:
    """``publications`` unrelated committed publications of the model, plus the prompt's own
    two (its 10-block prefix and its whole length), written with the storage tier directly."""
    store = LmdbStore(os.fspath(data / "lmdb"), 8 << 30)
    anchors = [os.urandom(32) for _ in range(publications)] + [prompt[9], prompt[-1]]
    try:
        for anchor in anchors:
            ns = (*content_prefix(scope, compat, anchor), os.urandom(16))
            store.commit_track((ns, b"manifest"), [[
                StoredObject(0, 0, 0, 0, ObjectStatus.NORMAL, b"", b"x" * 64),
                StoredObject(0, 0, 1, 0, ObjectStatus.END_OF_TRACK)]])
    finally:
        store.close()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _timed(session: Any, scope: bytes, compat: bytes, keys: list[bytes],
                 want: int) -> float:
    times = []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        found = await asyncio.wait_for(discover(session, scope, compat, keys, window=0.0), 60)
        times.append(time.perf_counter() - t0)
        assert (found[0].blocks if found else 0) == want, (found[:1], want)
    return statistics.median(times) * 1000


async def measure(tmp: Path, publications: int, backend: str) -> dict[str, float]:
    scope, compat = os.urandom(32), os.urandom(32)
    prompt = [os.urandom(32) for _ in range(KEYS)]
    _seed(tmp, scope, compat, publications, prompt)
    t0 = time.perf_counter()
    async with _RelayProcess(tmp, SIZE, backend) as r:
        ready = time.perf_counter() - t0
        assert r.proc is not None
        rss = _rss_mb(r.proc.pid)
        session = await _client(r, SIZE)
        try:
            whole = await _timed(session, scope, compat, prompt, KEYS)
            short = await _timed(session, scope, compat, prompt[:KEYS - 1], 10)
            miss = await _timed(session, scope, compat, prompt[:9], 0)
        finally:
            await session.aclose()
    return {"ready_s": ready, "rss_mb": rss, "whole_ms": whole, "short_ms": short,
            "miss_ms": miss}


async def _run(publications: int, backend: str) -> list[list[Any]]:
    with tempfile.TemporaryDirectory() as d:
        base = await measure(Path(d) / "none", 0, backend)
        big = await measure(Path(d) / "many", publications, backend)
    rows = []
    for key, what, unit in (("ready_s", "restart to ready", "s"),
                            ("rss_mb", "relay RSS when ready", "MB"),
                            ("whole_ms", "discovery, the whole prompt published", "ms"),
                            ("short_ms", "discovery, only its first 10 blocks (4 waves)", "ms"),
                            ("miss_ms", "discovery, nothing published (9 keys, 1 wave)", "ms")):
        rows.append([what, round(base[key], 2), round(big[key], 2), unit,
                     round(big[key] / base[key], 2) if base[key] else ""])
    return rows


def main() -> None:
    publications = int(os.environ.get("BENCH_DISCOVERY_PUBLICATIONS", "10000"))
    backend = os.environ.get("BENCH_DISCOVERY_BACKEND", "aioquic")
    rows = asyncio.run(_run(publications, backend))
    report("discovery", ["case", "2 publications", f"{publications + 2} publications", "unit",
                         "ratio"], rows,
           extra={"publications": publications, "backend": backend, "keys": KEYS,
                  "repeat": REPEAT, "note": "median of the repeats; ratio: many / 2, same "
                                            "run, same relay build"})


if __name__ == "__main__":
    main()
