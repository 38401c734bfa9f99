"""Overload: does a relay hold its ceiling when offered more than it can forward?

aiomoqt's publisher bench -> relay -> aiomoqt's subscriber bench (32 KiB Objects, one
subgroup stream, raw QUIC, loopback, ``--no-stats``: counters only), at offered rates of
500/s, 2,000/s and the publisher's maximum (``-r 0``), through our relay on aioquic and on
qh3 (``kvcs relay``, its own process), on aioquic also with ``--ingest-hold-bytes 0`` (its
ingest never waits for its subscribers: the relay before issue 37's fix), and through
aiomoqt's own relay
(``python -m aiomoqt.tools.moq_interop_relay --quic``: Python on aiopquic, a C QUIC core with
its own network thread), the baseline. Every case gets a fresh relay and a Track of its
own; the relays take turns at each rate so load from other processes hits them alike.

Columns: Objects/s the subscriber received (sub_bench's own rate over its active time),
the publisher's own sent rate, the relay process's CPU over the subscription, the ratio to
aiomoqt's relay at the same rate, and to the relay's own ceiling: the least of the offered
rate and the same relay's best rate in this run (the goal, issue 37: never below 0.9 as the
offered rate rises). Run: ``python -m benchmarks overload``
(env: BENCH_OVERLOAD_SECONDS=10, BENCH_OVERLOAD_RATES=500,2000,0 (0: max),
BENCH_OVERLOAD_RELAYS=aiomoqt,aioquic,aioquic:0,qh3: ours as ``backend[:ingest_hold_bytes]``,
``aioquic:0`` being our relay with its ingest never waiting, as before issue 37).
Needs aiomoqt (the interop extra, ``scripts/install_interop.sh``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from benchmarks._proc import cpu_seconds
from benchmarks._report import report
from benchmarks.bench_relay import _RelayProcess
from relay.transport import ensure_self_signed

OBJECT = 32 * 1024
# ours as "backend[:ingest_hold_bytes]": "aioquic:0" is the relay with ingest never waiting,
# as it was before issue 37, measured in the same run
RELAYS = ("aiomoqt", "aioquic", "aioquic:0", "qh3")
BASELINE = "aiomoqt"
_RATE = re.compile(r"ObjRate:\s+([\d,.]+) obj/s")
_SENT = re.compile(r"Sent:\s+[\d,]+ objects, \d+ groups, ([\d,.]+)/s")


def _tool(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"aiomoqt.tools.{module}", *args]


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def _relay(kind: str, tmp: Path) -> AsyncIterator[tuple[str, int]]:
    """(moqt:// URL, pid) of a fresh relay of ``kind``: aiomoqt's, or ours on a backend."""
    if kind != BASELINE:
        backend, _, hold = kind.partition(":")
        extra = ("--ingest-hold-bytes", hold) if hold else ()
        async with _RelayProcess(tmp, "auto", backend, extra) as r:
            assert r.proc is not None
            yield r.url.rstrip("/"), r.proc.pid
        return
    paths = ensure_self_signed(tmp / "tls")
    port = _free_udp_port()
    proc = await asyncio.create_subprocess_exec(
        *_tool("moq_interop_relay", "--bind", "127.0.0.1", "--port", str(port), "--cert",
               str(paths.certfile), "--key", str(paths.keyfile), "--quic", "--draft", "22"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    drain: asyncio.Future[bytes] | None = None
    try:
        async with asyncio.timeout(30):
            while b"Listening on" not in (line := await proc.stdout.readline()):
                if not line:
                    raise RuntimeError("aiomoqt's relay exited before it listened")
        drain = asyncio.ensure_future(proc.stdout.read())  # never block on a full pipe
        yield f"moqt://127.0.0.1:{port}", proc.pid
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)
        if drain is not None:
            drain.cancel()


async def one_case(kind: str, rate: int, seconds: int, track: str, tmp: Path
                   ) -> dict[str, Any]:
    """One publisher and one subscriber through a fresh relay: what each reported, and the
    relay's CPU while the subscriber ran."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    async with _relay(kind, tmp) as (url, pid):
        pub = await asyncio.create_subprocess_exec(
            *_tool("pub_bench", url, "-k", "--draft", "22", "-s", str(OBJECT), "-r", str(rate),
                   "-N", "bench", "-T", track, "-t", str(seconds + 30), "--no-stats"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
        assert pub.stdout is not None
        pub_out: list[bytes] = []
        try:
            async with asyncio.timeout(30):
                while b"Published" not in (line := await pub.stdout.readline()):
                    if not line:
                        raise RuntimeError(f"pub_bench ended before publishing ({kind})")
                    pub_out.append(line)
            reader = asyncio.ensure_future(pub.stdout.read())
            cpu0 = cpu_seconds(pid)
            t0 = time.monotonic()
            sub = await asyncio.create_subprocess_exec(
                *_tool("sub_bench", url, "-k", "--draft", "22", "-N", "bench", "-T", track,
                       "-t", str(seconds), "--no-stats"),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
            try:
                out, _ = await asyncio.wait_for(sub.communicate(), seconds + 60)
            finally:
                if sub.returncode is None:
                    sub.kill()
                    await sub.wait()
            cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
        finally:
            if pub.returncode is None:
                pub.send_signal(2)  # SIGINT: it prints its totals
                try:
                    await asyncio.wait_for(pub.wait(), 10)
                except TimeoutError:
                    pub.kill()
                    await pub.wait()
        pub_text = (b"".join(pub_out) + await reader).decode(errors="replace")
    text = out.decode(errors="replace")
    got = _RATE.search(text)
    sent = _SENT.search(pub_text)
    return {"delivered": float(got.group(1).replace(",", "")) if got else 0.0,
            "sent": float(sent.group(1).replace(",", "")) if sent else None,
            "relay_cpu": cpu,
            "note": "" if got else "sub_bench reported no rate: " + text[-300:]}


async def _run(relays: list[str], rates: list[int], seconds: int) -> list[list[Any]]:
    results: dict[tuple[str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as d:
        n = 0
        for rate in rates:
            for kind in relays:
                n += 1
                results[kind, rate] = await one_case(kind, rate, seconds, f"t{n}",
                                                     Path(d) / f"case{n}")
                r = results[kind, rate]
                print(f"  {kind:10} offered {rate or 'max':>5}: {r['delivered']:,.0f} Objects/s",
                      flush=True)
    rows = []
    for kind in relays:
        best = max(results[kind, r]["delivered"] for r in rates) or 1.0
        for rate in rates:
            r = results[kind, rate]
            base = results.get((BASELINE, rate))
            vs_base = round(r["delivered"] / base["delivered"], 2) \
                if base and base["delivered"] and kind != BASELINE else ""
            ceiling = min(best, rate) if rate else best  # what it could deliver at this rate
            rows.append([kind, rate or "max", round(r["delivered"]),
                         round(r["sent"]) if r["sent"] is not None else "",
                         f"{100 * r['relay_cpu']:.0f}%", vs_base,
                         round(r["delivered"] / ceiling, 2), r["note"]])
    return rows


def main() -> None:
    if importlib.util.find_spec("aiomoqt") is None:
        print("(overload: aiomoqt is not installed; scripts/install_interop.sh installs it)")
        return
    seconds = int(os.environ.get("BENCH_OVERLOAD_SECONDS", "10"))
    rates = [int(x) for x in os.environ.get("BENCH_OVERLOAD_RATES", "500,2000,0").split(",")]
    relays = os.environ.get("BENCH_OVERLOAD_RELAYS", ",".join(RELAYS)).split(",")
    rows = asyncio.run(_run(relays, rates, seconds))
    report("overload", ["relay", "offered_obj/s", "delivered_obj/s", "publisher_sent_obj/s",
                        "relay_cpu", "vs_aiomoqt_relay", "vs_own_ceiling", "note"], rows,
           extra={"seconds": seconds, "object_bytes": OBJECT,
                  "note": "aiomoqt pub_bench -> relay -> aiomoqt sub_bench, one subgroup "
                          "stream, raw QUIC, loopback, --no-stats; delivered: sub_bench's "
                          "ObjRate (Objects over its active time); publisher_sent: "
                          "pub_bench's own rate over its whole run; relay_cpu: the relay "
                          "process's utime + stime over the subscription, per wall second; "
                          "vs_own_ceiling: delivered / the least of the offered rate and the "
                          "same relay's best delivered rate in this run"})


if __name__ == "__main__":
    main()
