"""Relay trees as a user runs them (`kvcs relay --upstream`, `kvcs publish`, `kvcs fetch`): a
cache published at one relay is fetched at another through the root; a SIGKILLed lower relay
costs a consumer elsewhere a bounded, documented error, its namespaces are withdrawn within its
idle timeout, and once it restarts it announces its LMDB Tracks again; a lower relay with
`--workers 2` is one relay to its upstream."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
from cli_harness import free_udp_port, run_kvcs
from relay_helpers import TIMEOUT, client, make_ns, push_track, relay_at

from relay.kvcs.kvfile import read_kvfile
from relay.moqt.primitives import FullTrackName, TrackNamespace
from relay.service import RunningRelay
from relay.session import MoqtSession, open_session

ROOT = Path(__file__).resolve().parents[2]
SYNTH = "8,4,64,256,float16,1"  # 8 layers: a small real KVCS publication


@asynccontextmanager
async def relay_process(data: Path, port: int, upstream: RunningRelay | None, *extra: str
                        ) -> AsyncIterator[asyncio.subprocess.Process]:
    """A `kvcs relay [--upstream]` process on ``port`` until SIGKILLed or the block ends."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    up = ("--upstream", upstream.url, "--upstream-ca", str(upstream.certfile)) \
        if upstream is not None else ()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay.cli", "relay", "--listen", f"127.0.0.1:{port}",
        "--data-dir", str(data), "--metrics-listen", "off", *up, *extra, env=env,
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL)
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(60):
            while b"relay ready" not in (line := await proc.stderr.readline()):
                assert line, "the relay exited before it was ready"
        drain = asyncio.ensure_future(proc.stderr.read())  # never block on the pipe
        try:
            yield proc
        finally:
            if proc.returncode is None:
                proc.terminate()
                await asyncio.wait_for(proc.wait(), TIMEOUT)
            drain.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def next_event(events: AsyncIterator[object], namespace: TrackNamespace | None,
                     active: bool) -> TrackNamespace:
    async with asyncio.timeout(TIMEOUT):
        while True:
            ev = await anext(events)
            if ev.active == active and namespace in (None, ev.namespace):  # type: ignore[attr-defined]
                return ev.namespace  # type: ignore[attr-defined,no-any-return]


def fetch_args(relay: RunningRelay, tmp: Path, name: str, deadline_ms: int,
               published: str = "published") -> list[str]:
    source = tmp / f"{published}.safetensors"
    out = tmp / f"{name}.safetensors"
    return ["fetch", "--relay", relay.url, "--ca", str(relay.certfile), "--descriptor",
            str(source), "--tokens", str(source), "--scope-key", str(tmp / "scope.key"),
            "--out", str(out), "--report", str(out.with_suffix(".json")),
            "--deadline-ms", str(deadline_ms)]


def same_cache(a: Path, b: Path) -> bool:
    x, y = read_kvfile(a), read_kvfile(b)
    return np.asarray(x.k).tobytes() == np.asarray(y.k).tobytes() and \
        np.asarray(x.v).tobytes() == np.asarray(y.v).tobytes() and x.tokens == y.tokens


async def test_kvcs_fetch_at_b_of_a_cache_published_at_a_through_a_kill_and_restart(
        tmp_path: Path) -> None:
    (tmp_path / "scope.key").write_bytes(os.urandom(32))
    r = await relay_at(tmp_path / "r")
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    port = free_udp_port()
    loop = asyncio.get_running_loop()
    try:
        watcher = await client(r)
        nsub = await asyncio.wait_for(watcher.subscribe_namespace((b"kvcs-1",)), TIMEOUT)
        events = aiter(nsub)
        async with relay_process(tmp_path / "a", port, r) as a:
            a_url = f"moqt://127.0.0.1:{port}/"
            code, _out, err = await run_kvcs(
                "publish", "--relay", a_url, "--ca", str(tmp_path / "a" / "tls" / "cert.pem"),
                "--synthetic", SYNTH, "--scope-key", str(tmp_path / "scope.key"),
                "--out", str(tmp_path / "published.safetensors"), timeout=60)
            assert code == 0, err
            ns = await next_event(events, None, True)  # announced up to the root
            a.kill()  # SIGKILL: no CONNECTION_CLOSE, the root hears nothing more
            await a.wait()
            killed = loop.time()
            # a consumer at B now: bounded by its deadline, a documented error, never a hang
            code, _out, err = await run_kvcs(*fetch_args(b, tmp_path, "lost", 8000),
                                             timeout=30)
            assert code in (3, 4), err
            assert "Traceback" not in err and err.strip().count("\n") <= 1, err
            # the root withdrew A's namespace within A's upstream idle timeout (3 s)
            await next_event(events, ns, False)
            assert loop.time() - killed < 3.0 + 8.0 + 2.0  # the fetch above ran meanwhile
        # A restarted on its LMDB: announced again, and the same fetch at B succeeds
        async with relay_process(tmp_path / "a", port, r):
            await next_event(events, ns, True)
            code, _out, err = await run_kvcs(*fetch_args(b, tmp_path, "fetched", 30000),
                                             timeout=60)
            assert code == 0, err
            assert same_cache(tmp_path / "published.safetensors",
                              tmp_path / "fetched.safetensors")
            report = json.loads((tmp_path / "fetched.json").read_text())
            assert report["objects_discarded"] == 0
    finally:
        await b.close()
        await r.close()


