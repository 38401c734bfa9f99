"""A SIGKILLed upstream relay (a `kvcs relay` process): the lower relay notices within its
upstream idle timeout, ends live subscriptions, refuses new requests as TIMEOUT "upstream
unreachable" within their FILL_TIMEOUT, and reconnects once the upstream is back."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
from cli_harness import free_udp_port
from relay_helpers import (
    TIMEOUT,
    client,
    drain,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
)

from relay.moqt.codes import RequestErrorCode
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName
from relay.session import MoqtSession, RequestRejected, open_session

ROOT = Path(__file__).resolve().parents[2]


async def _origin(data: Path, port: int) -> asyncio.subprocess.Process:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay.cli", "relay", "--listen", f"127.0.0.1:{port}",
        "--data-dir", str(data), "--metrics-listen", "off", "--memory-bytes", str(64 << 20),
        "--lmdb-bytes", str(64 << 20), env=env, stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL)
    assert proc.stderr is not None
    async with asyncio.timeout(30):
        while b"relay ready" not in (line := await proc.stderr.readline()):
            assert line, "the relay exited before it was ready"
    asyncio.get_running_loop().create_task(proc.stderr.read())  # never block on the pipe
    return proc


async def _refused(aw: object) -> tuple[RequestRejected, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RequestRejected) as e:
        await asyncio.wait_for(aw, TIMEOUT)  # type: ignore[arg-type]
    return e.value, loop.time() - started


async def test_sigkilled_origin_is_noticed_reported_and_reconnected(tmp_path: Path) -> None:
    port = free_udp_port()
    url, ca = f"moqt://127.0.0.1:{port}/", tmp_path / "o" / "tls" / "cert.pem"
    origin = await _origin(tmp_path / "o", port)
    edge = await relay_at(tmp_path / "edge", upstream=[url])
    link = edge.relay.upstream
    assert link is not None
    loop = asyncio.get_running_loop()
    try:
        pub = await asyncio.wait_for(open_session(url, ca_file=ca), TIMEOUT)
        name = FullTrackName(make_ns(), b"k.raw.s0")
        track = await push_track(pub, name, layers=4)
        await track.group(0, group_payloads(0, 3))
        c = await client(edge)
        sub = await asyncio.wait_for(c.subscribe(name.namespace, name.name, live_params()),
                                     TIMEOUT)
        origin.kill()  # SIGKILL: no CONNECTION_CLOSE, the edge hears nothing more
        await origin.wait()
        killed = loop.time()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        assert got.done is not None and loop.time() - killed < 6.0  # idle timeout 3 s
        assert link.lost == 1

        other = FullTrackName(make_ns(), b"k.raw.s0")
        err, took = await _refused(c.fetch(other.namespace, other.name,
                                           Params(fill_timeout=2000)))
        assert err.code == RequestErrorCode.TIMEOUT and "unreachable" in str(err)
        assert took < 4.0  # FILL_TIMEOUT 2 s, not the QUIC idle timeout
        err, took = await _refused(c.subscribe(other.namespace, other.name, live_params()))
        assert err.code == RequestErrorCode.TIMEOUT and took < 4.0
        err, _ = await _refused(c.track_status(other.namespace, other.name))
        assert err.code == RequestErrorCode.TIMEOUT
        assert edge.relay.counters.upstream_unreachable == 3

        # the origin is back (same port, same data): the link reconnects, requests work
        origin = await _origin(tmp_path / "o", port)
        async with asyncio.timeout(TIMEOUT):
            while await link.get(wait=True) is None:
                pass  # each round waits out the link's own backoff
        pub2: MoqtSession = await asyncio.wait_for(open_session(url, ca_file=ca), TIMEOUT)
        track2 = await push_track(pub2, other, layers=1)
        await track2.group(0, group_payloads(0, 2))
        sub2 = await asyncio.wait_for(c.subscribe(other.namespace, other.name,
                                                  live_params()), TIMEOUT)
        await track2.end()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub2)
        assert got.objects == track2.sent
    finally:
        await edge.close()
        if origin.returncode is None:
            origin.terminate()
            await asyncio.wait_for(origin.wait(), TIMEOUT)
