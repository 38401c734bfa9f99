"""A root tier with no single point (docs/relay.md, "A root of several replicas"): three
`kvcs relay` replicas linked as peers, edges A and B listing every replica as upstream.
SIGKILL any one replica (replica 0 included) and a publication made at A before the kill is
fetched at B within 5 s of it, bit for bit."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
from cli_harness import free_udp_port
from relay_helpers import TIMEOUT, client, complete_track, fetch_objects, make_ns, relay_at

from relay.moqt.primitives import FullTrackName, Location
from relay.session.errors import SessionFailure

ROOT = Path(__file__).resolve().parents[2]
IDLE = 1.0  # upstream_idle_timeout of every link: a dead replica is noticed within it
WITHIN = 5.0  # seconds from the kill to the fetch at B


async def _replica(data: Path, port: int, urls: list[str]) -> asyncio.subprocess.Process:
    """Replica ``port`` of the tier: every replica's URL (its own included) as its peers."""
    peers = [arg for u in urls for arg in ("--peer", u)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay.cli", "relay", "--listen", f"127.0.0.1:{port}",
        "--data-dir", str(data), "--metrics-listen", "off", "--memory-bytes", str(64 << 20),
        "--lmdb-bytes", str(64 << 20), "--upstream-idle-timeout", str(IDLE),
        "--peer-insecure", *peers, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL)
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(30):
            while b"relay ready" not in (line := await proc.stderr.readline()):
                assert line, "the replica exited before it was ready"
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    asyncio.get_running_loop().create_task(proc.stderr.read())  # never block on the pipe
    return proc


async def test_losing_any_root_replica_leaves_a_publication_at_a_fetchable_at_b(
        tmp_path: Path) -> None:
    ports = [free_udp_port() for _ in range(3)]
    urls = [f"moqt://127.0.0.1:{p}/" for p in ports]
    procs = list(await asyncio.gather(*(_replica(tmp_path / f"r{i}", p, urls)
                                        for i, p in enumerate(ports))))
    loop = asyncio.get_running_loop()
    try:
        for k in range(3):  # replica k dies; then it restarts for the next round
            # A announces to replica k and fails over to k+1; B is on k+2, so B's request
            # reaches A only through a peer link: k+2 -> k+1 -> A
            a = await relay_at(tmp_path / f"a{k}", upstream=urls[k:] + urls[:k],
                               upstream_idle_timeout=IDLE)
            b = await relay_at(tmp_path / f"b{k}", upstream=urls[k - 1:] + urls[:k - 1],
                               upstream_idle_timeout=IDLE)
            try:
                name = FullTrackName(make_ns(), b"k.raw.s0")
                t = await complete_track(await client(a), name, layers=4, per_group=3)
                assert a.relay.announcer is not None
                async with asyncio.timeout(TIMEOUT):
                    while not a.relay.announcer.announced:  # accepted by replica k
                        await asyncio.sleep(0.01)
                assert a.relay.upstream is not None and a.relay.upstream.session is not None
                c = await client(b)
                procs[k].kill()
                await procs[k].wait()
                killed = loop.time()
                got: dict[Location, bytes] = {}
                while got != t.sent:
                    left = killed + WITHIN - loop.time()
                    assert left > 0, f"replica {k} killed: not fetched at B within {WITHIN} s"
                    try:
                        async with asyncio.timeout(left):
                            _resp, got = await fetch_objects(c, name)
                    except (SessionFailure, TimeoutError):
                        await asyncio.sleep(0.05)  # not routable yet: ask again
                assert got == t.sent
            finally:
                await b.close()
                await a.close()
            if k < 2:
                procs[k] = await _replica(tmp_path / f"r{k}", ports[k], urls)
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
                await asyncio.wait_for(p.wait(), TIMEOUT)
