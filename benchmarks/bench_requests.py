"""Requests per second on one session, each QUIC backend as the relay's and as the client's:
many small requests (a consumer's discovery and per-layer FETCHes, an LMCache-style
``exists``) are a cost of their own, apart from bytes.

* ``FETCH``: sequential FETCHes of a one-Object Track the relay holds (request stream opened,
  FETCH_OK, one Object, FIN both ways).
* ``TRACK_STATUS``: sequential TRACK_STATUS of the same Track.
* baseline, same run and same backend pair: a request/response on a new bidirectional QUIC
  stream with no MOQT (``relay.transport`` alone: open, write 16 bytes with FIN, read the
  echo to its FIN), i.e. what the QUIC library and our transport seam cost per request.

The relay runs as its own process (``kvcs relay --quic-backend``); the client in this one.
``MOQT/raw`` tells how much of a request's time is ours above QUIC.
Run: ``python -m benchmarks requests`` (BENCH_REQUESTS_SECONDS, default 5 per cell).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._report import report
from benchmarks.bench_relay import _RelayProcess
from benchmarks.bench_transport import _CERTS
from relay.moqt.codes import ObjectStatus
from relay.moqt.primitives import FullTrackName
from relay.session import open_session
from relay.session.wire import MOQT
from relay.transport import Connection, QuicSettings, connect, ensure_self_signed, serve

BACKENDS = ("aioquic", "qh3")


async def _echo(conn: Connection) -> None:
    async def one(incoming: Any) -> None:
        data = b""
        while chunk := await incoming.recv.read():
            data += chunk
        await incoming.send.write(data, end_stream=True)

    tasks = set()
    async for incoming in conn:
        t = asyncio.ensure_future(one(incoming))
        tasks.add(t)
        t.add_done_callback(tasks.discard)


async def raw_rate(server: str, client: str, seconds: float) -> float:
    certs = ensure_self_signed(_CERTS)
    srv = await serve("127.0.0.1", 0, certs.certfile, certs.keyfile, _echo,
                      settings=QuicSettings(backend=server), application=MOQT)
    try:
        conn = await connect(f"moqt://127.0.0.1:{srv.port}/", ca_file=certs.certfile,
                             settings=QuicSettings(backend=client), application=MOQT)
        n, end = 0, time.perf_counter() + seconds
        t0 = time.perf_counter()
        while time.perf_counter() < end:
            send, recv = await conn.open_bi()
            await send.write(b"0123456789abcdef", end_stream=True)
            while await recv.read():
                pass
            n += 1
        rate = n / (time.perf_counter() - t0)
        conn.close()
    finally:
        await srv.close()
    return rate


async def moqt_rates(tmp: Path, server: str, client: str, seconds: float
                     ) -> tuple[float, float]:
    name = FullTrackName((b"kvcs-1", os.urandom(32), b"bench-requests"), b"manifest")
    async with _RelayProcess(tmp, 1200, server) as r:
        settings = QuicSettings(backend=client)
        pub = await open_session(r.url, ca_file=r.certfile, settings=settings)
        await pub.publish_namespace(name.namespace)
        served = await pub.publish(name.namespace, name.name)
        w = await served.open_subgroup(0, 0, 0)
        await w.write_object(0, os.urandom(1000))
        await w.write_status(1, ObjectStatus.END_OF_GROUP, fin=True)
        w = await served.open_subgroup(1, 0, 0)
        await w.write_status(0, ObjectStatus.END_OF_TRACK, fin=True)
        await served.done()
        c = await open_session(r.url, ca_file=r.certfile, settings=settings)
        for _ in range(200):  # until the relay holds it all
            resp = await c.fetch(name.namespace, name.name)
            if len(await resp.collect()) >= 1 and resp.end_of_track:
                break
        rates = []
        for kind in ("fetch", "status"):
            n, end = 0, time.perf_counter() + seconds
            t0 = time.perf_counter()
            while time.perf_counter() < end:
                if kind == "fetch":
                    resp = await c.fetch(name.namespace, name.name)
                    await resp.collect()
                else:
                    await c.track_status(name.namespace, name.name)
                n += 1
            rates.append(n / (time.perf_counter() - t0))
        await c.aclose()
        await pub.aclose()
    return rates[0], rates[1]


async def _run(seconds: float) -> list[list[Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for server in BACKENDS:
            for client in BACKENDS:
                raw = await raw_rate(server, client, seconds)
                fetch, status = await moqt_rates(Path(d) / f"{server}-{client}", server,
                                                 client, seconds)
                rows.append([server, client, round(raw), round(fetch), round(status),
                             round(fetch / raw, 2), round(status / raw, 2)])
    return rows


def main() -> None:
    seconds = float(os.environ.get("BENCH_REQUESTS_SECONDS", "5"))
    rows = asyncio.run(_run(seconds))
    report("requests", ["relay", "client", "raw_req/s", "FETCH/s", "TRACK_STATUS/s",
                        "FETCH/raw", "TRACK_STATUS/raw"], rows,
           extra={"seconds_per_cell": seconds,
                  "note": "one session, sequential requests; raw: a request/response on a "
                          "new QUIC stream through relay.transport with no MOQT, in-process "
                          "server (the MOQT rows go through a relay process)"})


if __name__ == "__main__":
    main()
