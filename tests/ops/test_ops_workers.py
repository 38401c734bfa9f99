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
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from admin_helpers import TOKEN, abusive_requests, http, purge, raw_http
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

from relay.moqt.codes import ObjectStatus, RequestErrorCode
from relay.moqt.location_filter import LocationFilter
from relay.moqt.namespace_text import format_namespace
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.session import MoqtSession, NamespaceEvent, RequestRejected, open_session

KVCS = [sys.executable, "-m", "relay.cli"]


@asynccontextmanager
async def workers(data: Path, ready: Path, metrics_listen: str = "127.0.0.1:0"
                  ) -> AsyncIterator[asyncio.subprocess.Process]:
    ready.unlink(missing_ok=True)
    token_file = data.parent / "admin.token"
    token_file.write_text(TOKEN)
    log = (data.parent / "relay.log").open("ab")  # the supervisor's and workers' lines
    proc = await asyncio.create_subprocess_exec(
        *KVCS, "relay", "--workers", "2", "--listen", "127.0.0.1:0", "--data-dir", str(data),
        "--metrics-listen", metrics_listen, "--ready-file", str(ready),
        "--admin-token-file", str(token_file),
        stdout=asyncio.subprocess.DEVNULL, stderr=log)
    log.close()
    pids: set[int] = set()
    try:
        async with asyncio.timeout(60):
            while not ready.exists():
                assert proc.returncode is None, "the supervisor exited before it was ready"
                await asyncio.sleep(0.05)
        pids.update(worker_pids(ready))
        yield proc
    finally:
        if ready.exists():
            pids.update(worker_pids(ready))  # also the workers started again by the test
        # stopped as an operator would (SIGTERM: the workers drain and exit), so a test
        # never leaves a worker running; SIGKILL only if that does not finish in time
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        left = await wait_gone(pids, 30)
        assert not left, f"workers {left} outlived their supervisor"


def info(ready: Path) -> dict[str, Any]:
    return json.loads(ready.read_text())  # type: ignore[no-any-return]


def worker_pids(ready: Path) -> set[int]:
    return {int(w["pid"]) for w in info(ready)["workers"] if w["pid"]}


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie waits for whoever adopted
    it to reap it: it serves nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """The ``pids`` still running after at most ``timeout`` seconds (polled)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (left := {p for p in pids if running(p)}) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    return left


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
        # the supervisor says what a single relay says
        assert await http_get(mport, "/healthz") == (200, "ok\n")
        assert await http_get(mport, "/readyz") == (200, "ready\n")
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


async def test_workers_end_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    """A supervisor SIGKILLed (no signal passed on) takes its workers with it: none of them
    serves on, orphaned, with nobody to restart, aggregate or stop it."""
    data, ready = tmp_path / "data", tmp_path / "ready.json"
    async with workers(data, ready) as sup:
        pids = worker_pids(ready)
        assert len(pids) == 2 and all(running(p) for p in pids)
        # the supervisor's run directory (in each worker's --ready-file), which a killed
        # supervisor cannot remove: the test does, once the workers are gone
        args = Path(f"/proc/{min(pids)}/cmdline").read_bytes().split(b"\0")
        run_dir = Path(os.fsdecode(args[args.index(b"--ready-file") + 1])).parent
        sup.kill()
        await asyncio.wait_for(sup.wait(), TIMEOUT)
        assert await wait_gone(pids, 30) == set()
    shutil.rmtree(run_dir, ignore_errors=True)


# A worker where PR_SET_PDEATHSIG is not available (the prctl is made to fail: failure
# injection), left only with the pipe from its supervisor; the test process plays the
# supervisor and holds the pipe's write end.
_PIPE_ONLY_WORKER = """
import os, signal, sys
import relay.workers as w
w._arm_parent_death_signal = lambda sig: False
assert w.follow_supervisor(os.getppid(), int(sys.argv[1]))
print("following", flush=True)
signal.pause()
"""


async def test_without_pdeathsig_the_pipe_ends_the_worker() -> None:
    read_end, write_end = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _PIPE_ONLY_WORKER, str(read_end), pass_fds=(read_end,),
            stdout=asyncio.subprocess.PIPE)
    finally:
        os.close(read_end)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)
        assert line == b"following\n"
        os.close(write_end)  # what the kernel does when the supervisor dies
        write_end = -1
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == -signal.SIGTERM
    finally:
        if write_end >= 0:
            os.close(write_end)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _hang_up_at_once(port: int, request: bytes) -> None:
    """A client that sends ``request`` and closes before the answer: the answer then meets a
    closed socket, whose reset the listener must take quietly."""
    _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT)
    writer.write(request)
    await asyncio.wait_for(writer.drain(), TIMEOUT)
    writer.close()


async def test_supervisor_answers_abusive_admin_requests_cleanly(tmp_path: Path) -> None:
    """The supervisor's listener, like a single relay's (test_ops_admin.py): each request
    is answered (400, 401, 431), none leaves a traceback in the supervisor's or a worker's
    log, and the refusals without the token are counted in the one /metrics. Nor do a
    client that hangs up before its answer, or clients still connected at SIGTERM (to the
    supervisor's listener and to a worker's), half-way through their request."""
    data, ready = tmp_path / "data", tmp_path / "ready.json"
    held: list[asyncio.StreamWriter] = []
    async with workers(data, ready):
        mport = info(ready)["metrics_port"]
        await _hang_up_at_once(mport, b"GET /metrics HTTP/1.1\r\n\r\n")
        for port in (mport, info(ready)["workers"][0]["metrics_port"]):
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port),
                                               TIMEOUT)
            writer.write(b"GET /metr")
            await asyncio.wait_for(writer.drain(), TIMEOUT)
            held.append(writer)
        for what, request, status in abusive_requests():
            code, body = await raw_http(mport, request)
            assert code == status, what
            assert len(body.strip().splitlines()) == 1, (what, body)
        assert await metric(mport, "kvcs_relay_admin_unauthorized_total") == 2
        assert (await http(mport, "GET", "/admin/state"))[0] == 200  # still serving
        # the purge's second round, sent by a client: answered like any admin request
        code, text = await http(mport, "POST", "/admin/purge-sibling-routes",
                                body=json.dumps({"namespaces": ["kvcs-1/hex:00ff"]}).encode())
        assert (code, json.loads(text)) == (200, {"routes_removed": 0, "namespaces_done": []})
    for writer in held:  # through the SIGTERM that ended the workers and the supervisor
        writer.close()
    log = (tmp_path / "relay.log").read_text()  # the processes have all exited: it is whole
    assert "relay stopped (2 workers)" in log
    assert "Traceback" not in log and " ERROR " not in log, log


async def until_namespace(events: AsyncIterator[object], namespace: tuple[bytes, ...],
                          active: bool) -> None:
    async with asyncio.timeout(TIMEOUT):
        async for ev in events:
            if isinstance(ev, NamespaceEvent) and ev.namespace == namespace \
                    and ev.active == active:
                return
    raise AssertionError(f"the namespace subscription ended before {active=}")


async def test_a_purge_answered_by_the_supervisor_is_done_on_every_worker(
        tmp_path: Path) -> None:
    """Worker 0 knows a namespace only through its sibling link to worker 1, whose
    publisher holds the Track. Once the purge is answered, a FETCH on worker 0 gets
    DOES_NOT_EXIST (not INVALID_RANGE: "it exists on a sibling"), the one /admin/state
    lists the namespace nowhere, and worker 0's discoverers get NAMESPACE_DONE."""
    data, ready = tmp_path / "data", tmp_path / "ready.json"
    name = FullTrackName(make_ns(), b"k.raw.s0")
    keep: list[MoqtSession] = []
    async with workers(data, ready):
        mport = info(ready)["metrics_port"]
        watcher = await connect_on(ready, data, 0, keep)
        events = aiter(await asyncio.wait_for(watcher.subscribe_namespace(name.namespace[:1]),
                                              TIMEOUT))
        pub = await connect_on(ready, data, 1, keep)
        track = await push_track(pub, name, layers=3)
        await track.group(0, group_payloads(0, 2))
        await until_namespace(events, name.namespace, True)  # through worker 0's sibling link

        code, doc = await purge(mport, format_namespace(name.namespace))
        assert code == 200 and [r["name"] for r in doc["removed"]] == ["k.raw.s0"]
        with pytest.raises(RequestRejected) as e:
            await fetch_objects(watcher, name)
        assert e.value.code == RequestErrorCode.DOES_NOT_EXIST
        code, text = await http(mport, "GET", "/admin/state")
        assert code == 200
        assert format_namespace(name.namespace) not in json.loads(text)["namespaces"]
        await until_namespace(events, name.namespace, False)
        for s in (watcher, pub, *keep):
            await s.aclose()


