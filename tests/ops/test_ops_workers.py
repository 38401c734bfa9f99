"""`kvcs relay --workers 2`: two processes on one UDP port and one LMDB are one relay.

A publisher and a subscriber that land on different workers (sessions are opened from new
source ports until the workers' own metrics show both used) get every Object exactly once,
live and by FETCH; the Track is committed once; a SIGKILLed worker comes back while the other
worker's sessions go on, and the committed Track is served by it; SIGTERM drains both and
exits 0; after a restart each worker serves the committed Track from LMDB.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from admin_helpers import TOKEN, http, purge
from ops_http import http_get
from relay_helpers import (
    TIMEOUT,
    drain,
    fetch_objects,
    group_payloads,
    make_ns,
    push_track,
    wait_namespace,
)

from relay.admin import format_namespace
from relay.moqt.codes import RequestErrorCode
from relay.moqt.primitives import FullTrackName, Location
from relay.session import MoqtSession, RequestRejected, open_session

KVCS = [sys.executable, "-m", "relay.cli"]


@asynccontextmanager
async def workers(data: Path, ready: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    ready.unlink(missing_ok=True)
    token_file = data.parent / "admin.token"
    token_file.write_text(TOKEN)
    log = (data.parent / "relay.log").open("ab")  # the supervisor's and workers' lines
    proc = await asyncio.create_subprocess_exec(
        *KVCS, "relay", "--workers", "2", "--listen", "127.0.0.1:0", "--data-dir", str(data),
        "--metrics-listen", "127.0.0.1:0", "--ready-file", str(ready),
        "--admin-token-file", str(token_file),
        stdout=asyncio.subprocess.DEVNULL, stderr=log)
    log.close()
    try:
        async with asyncio.timeout(60):
            while not ready.exists():
                assert proc.returncode is None, "the supervisor exited before it was ready"
                await asyncio.sleep(0.05)
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def info(ready: Path) -> dict[str, Any]:
    return json.loads(ready.read_text())  # type: ignore[no-any-return]


async def sessions_open(metrics_port: int) -> int:
    code, body = await http_get(metrics_port, "/metrics")
    assert code == 200
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in body.splitlines()
               if line.startswith("kvcs_relay_sessions_open{"))


async def counts(ready: Path) -> list[int]:
    return [await sessions_open(w["metrics_port"]) for w in info(ready)["workers"]]


async def connect_on(ready: Path, data: Path, want: int, keep: list[MoqtSession]
                     ) -> MoqtSession:
    """A session that landed on worker ``want``: new sessions (new source ports) until the
    workers' metrics show one there; the others stay open in ``keep`` (closed by the test)."""
    url = f"moqt://127.0.0.1:{info(ready)['port']}/"
    for _ in range(40):
        before = await counts(ready)
        s = await asyncio.wait_for(open_session(url, ca_file=data / "tls" / "cert.pem"), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            while (after := await counts(ready)) == before:
                await asyncio.sleep(0.02)  # the SETUP is counted as the handshake ends
        if after[want] > before[want]:
            return s
        keep.append(s)
    raise AssertionError(f"40 sessions and none on worker {want}")


async def metric(port: int, name: str) -> float:
    code, body = await http_get(port, "/metrics")
    assert code == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.split("{")[0].split(" ")[0] == name)


async def test_two_workers_are_one_relay(tmp_path: Path) -> None:
    data, ready = tmp_path / "data", tmp_path / "ready.json"
    name = FullTrackName(make_ns(), b"k.raw.s0")
    keep: list[MoqtSession] = []
    async with workers(data, ready) as sup:
        mport = info(ready)["metrics_port"]
        assert (await http_get(mport, "/healthz"))[0] == 200
        pub = await connect_on(ready, data, 0, keep)
        sub_s = await connect_on(ready, data, 1, keep)
        # live: the subscriber on worker 1 discovers and subscribes to worker 0's Track
        track = await push_track(pub, name, layers=3)
        await wait_namespace(sub_s, name.namespace)
        sub = await asyncio.wait_for(sub_s.subscribe(name.namespace, name.name), TIMEOUT)
        for g in range(3):
            await track.group(g, group_payloads(g, 4))
        await track.end()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        assert got.objects == track.sent and not got.duplicates
        # FETCH on either worker, and the Track committed to the shared LMDB once
        for s in (sub_s, pub):
            _, fetched = await fetch_objects(s, name)
            assert fetched == track.sent
        async with asyncio.timeout(TIMEOUT):
            while await metric(mport, "kvcs_relay_lmdb_committed_tracks_total") < 1:
                await asyncio.sleep(0.05)
        assert await metric(mport, "kvcs_relay_lmdb_committed_tracks_total") == 1
        assert await metric(mport, "kvcs_relay_workers_up") == 2
        await pub.aclose()

        # SIGKILL worker 0: it comes back; worker 1's session is untouched
        old = info(ready)["workers"][0]["pid"]
        os.kill(old, signal.SIGKILL)
        async with asyncio.timeout(30):
            while not ((w := info(ready)["workers"][0])["alive"] and w["pid"] != old
                       and w["metrics_port"]):
                await asyncio.sleep(0.05)
        assert not sub_s.closed
        _, fetched = await fetch_objects(sub_s, name)
        assert fetched == track.sent
        again = await connect_on(ready, data, 0, keep)
        _, fetched = await fetch_objects(again, name)  # the new worker 0, from LMDB
        assert fetched == track.sent
        assert (await http_get(mport, "/healthz"))[0] == 200
        for s in (again, sub_s, *keep):
            await s.aclose()
        keep.clear()

        sup.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(sup.wait(), 30) == 0

    # after a restart, each worker serves the committed Track from LMDB
    async with workers(data, ready):
        on: list[MoqtSession] = []
        for want in (0, 1):
            s = await connect_on(ready, data, want, keep)
            on.append(s)
            resp, fetched = await fetch_objects(s, name)
            assert fetched == track.sent and resp.end_location == Location(3, 0)  # End of Track
        # one admin surface: the supervisor's answers for both workers, and purges both
        mport = info(ready)["metrics_port"]
        assert (await http(mport, "GET", "/admin/state", "wrong-token-0123456789"))[0] == 401
        code, text = await http(mport, "GET", "/admin/state")
        state = json.loads(text)
        assert code == 200 and state["workers"] == 2
        assert state["sessions"]["total"] == len(keep) + 2
        [entry] = [t for t in state["tracks"] if t["name"] == "k.raw.s0"]
        assert entry["workers"] == 2 and entry["complete"] and "lmdb" in entry["tiers"]
        code, doc = await purge(mport, format_namespace(name.namespace))
        assert code == 200 and [r["name"] for r in doc["removed"]] == ["k.raw.s0"]
        for s in on:
            with pytest.raises(RequestRejected) as e:
                await fetch_objects(s, name)
            assert e.value.code == RequestErrorCode.DOES_NOT_EXIST
        for s in keep:
            await s.aclose()
