"""moq-rs's own server and clients on the hosts of a tests/net lab (bench_net's reference).

Same stack and frame checks as ``_moqrs.py`` (its ``serve`` and ``sub`` children, each frame
checked bit for bit and exactly once), placed like ours: the **server** on the relay host, the
**publisher** beside it (dialling it directly), the **subscriber** on the consumer host
dialling the impairment forwarder in front of the server. The publisher child here waits until
the subscription reaches it, writes every frame, and reports the first write's time; the
subscriber reports its last frame's: the figure is the time between, both from
``time.perf_counter()`` (CLOCK_MONOTONIC, one clock for every namespace of the machine).
moq-rs's time therefore starts once its subscription is live (its handshake and SUBSCRIBE are
not counted); ours (``kvcs fetch``'s ``all_layers_ms``) includes connecting and discovery.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks._moqrs import (
    BROADCAST,
    TIMEOUT,
    TRACK,
    _check_clock,
    _client,
    _filler,
    write_track,
)

_MOQRS = str(Path(__file__).resolve().parent / "_moqrs.py")
_SELF = str(Path(__file__).resolve())


async def _publish(url: str, fingerprint: str, layers: int, frames: int,
                   object_bytes: int) -> None:
    """Child: announce the broadcast, write every frame once subscribed, print the time of
    the first write, finish the track when stdin closes (finishing earlier drops in-flight
    groups at the server: _moqrs.py)."""
    filler = _filler(object_bytes)
    async with _client(url, [fingerprint], "pub") as pub:
        broadcast = pub.create_broadcast(BROADCAST)
        track = broadcast.publish_track(TRACK)
        broadcast.announce()
        print(json.dumps({"ready": True}), flush=True)
        await asyncio.wait_for(track.used(), TIMEOUT)
        t0 = await write_track(track, layers, frames, filler)
        print(json.dumps({"t0": t0}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
        track.finish()


async def _line(p: Any, what: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        line = await p.proc.stdout.readline()
    if not line:
        raise RuntimeError(f"moq-rs {what} exited without output: {p.text()}")
    out: dict[str, Any] = json.loads(line)
    return out


async def moqrs_in_lab(lab: Any, relay_host: Any, consumer: Any, imp: Any, nbytes: int,
                       layers: int, object_bytes: int = 32 * 1024) -> dict[str, Any]:
    """One transfer of ``nbytes`` (``layers`` groups) through moq-rs's server, subscriber
    behind an impairment forwarder ``imp``. Returns seconds, MB/s and the forwarder's
    counters; raises if any frame was missing or wrong."""
    _check_clock()
    frames = nbytes // layers // object_bytes
    total = layers * frames
    py = sys.executable
    server = await lab.spawn(relay_host, py, _MOQRS, "serve", relay_host.ip, stdout=True,
                             what="moq-rs server")
    info = await _line(server, "server")
    port = info["addr"].rsplit(":", 1)[1]
    fp = info["fingerprints"][0]
    direct = f"moqt://{relay_host.ip}:{port}/"
    via = await lab.forwarder(direct, imp)
    pub = await lab.spawn(relay_host, py, _SELF, "pub", direct, fp, str(layers), str(frames),
                          str(object_bytes), stdout=True, what="moq-rs publisher")
    await _line(pub, "publisher")
    sub = await lab.spawn(consumer, py, _MOQRS, "sub", via, fp, str(layers), str(frames),
                          str(object_bytes), stdout=True, what="moq-rs subscriber")
    await _line(sub, "subscriber")
    t0 = (await _line(pub, "publisher"))["t0"]
    result = await _line(sub, "subscriber", TIMEOUT + 10)
    for p in (pub, sub):
        await lab.stop(p)
    (stats,) = await lab.forwarder_stats()
    await lab.stop(server)
    if result["errors"] or result["frames"] != total:
        raise RuntimeError(f"moq-rs: {result['frames']}/{total} frames, {result['errors']}")
    seconds = result["last"] - t0
    return {"seconds": seconds, "mbps": total * object_bytes / seconds / 1e6,
            "forwarder": stats}


if __name__ == "__main__":
    if sys.argv[1:2] == ["pub"]:
        url, fp, layers, frames, size = sys.argv[2:7]
        asyncio.run(_publish(url, fp, int(layers), int(frames), int(size)))
