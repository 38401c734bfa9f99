"""One benchmark subscriber in its own process (``python -m benchmarks._subscriber``).

It subscribes (Next Object) to one Track through a relay, prints ``ready``, then receives
``total`` Objects and prints one JSON line: when the last arrived (``time.time()``), the
median latency from the send time the publisher wrote into each payload's first 8 bytes
(``<d``, ``time.time()``: one machine, one wall clock), the bytes received, its CPU seconds
until then, and how long closing the session took afterwards (``close_s``: QUIC's closing
period, 0.2-0.5 s, which once counted in ``end`` and so in every MB/s of bench_relay; the
moq-rs subscriber's figure stops at its last frame too).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import struct
import sys
import time
from collections.abc import Callable

from relay.moqt.codes import ObjectStatus
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.session import ReceivedObject, open_session
from relay.transport import QuicSettings

_STAMP = struct.Struct("<d")


def _print_ready() -> None:
    print("ready", flush=True)


async def run(url: str, ca: str, namespace_hex: str, name: str, total: int, size: int | str,
              backend: str, ready: Callable[[], None] = _print_ready) -> dict[str, float]:
    session = await open_session(url, ca_file=ca,
                                 settings=QuicSettings(max_datagram_size=size, backend=backend))
    namespace = tuple(bytes.fromhex(f) for f in namespace_hex.split("/"))
    sub = await session.subscribe(namespace, name.encode(),
                                  Params(location_filter=LocationFilter.next_object()))
    ready()
    cpu0 = time.process_time()
    latencies: list[float] = []
    got = nbytes = 0
    async with asyncio.timeout(600):
        async for ev in sub:
            if isinstance(ev, ReceivedObject) and ev.status == ObjectStatus.NORMAL:
                now = time.time()
                latencies.append(now - _STAMP.unpack_from(ev.payload)[0])
                got += 1
                nbytes += len(ev.payload)
                if got == total:
                    break
    end, cpu = time.time(), time.process_time() - cpu0
    if got != total:
        raise SystemExit(f"subscription ended after {got} of {total} Objects")
    close0 = time.monotonic()
    await session.aclose()
    return {"end": end, "latency_ms": statistics.median(latencies) * 1000,
            "bytes": nbytes, "cpu_s": cpu, "close_s": time.monotonic() - close0}


def main() -> None:
    url, ca, ns, name, total, size, backend = sys.argv[1:8]
    result = asyncio.run(run(url, ca, ns, name, int(total),
                             size if size == "auto" else int(size), backend))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
