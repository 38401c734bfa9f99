"""Per-scope quotas over real QUIC and LMDB: a flooding scope evicts only its own Tracks;
max_sessions refuses the excess cleanly; the per-session memory figure of
docs/configuration.md is measured on a real `kvcs relay` process."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from admin_helpers import admin_relay, committed_track
from test_ops_metrics import scrape, val

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
from cli_harness import KVCS
from relay_helpers import TIMEOUT, client, fetch_objects, make_ns

from relay.core.relay import RelayOptions
from relay.moqt.primitives import FullTrackName
from relay.session import RequestRejected, SessionFailure
from storage.quota import ScopeQuotas

MiB = 1 << 20
TRACK = 3 * 3 * 20_000  # 3 Groups of 3 Objects of 20 kB: 180 kB of payload per Track


async def _served(r: object, name: FullTrackName) -> int:
    """How many Objects a FETCH of ``name`` gets (0 if refused)."""
    s = await client(r)  # type: ignore[arg-type]
    try:
        return len((await fetch_objects(s, name))[1])
    except RequestRejected:
        return 0
    finally:
        await s.aclose()


async def test_a_flooding_scope_evicts_only_its_own_tracks(tmp_path: Path) -> None:
    quiet, flood = make_ns(), make_ns()
    # Quotas of 1 MiB per scope and tiers of 1.5 MiB: the flood hits its own quota and the
    # tier's bound, and must pay for both with its own Tracks.
    quotas = ScopeQuotas(1 * MiB, 1 * MiB, {quiet[1]: (1 * MiB, 1 * MiB)})
    r = await admin_relay(tmp_path, memory_bytes=3 * MiB // 2, lmdb_bytes=3 * MiB // 2,
                          scope_quotas=quotas)
    kept = [FullTrackName(quiet, b"k.raw.s%d" % i) for i in range(3)]
    flooded = [FullTrackName(flood, b"k.raw.s%d" % i) for i in range(12)]
    try:
        for name in (*kept, *flooded):
            await committed_track(r, name, groups=3, size=20_000)
        for name in kept:
            assert await _served(r, name) == 9, name
        assert await _served(r, flooded[-1]) == 9
        assert await _served(r, flooded[0]) < 9  # the flood's oldest went
        m = await scrape(r)
        label = quiet[1].hex()
        for tier in ("memory", "lmdb"):
            assert val(m, "kvcs_relay_scope_evictions_total", scope=label, tier=tier) == 0
            assert val(m, "kvcs_relay_scope_evictions_total", scope="other", tier=tier) > 0
            assert val(m, "kvcs_relay_scope_stored_bytes", scope="other", tier=tier) <= MiB
            assert val(m, "kvcs_relay_scope_stored_bytes", scope=label, tier=tier) >= 3 * TRACK
            assert val(m, "kvcs_relay_scope_quota_bytes", scope=label, tier=tier) == MiB
        print(f"\nquota test: 2 scopes, quota 1 MiB each, tiers 1.5 MiB; quiet scope 3 x "
              f"{TRACK} B Tracks all served; flood 12 x {TRACK} B, "
              f"{val(m, 'kvcs_relay_scope_evictions_total', scope='other', tier='memory'):.0f}"
              f" memory Groups and "
              f"{val(m, 'kvcs_relay_scope_evictions_total', scope='other', tier='lmdb'):.0f}"
              f" LMDB Tracks of its own evicted")
    finally:
        await r.close()


async def test_max_sessions_refuses_the_excess_cleanly_and_counts_it(tmp_path: Path) -> None:
    r = await admin_relay(tmp_path, options=RelayOptions(max_sessions=2))
    try:
        a, b = await client(r), await client(r)
        try:
            await client(r)
        except SessionFailure as e:
            assert "too many sessions" in str(e)
        else:
            raise AssertionError("a third session was accepted")
        assert val(await scrape(r), "kvcs_relay_sessions_refused_total") == 1
        await a.aclose()
        async with asyncio.timeout(TIMEOUT):  # the relay sees the close, then admits again
            while r.relay._connections >= 2:
                await asyncio.sleep(0.01)  # no event for "a session ended"; bounded
        c = await client(r)
        for s in (b, c):
            await s.aclose()
    finally:
        await r.close()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_memory_per_session_of_a_relay_process(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"  # names the port the kernel chose
    proc = await asyncio.create_subprocess_exec(
        *KVCS, "relay", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d"),
        "--metrics-listen", "off", "--ready-file", str(ready), "--log-level", "WARNING",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    sessions = []
    try:
        async with asyncio.timeout(TIMEOUT):
            while not ready.exists():  # the relay writes it atomically once listening
                await asyncio.sleep(0.02)
        info = json.loads(ready.read_text())
        pid = info["pid"]
        url, cert = f"moqt://127.0.0.1:{info['port']}/", tmp_path / "d" / "tls" / "cert.pem"

        class _R:  # what relay_helpers.client needs
            def __init__(self) -> None:
                self.url, self.certfile = url, cert

        sessions.append(await client(_R()))  # type: ignore[arg-type]
        before = _rss(pid)
        n = 40
        for _ in range(n):
            sessions.append(await client(_R()))  # type: ignore[arg-type]
        per = (_rss(pid) - before) / n
        print(f"\nrelay RSS per idle session: {per / 1000:.0f} kB ({n} sessions)")
        assert per < 1_000_000
    finally:
        for s in sessions:
            await s.aclose()
        proc.terminate()
        await asyncio.wait_for(proc.wait(), TIMEOUT)
