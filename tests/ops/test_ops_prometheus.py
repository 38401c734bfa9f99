"""/metrics judged by Prometheus itself: `promtool check metrics` accepts a single relay's
exposition and a supervisor's (`--workers`, every worker's merged), and a real Prometheus
server scraping a relay with workers finds the target up and reads its samples.

Both tools are Debian's `prometheus` package, installed by `make` (the Makefile's
`prometheus` target). Where they are missing and cannot be installed (no apt-get, or not
root) the tests are skipped; where they could have been, a missing tool fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from admin_helpers import http
from ops_http import http_get
from processes import ready_process
from relay_helpers import TIMEOUT, client, make_ns, push_track
from test_ops_metrics import _relay
from test_ops_workers import info, workers

from relay.moqt.primitives import FullTrackName

# Prometheus applies a new target set at most every 5 s (its discovery manager's fixed
# update interval), so the first scrape comes 5-6 s after it starts: the relay starts
# meanwhile, and the wait for "up" is bounded well past that.
UP_TIMEOUT = 30.0


def prometheus_tool(name: str) -> str:
    path = shutil.which(name)
    if path is not None:
        return path
    if shutil.which("apt-get") is not None and os.geteuid() == 0:
        pytest.fail(f"{name} not found; `make prometheus` installs it (Debian's prometheus "
                    "package)")
    pytest.skip(f"{name} not found, and this machine cannot install Debian's prometheus "
                "package (no apt-get, or not root)")


async def promtool_check(text: str) -> None:
    """`promtool check metrics` accepts ``text``: no parse error, no lint problem."""
    proc = await asyncio.create_subprocess_exec(
        prometheus_tool("promtool"), "check", "metrics", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(text.encode()), TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0 and not out.strip(), out.decode()


async def metrics_text(port: int) -> str:
    code, body = await http_get(port, "/metrics")
    assert code == 200
    return body


async def test_promtool_accepts_a_single_relays_metrics(tmp_path: Path) -> None:
    r = await _relay(tmp_path)
    try:
        pub = await client(r)
        await push_track(pub, FullTrackName(make_ns(), b"k.raw.s0"), layers=2)
        await pub.aclose()  # a closed session: a labelled sample of sessions_closed
        assert r.metrics_port is not None
        await promtool_check(await metrics_text(r.metrics_port))
    finally:
        await r.close()


@contextlib.contextmanager
def reserved_port() -> Any:
    """A free loopback TCP port, kept bound (not listening) until the block ends: the
    kernel hands it to nobody else meanwhile, and the relay, which sets SO_REUSEADDR as
    asyncio does, can still bind and listen on it (Linux allows that while this socket
    never listens)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
    finally:
        s.close()


@contextlib.asynccontextmanager
async def prometheus(tmp: Path, target: str) -> AsyncIterator[int]:
    """A Prometheus server on a loopback port of the kernel's choosing (read from its log),
    scraping ``target`` every second; yields its port. Stopped, its storage removed, when
    the block ends."""
    tmp.mkdir()
    cfg = tmp / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                   "scrape_configs:\n  - job_name: kvcs\n    static_configs:\n"
                   f"      - targets: ['{target}']\n")
    argv = [prometheus_tool("prometheus"), f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp / 'data'}", "--web.listen-address=127.0.0.1:0"]
    try:
        async with ready_process(argv, rb'msg="Listening on" address=127\.0\.0\.1:(\d+)',
                                 TIMEOUT, "prometheus") as m:
            yield int(m.group(1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def api(port: int, path: str) -> Any:
    """A Prometheus HTTP API answer's ``data`` (HTTP/1.0: one plain body, then close)."""
    async with asyncio.timeout(TIMEOUT):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        raw = await reader.read()
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0], raw[:500]
    return json.loads(body)["data"]


async def wait_target_up(port: int) -> None:
    async with asyncio.timeout(UP_TIMEOUT):
        while True:
            targets = (await api(port, "/api/v1/targets"))["activeTargets"]
            health = [(t["health"], t["lastError"]) for t in targets]
            if health and health[0][0] == "up":
                return
            if health and "connection refused" not in health[0][1]:
                # scraped, and refused by Prometheus: what it said is the failure
                assert health[0][0] != "down", health
            await asyncio.sleep(0.02)  # poll step: the API has no event to wait for


async def query(port: int, promql: str) -> list[tuple[dict[str, str], str]]:
    """The instant query's samples, once it has any: a target reads "up" before the samples
    of that scrape are queryable (an empty answer was seen right after it), and the API has
    no event for it."""
    async with asyncio.timeout(UP_TIMEOUT):
        while not (data := await api(port, "/api/v1/query?query=" + quote(promql)))["result"]:
            await asyncio.sleep(0.02)  # poll step
    return [(r["metric"], r["value"][1]) for r in data["result"]]


async def test_prometheus_scrapes_a_relay_with_workers(tmp_path: Path) -> None:
    """Prometheus (and promtool before it) accepts the supervisor's merged /metrics: one
    family per name, the supervisor's own admin refusals summed into the workers'."""
    data, ready = tmp_path / "data", tmp_path / "ready.json"
    with reserved_port() as mport:
        # Prometheus first: its first scrape waits 5 s whatever we do, the relay starts then
        async with prometheus(tmp_path / "prometheus", f"127.0.0.1:{mport}") as pport, \
                workers(data, ready, metrics_listen=f"127.0.0.1:{mport}"):
            assert info(ready)["metrics_port"] == mport
            # refused by the supervisor itself (no token): its own count, in the workers'
            # family of the same name
            assert (await http(mport, "GET", "/admin/state", token=None))[0] == 401
            await promtool_check(await metrics_text(mport))
            await promtool_check(await metrics_text(info(ready)["workers"][0]["metrics_port"]))
            await wait_target_up(pport)
            assert await query(pport, "kvcs_relay_workers_up") == \
                [({"__name__": "kvcs_relay_workers_up", "instance": f"127.0.0.1:{mport}",
                   "job": "kvcs"}, "2")]
            [(_, refused)] = await query(pport, "kvcs_relay_admin_unauthorized_total")
            assert refused == "1"