async def test_a_worker_whose_supervisor_is_already_gone_exits_at_once(tmp_path: Path) -> None:
    """A worker started by a supervisor that died before the worker could ask for the
    parent-death signal would never get one: it sees its parent is not the supervisor that
    started it and exits (1, one line) instead of serving."""
    env = {**os.environ, "KVCS_WORKER_DIR": str(tmp_path), "KVCS_WORKER_INDEX": "0",
           "KVCS_WORKER_SECRET": "x" * 48, "KVCS_WORKER_SUPERVISOR": str(os.getpid() + 1)}
    proc = await asyncio.create_subprocess_exec(
        *KVCS, "relay", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data"),
        "--metrics-listen", "off", env=env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 1 and err.decode() == "error: the supervisor is gone\n", err


async def test_a_sibling_worker_serves_every_group_of_a_live_track_fetched_alone(
        tmp_path: Path) -> None:
    """Issue 26 item 2: a publisher on one worker writes 12 Groups (no End of Track); a
    session on the other worker FETCHes each Group alone. A FETCH of Group 0 taught that
    worker a Largest Object that is only a lower bound; the next Groups are asked of the
    sibling, not refused as "past the Largest Object"."""
    data, ready = tmp_path / "data", tmp_path / "ready.json"
    name = FullTrackName(make_ns(), b"k.raw.s0")
    keep: list[MoqtSession] = []
    async with workers(data, ready):
        pub = await connect_on(ready, data, 0, keep)
        other = await connect_on(ready, data, 1, keep)
        track = await push_track(pub, name, layers=12)
        for g in range(12):
            await track.group(g, group_payloads(g, 3))
        # the publisher's worker holds all 12 Groups (its own FETCH sees them)
        async with asyncio.timeout(TIMEOUT):
            while True:
                try:
                    _resp, held = await fetch_objects(pub, name)
                except RequestRejected:
                    continue  # nothing arrived yet: INVALID_RANGE
                if all(loc in held for loc in track.sent):
                    break
        await wait_namespace(other, name.namespace)
        for g in range(12):
            resp = await asyncio.wait_for(other.fetch(
                name.namespace, name.name,
                Params(location_filter=LocationFilter.absolute_group_end(g, 0, g))), TIMEOUT)
            async with asyncio.timeout(TIMEOUT):
                got = {e.location: bytes(e.payload) for e in await resp.collect()
                       if e.status == ObjectStatus.NORMAL}
            assert got == {loc: p for loc, p in track.sent.items() if loc.group == g}, g
        for s in (pub, other, *keep):
            await s.aclose()
