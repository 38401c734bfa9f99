"""QUIC alone on the hosts of a tests/net lab (bench_net's ``raw-<backend>`` rows): no MOQT, no
KVCS, no relay; only the QUIC library under ``relay.transport`` (its UDP layer, its socket
buffers) moving the same bytes over the same impaired path. The server, on the relay host,
opens one unidirectional stream to each client and writes ``nbytes`` in 1 MiB writes; the
client, on the consumer host dialling the forwarder, reads it to its FIN and prints the
seconds from dialling to the FIN (connecting included, as in ``kvcs fetch``'s figure). Where
ours is close to this row, the time is the library's (its congestion control), not ours.

A stack is ``BACKEND[:CC][@SIZE]``: ``qh3``, ``aioquic`` (relay.transport; SIZE its
``max_datagram_size``, ``auto`` by default; CC aioquic's controller) or ``aiopquic``
(``_pquic.py``, picoquic with no relay.transport port; CC picoquic's algorithm, ``bbr1`` by
default; SIZE its path-MTU policy, ``basic`` or ``blocked``). Both ends report the CPU
seconds of their process over the transfer (the server on a second JSON line once the client
has closed), for CPU per GB on each side (bench_quic.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # a child run as a script: this checkout's code, not the installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relay.session.wire import MOQT
from relay.transport import QuicSettings, connect, serve
from relay.transport.config import AUTO

_SELF = str(Path(__file__).resolve())
_CHUNK = 1 << 20


def parse_stack(stack: str) -> tuple[str, str, str]:
    """``BACKEND[:CC][@SIZE]`` -> (backend, congestion controller or "", size or "")."""
    head, _, size = stack.partition("@")
    backend, _, cc = head.partition(":")
    return backend, cc, size


def _settings(stack: str) -> QuicSettings:
    backend, cc, size = parse_stack(stack)
    extra: dict[str, Any] = {"congestion_control": cc} if cc else {}
    return QuicSettings(backend=backend, max_datagram_size=int(size) if size.isdigit()
                        else AUTO, **extra)


async def _serve(host: str, stack: str, nbytes: int, cert: str, key: str) -> None:
    backend, cc, size = parse_stack(stack)
    if backend == "aiopquic":
        from benchmarks import _pquic
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(_pquic.serve_sender(host, nbytes, cert, key, cc or "bbr1",
                                                       size or "basic", started))
        print(json.dumps({"port": await started}), flush=True)
        print(json.dumps(await task), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
        return
    payload = memoryview(bytes(_CHUNK))

    async def handler(conn: Any) -> None:
        c0 = time.process_time()
        send = await conn.open_uni()
        for pos in range(0, nbytes, _CHUNK):
            await send.write(payload[:min(_CHUNK, nbytes - pos)])
        await send.finish()
        await conn.wait_closed()
        print(json.dumps({"cpu": time.process_time() - c0}), flush=True)

    server = await serve(host, 0, cert, key, handler, settings=_settings(stack),
                         application=MOQT)
    print(json.dumps({"port": server.port}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
    await server.close(grace=0.2)


async def _get(url: str, ca: str, stack: str, nbytes: int, deadline: float
               ) -> dict[str, Any]:
    backend, cc, size = parse_stack(stack)
    if backend == "aiopquic":
        from benchmarks import _pquic
        hostport = url.split("//", 1)[1].rstrip("/")
        host, port = hostport.rsplit(":", 1)
        return await _pquic.get(host, int(port), ca, nbytes, deadline, cc or "bbr1",
                                size or "basic")
    t0, c0 = time.perf_counter(), time.process_time()
    total = 0
    try:
        async with asyncio.timeout(deadline):
            conn = await connect(url, settings=_settings(stack), ca_file=ca,
                                 application=MOQT)
            inc = await conn.accept()
            while data := await inc.recv.read():
                total += len(data)
    except TimeoutError:
        return {"deadline_passed": True, "bytes": total}
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    await conn.aclose()
    return {"seconds": seconds, "cpu": cpu, "bytes": total}


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
