"""MOQT session throughput, publisher → subscriber with no relay, vs raw aioquic in the same run.

A server-side publisher answers one SUBSCRIBE by writing N Objects of 32 KiB (256 per Group,
one subgroup stream per Group); the client subscriber consumes every Object. Timed from
SUBSCRIBE_OK to the last Object; the baseline is one raw aioquic stream carrying the same
number of bytes (``bench_transport.raw_aioquic_throughput``'s setup), at the same datagram
size. Both ends run in this process, so CPU ratios are reported beside wall-clock ones.
Also: codec encode+decode Objects/s for 32 KiB Objects vs the session's Object rate.
Run: ``python -m benchmarks session`` (env BENCH_SESSION_MB=32, BENCH_SESSION_REPEATS=3).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from benchmarks._report import report
from benchmarks.bench_transport import _CERTS, _raw
from relay.moqt.codes import ObjectStatus
from relay.moqt.dataplane.objects import SubgroupHeader
from relay.moqt.dataplane.subgroup import SubgroupStreamEncoder, SubgroupStreamParser
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.session import (
    IncomingSubscribe,
    MoqtSession,
    ReceivedObject,
    SessionConfig,
    SessionHandler,
    open_session,
)
from relay.session.wire import MOQT
from relay.transport import QuicSettings, ensure_self_signed, serve

MiB = 1024 * 1024
OBJECT = 32 * 1024
PER_GROUP = 256
NS = (b"kvcs-1", b"bench")


class _Publisher(SessionHandler):
    def __init__(self, objects: int) -> None:
        self.objects = objects
        self.payload = os.urandom(OBJECT)

    async def subscribe(self, req: IncomingSubscribe) -> None:
        served = await req.accept(None)
        n, g = self.objects, 0
        while n > 0:
            count = min(n, PER_GROUP)
            w = await served.open_subgroup(g, 0, 0)
            for i in range(count):
                await w.write_object(i, self.payload)
            await w.write_status(count, ObjectStatus.END_OF_GROUP, fin=True)
            n -= count
            g += 1
        await served.done()


async def _session(nbytes: int, size: int, backend: str = "aioquic"
                   ) -> tuple[float, float, float]:
    """(wall MB/s, CPU MB/s, Objects/s) of one subscription carrying ``nbytes``, both ends
    on ``backend``."""
    certs = ensure_self_signed(_CERTS)
    objects = nbytes // OBJECT
    settings = QuicSettings(max_datagram_size=size, backend=backend)
    publisher = _Publisher(objects)
    sessions: list[MoqtSession] = []

    async def on_conn(conn: Any) -> None:
        s = await MoqtSession.start(conn, SessionConfig(), publisher)
        sessions.append(s)
        await s.wait_closed()

    server = await serve("127.0.0.1", 0, certs.certfile, certs.keyfile, on_conn,
                         settings=settings, application=MOQT)
    try:
        client = await open_session(f"moqt://127.0.0.1:{server.port}/", settings=settings,
                                    ca_file=certs.certfile)
        t0, c0 = time.perf_counter(), time.process_time()
        sub = await client.subscribe(NS, b"k.raw.s0",
                                     Params(location_filter=LocationFilter.next_object()))
        got = 0
        async for ev in sub:
            if isinstance(ev, ReceivedObject) and ev.status == ObjectStatus.NORMAL:
                got += 1
                if got == objects:
                    break
        t1, c1 = time.perf_counter(), time.process_time()
        await client.aclose()
    finally:
        await server.close()
    return nbytes / (t1 - t0) / 1e6, nbytes / (c1 - c0) / 1e6, objects / (t1 - t0)


def codec_rate(n: int = 4096) -> float:
    """Encode + decode Objects/s for 32 KiB Objects (one subgroup stream, 16 KiB chunks)."""
    payload = os.urandom(OBJECT)
    t0 = time.perf_counter()
    enc = SubgroupStreamEncoder(SubgroupHeader(1, 0, 0, 0, first_object=True))
    parts = [enc.header_bytes()]
    for i in range(n):
        parts.append(enc.object_header(i, OBJECT))
        parts.append(payload)
    stream = b"".join(parts)
    parser = SubgroupStreamParser()
    view = memoryview(stream)
    count = 0
    for off in range(0, len(stream), 16384):
        count += len(parser.feed(view[off:off + 16384]))
    dt = time.perf_counter() - t0
    assert count == n + 1
    return n / dt


async def _run(nbytes: int, sizes: list[int], repeats: int) -> list[list[Any]]:
    rows = []
    for size in sizes:
        best = {k: (0.0, 0.0) for k in ("raw", "aioquic", "qh3")}
        rate = 0.0
        for _ in range(repeats):
            w, c = await _raw(nbytes, size)
            best["raw"] = (max(best["raw"][0], w), max(best["raw"][1], c))
            for backend in ("aioquic", "qh3"):
                w, c, r = await _session(nbytes, size, backend)
                best[backend] = (max(best[backend][0], w), max(best[backend][1], c))
                rate = max(rate, r)
        raw_w, _ = best["raw"]
        (a_w, a_c), (q_w, q_c) = best["aioquic"], best["qh3"]
        codec = codec_rate()
        rows.append([size, nbytes // MiB, round(raw_w, 1), round(a_w, 1), round(q_w, 1),
                     round(a_w / raw_w, 3), round(q_w / a_w, 2), round(q_c / a_c, 2),
                     round(rate), round(codec), round(codec / rate, 1)])
    return rows


def main() -> None:
    nbytes = int(os.environ.get("BENCH_SESSION_MB", "32")) * MiB
    repeats = int(os.environ.get("BENCH_SESSION_REPEATS", "3"))
    sizes = [int(x) for x in os.environ.get("BENCH_SESSION_SIZES", "1200,8952").split(",")]
    rows = asyncio.run(_run(nbytes, sizes, repeats))
    report("session", ["max_datagram_size", "MiB", "raw_aioquic_MB/s", "aioquic_MB/s",
                       "qh3_MB/s", "aioquic/raw", "qh3/aioquic", "qh3/aioquic_cpu",
                       "best_objects/s", "codec_objects/s", "codec_x_session"], rows,
           extra={"note": f"best of {repeats} interleaved runs, loopback, 32 KiB Objects, "
                          "publisher and subscriber MOQT sessions in one process on the "
                          "named backend; codec_x_session against the faster backend"})


if __name__ == "__main__":
    main()
