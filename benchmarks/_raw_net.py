"""QUIC alone on the hosts of a tests/net lab (bench_net's ``raw-<backend>`` rows): no MOQT, no
KVCS, no relay; only the QUIC library under ``relay.transport`` (its UDP layer, its socket
buffers) moving the same bytes over the same impaired path. The server, on the relay host,
opens one unidirectional stream to each client and writes ``nbytes`` in 1 MiB writes; the
client, on the consumer host dialling the forwarder, reads it to its FIN and prints the
seconds from dialling to the FIN (connecting included, as in ``kvcs fetch``'s figure). Where
ours is close to this row, the time is the library's (its congestion control), not ours.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from relay.session.wire import MOQT
from relay.transport import QuicSettings, connect, serve

_SELF = str(Path(__file__).resolve())
_CHUNK = 1 << 20


async def _serve(host: str, backend: str, nbytes: int, cert: str, key: str) -> None:
    payload = memoryview(bytes(_CHUNK))

    async def handler(conn: Any) -> None:
        send = await conn.open_uni()
        for pos in range(0, nbytes, _CHUNK):
            await send.write(payload[:min(_CHUNK, nbytes - pos)])
        await send.finish()
        await conn.wait_closed()

    server = await serve(host, 0, cert, key, handler, settings=QuicSettings(backend=backend),
                         application=MOQT)
    print(json.dumps({"port": server.port}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
    await server.close(grace=0.2)


async def _get(url: str, ca: str, backend: str, nbytes: int, deadline: float
               ) -> dict[str, Any]:
    t0 = time.perf_counter()
    total = 0
    try:
        async with asyncio.timeout(deadline):
            conn = await connect(url, settings=QuicSettings(backend=backend), ca_file=ca,
                                 application=MOQT)
            inc = await conn.accept()
            while data := await inc.recv.read():
                total += len(data)
    except TimeoutError:
        return {"deadline_passed": True, "bytes": total}
    seconds = time.perf_counter() - t0
    await conn.aclose()
    return {"seconds": seconds, "bytes": total}


async def raw_in_lab(lab: Any, relay_host: Any, consumer: Any, imp: Any, nbytes: int,
                     backend: str, deadline: float) -> dict[str, Any]:
    """One transfer of ``nbytes`` over QUIC alone, the client behind forwarder ``imp``;
    past ``deadline`` seconds: ``deadline_passed`` and the bytes that came."""
    cert, key = lab.certs()
    server = await lab.spawn(relay_host, sys.executable, _SELF, "serve", relay_host.ip,
                             backend, str(nbytes), str(cert), str(key), stdout=True,
                             what=f"raw {backend} server")
    assert server.proc.stdout is not None
    async with asyncio.timeout(60):
        line = await server.proc.stdout.readline()
    if not line:
        raise RuntimeError(f"raw server did not start: {server.text()}")
    port = json.loads(line)["port"]
    via = await lab.forwarder(f"{relay_host.ip}:{port}", imp)
    try:
        code, out, err = await lab.run(consumer, sys.executable, _SELF, "get",
                                       f"moqt://{via}/", str(cert), backend, str(nbytes),
                                       str(deadline), timeout=deadline + 30)
    finally:
        (stats,) = await lab.forwarder_stats()
        await lab.stop(server)
    if code != 0:
        raise RuntimeError(f"raw client exit {code}: {err[-300:]}")
    result: dict[str, Any] = json.loads(out)
    if result["bytes"] != nbytes and not result.get("deadline_passed"):
        raise RuntimeError(f"raw: {result['bytes']} of {nbytes} bytes")
    if "seconds" in result:
        result["mbps"] = nbytes / result["seconds"] / 1e6
    result["forwarder"] = stats
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        host, be, n, c, k = sys.argv[2:7]
        asyncio.run(_serve(host, be, int(n), c, k))
    elif sys.argv[1:2] == ["get"]:
        url, ca, be, n, dl = sys.argv[2:7]
        print(json.dumps(asyncio.run(_get(url, ca, be, int(n), float(dl)))), flush=True)
