"""`kvcs relay` as a process: SIGTERM during a live publication drains (GOAWAY, commits) and
exits 0; a restart on the same data directory serves the committed Track bit-identical."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from ops_http import http_get
from relay_helpers import TIMEOUT, group_payloads, make_ns, push_track

from relay.moqt.primitives import FullTrackName, Location
from relay.service import RelayConfig, start_relay
from relay.session import open_session
from storage.interface import Tier

ROOT = Path(__file__).resolve().parents[2]


async def _start(data: Path, ready: Path) -> tuple[asyncio.subprocess.Process, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCS_RELAY_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay.cli", "relay", "--listen", "127.0.0.1:0",
        "--data-dir", str(data), "--metrics-listen", "127.0.0.1:0", "--ready-file", str(ready),
        "--drain-timeout", "5", "--memory-bytes", str(64 << 20), "--lmdb-bytes", str(64 << 20),
        env=env, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL)
    assert proc.stderr is not None
    lines: list[str] = []
    async with asyncio.timeout(30):
        while True:
            raw = await proc.stderr.readline()
            assert raw, "relay exited before it was ready:\n" + "".join(lines)
            lines.append(raw.decode())
            if "relay ready" in lines[-1]:
                break

    async def pump() -> None:  # keep reading, or a full pipe would block the relay
        assert proc.stderr is not None
        while raw := await proc.stderr.readline():
            lines.append(raw.decode())

    asyncio.get_running_loop().create_task(pump())
    return proc, lines


async def _committed(metrics_port: int, n: int) -> None:
    async with asyncio.timeout(TIMEOUT):
        while True:
            _, body = await http_get(metrics_port, "/metrics")
            if f"kvcs_relay_lmdb_committed_tracks_total {float(n)}" in body:
                return
            await asyncio.sleep(0.02)  # polling the HTTP endpoint, bounded by the deadline


async def test_sigterm_drains_and_the_committed_track_survives(tmp_path: Path) -> None:
    data, ready = tmp_path / "data", tmp_path / "ready.json"
    proc, lines = await _start(data, ready)
    try:
        info = json.loads(ready.read_text())
        url, ca = f"moqt://127.0.0.1:{info['port']}/", data / "tls" / "cert.pem"
        assert (await http_get(info["metrics_port"], "/readyz"))[0] == 200

        pub = await asyncio.wait_for(open_session(url, ca_file=ca), TIMEOUT)
        done = FullTrackName(make_ns(), b"k.raw.s0")
        track = await push_track(pub, done, layers=3)
        for g in range(3):
            await track.group(g, group_payloads(g, 5))
        await track.end()
        await _committed(info["metrics_port"], 1)

        live = await push_track(pub, FullTrackName(make_ns(), b"v.raw.s0"), layers=8)
        await live.group(0, group_payloads(0, 5))  # a second publication, still going

        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT):
            rc = await proc.wait()
        log = "".join(lines)
        assert rc == 0, log
        assert "shutting down: GOAWAY" in log and "relay stopped" in log
        assert "Traceback" not in log
        await pub.aclose()
    finally:
        if proc.returncode is None:
            proc.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), TIMEOUT)

    r = await start_relay(RelayConfig(listen_port=0, data_dir=data, memory_bytes=64 << 20,
                                      lmdb_bytes=64 << 20))
    try:
        sub = await asyncio.wait_for(open_session(r.url, ca_file=r.certfile), TIMEOUT)
        resp = await asyncio.wait_for(sub.fetch(done.namespace, done.name), TIMEOUT)
        assert resp.end_of_track and resp.end_location == Location(3, 0)
        async with asyncio.timeout(TIMEOUT):
            got = {e.location: bytes(e.payload) for e in await resp.collect()}
        assert got == track.sent
        assert r.relay.counters.fetch.objects[Tier.LMDB] == 15
        await sub.aclose()
    finally:
        await r.close()