async def test_a_lower_relay_with_two_workers_is_one_relay_to_its_upstream(
        tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "r")
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    port = free_udp_port()
    sessions: list[MoqtSession] = []
    try:
        async with relay_process(tmp_path / "a", port, r, "--workers", "2"):
            url, ca = f"moqt://127.0.0.1:{port}/", tmp_path / "a" / "tls" / "cert.pem"
            names = [FullTrackName(make_ns(), b"kv.raw.s0") for _ in range(12)]
            tracks = []
            # twelve publishers from twelve source ports: both workers get some (the
            # kernel hashes sessions over the workers; all on one is 1 in 2,048)
            for name in names:
                s = await asyncio.wait_for(open_session(url, ca_file=ca), TIMEOUT)
                sessions.append(s)
                t = await push_track(s, name, layers=1)
                await t.group(0, [os.urandom(1000), os.urandom(1000)])
                await t.end()
                tracks.append(t)
            c = await client(b)
            for name, t in zip(names, tracks, strict=True):
                resp = await asyncio.wait_for(c.fetch(name.namespace, name.name), TIMEOUT)
                async with asyncio.timeout(TIMEOUT):
                    got = {e.location: bytes(e.payload) for e in await resp.collect()}
                assert got == t.sent
            # both workers announced to the root, each its own publications
            lower = {id(e.source) for name in names
                     for e in r.relay.namespaces.sources_of(name.namespace)}
            assert len(lower) == 2
    finally:
        for s in sessions:
            await s.aclose()
        await b.close()
        await r.close()


async def test_an_edge_serves_a_publication_it_holds_after_its_origin_died(
        tmp_path: Path) -> None:
    """Issue 26 item 3 and issue 35 item 4, as a user sees it: `kvcs fetch` at an edge of a
    publication it fetched once before, after its origin was SIGKILLed and the edge noticed
    (its idle timeout): three separate runs, each a new session, exit 0 bit for bit; one of
    a publication the edge never held exits 9 (its upstream is unreachable) within 5 s."""
    (tmp_path / "scope.key").write_bytes(os.urandom(32))
    port = free_udp_port()
    loop = asyncio.get_running_loop()
    async with relay_process(tmp_path / "o", port, None) as origin:
        url = f"moqt://127.0.0.1:{port}/"
        # a short idle timeout: the edge notices the death within a second
        edge = await relay_at(tmp_path / "e", upstream=[url], upstream_idle_timeout=1.0)
        try:
            published = await asyncio.gather(*(run_kvcs(
                "publish", "--relay", url, "--ca", str(tmp_path / "o" / "tls" / "cert.pem"),
                "--synthetic", synth, "--scope-key", str(tmp_path / "scope.key"),
                "--out", str(tmp_path / f"{out}.safetensors"), timeout=60)
                for out, synth in (("published", SYNTH), ("other", "8,4,64,256,float16,2"))))
            for code, _out, err in published:
                assert code == 0, err
            code, _out, err = await run_kvcs(*fetch_args(edge, tmp_path, "first", 30000),
                                             timeout=60)
            assert code == 0, err
            origin.kill()
            await origin.wait()
            link = edge.relay.upstream
            assert link is not None
            async with asyncio.timeout(TIMEOUT):
                while link.lost == 0:  # the edge noticed (its idle timeout)
                    await asyncio.sleep(0.05)  # poll step: the link has no event for it
            # three consumers at once, each its own process and session
            runs = await asyncio.gather(*(run_kvcs(*fetch_args(edge, tmp_path, f"again{i}",
                                                               30000), timeout=60)
                                          for i in range(3)))
            for i, (code, _out, err) in enumerate(runs):
                assert code == 0, err
                assert same_cache(tmp_path / "published.safetensors",
                                  tmp_path / f"again{i}.safetensors")
            started = loop.time()
            code, _out, err = await run_kvcs(*fetch_args(edge, tmp_path, "never", 30000,
                                                         published="other"), timeout=60)
            assert code == 9 and "upstream is unreachable" in err, (code, err)
            assert loop.time() - started < 5.0
        finally:
            await edge.close()
