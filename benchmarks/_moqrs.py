"""Reference measurement: the same fan-out through moq-rs's OWN server instead of our relay.

What a user would pick instead of kvcs-relay: the ``moq-rs`` wheel (imported as ``moq``) used
end to end, its ``moq.Server`` as the relay and its clients on both sides. Everything runs on
127.0.0.1. Process layout of :func:`moqrs_fanout`:

* the **server** is a child process (``python _moqrs.py serve``): ``moq.Server`` in simple
  mode (one internal origin wired to both publish and consume, so a broadcast a publisher
  session announces is served to every other session), a self-signed certificate it generates
  itself (``tls_generate``), clients pin its SHA-256 fingerprint. It prints its address and
  fingerprints as one JSON line and serves until its stdin closes;
* the **publisher** is a moq-rs client in the calling process (the caller's event loop);
* each of the N **subscribers** is a moq-rs client in its own child process
  (``python _moqrs.py sub ...``), printing ``{"ready": true}`` once its subscription is
  live and one JSON result line at the end.

The Track: broadcast ``kvcs/bench``, track ``kv``, ``layers`` groups (a group = one layer) of
``nbytes_per_track // layers // object_bytes`` frames of ``object_bytes`` bytes each. Frame
layout: ``<d`` ``time.perf_counter()`` at write, ``<I`` group, ``<I`` frame index, then a fixed
pseudo-random filler; every subscriber checks every frame bit for bit (except the stamp) and
that it got each (group, frame) exactly once, else :func:`moqrs_fanout` raises.

Numbers: MB/s (10^6 bytes/s) per subscriber = track bytes / (last frame that subscriber
received - first frame written), mean over subscribers; latency = receive time - the stamp,
median over all receipts of all subscribers. The stamp and the receive times come from
``time.perf_counter()`` in different processes: on Linux that is ``CLOCK_MONOTONIC``, one
system-wide clock (checked at run time, else RuntimeError).

moq-rs caveats found while writing this (moq-rs 0.5.1):

* moq-rs client <-> moq-rs server negotiate ALPN ``moq-lite-06`` on native QUIC (``moqt://``
  URL), not ``moqt-22``: the client offers both and the server prefers moq-lite, and the Python
  bindings have no knob for the version. So this measures moq-rs's own stack as a user would
  get it, on moq-lite, not moq-rs speaking MOQT draft-22.
* ``subscribe_track`` returns before anything is sent; the SUBSCRIBE goes out when the
  consumer first polls ``recv_group``. Subscribers therefore start their receive loop, then
  report ready after a short settle; the publisher also waits for ``TrackProducer.used()``.
  Subscriptions ask ``group_start=0`` (moq-lite carries it on the wire) so a late SUBSCRIBE
  would still get every group from the server's cache (correctness does not hinge on the
  settle), and ``max_age_us`` of one hour so no group is skipped as stale.
* ``TrackProducer.finish()`` while groups are still in flight through the server makes the
  server drop them (subscribers see the track end with frames missing, or a Protocol error),
  so the publisher finishes the track only after every subscriber has reported all frames.
* ``GroupProducer.write_frame`` is synchronous and never pushes back: the whole track is
  buffered in the publisher within milliseconds, so the latency here is mostly queueing behind
  earlier frames (it grows with the track size and the fan-out), unlike a publisher that
  awaits each write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

BROADCAST = "kvcs/bench"
TRACK = "kv"
TIMEOUT = 120.0  # bound on every await
NO_SKIP_US = 3_600_000_000  # a group younger than this is never skipped as stale
SETTLE = 0.2  # seconds a subscriber waits after starting its receive loop before "ready"
_HEADER = struct.Struct("<dII")  # perf_counter stamp, group, frame index
_SELF = str(Path(__file__).resolve())


def _filler(nbytes: int) -> bytes:
    """The fixed frame body after the header, the same in every process."""
    return random.Random(0x6B766373).randbytes(max(0, nbytes - _HEADER.size))


def _check_clock() -> None:
    impl = time.get_clock_info("perf_counter").implementation
    if "CLOCK_MONOTONIC" not in impl or "RAW" in impl:
        raise RuntimeError(f"perf_counter is {impl!r}: not comparable across processes")


async def moqrs_available() -> bool:
    """Whether the moq-rs wheel (``import moq``) is installed."""
    try:
        import moq  # noqa: F401
    except ImportError:
        return False
    return True


def _client(url: str, fingerprints: list[str], role: str) -> Any:
    import moq

    # A separate origin per side, so the publisher does not also consume its own broadcast
    # back from the server (and a subscriber publishes nothing).
    origin = {"publish": moq.OriginProducer()} if role == "pub" else {
        "subscribe": moq.OriginProducer()}
    return moq.connect(url, tls_fingerprints=fingerprints, websocket_enabled=False,
                       reconnect=False, **origin)


# -- children --------------------------------------------------------------------------------


async def _serve(host: str = "127.0.0.1") -> None:
    """Child: run moq-rs's server on ``host`` (any free port) until stdin closes."""
    import moq

    async with moq.Server(f"{host}:0", tls_generate=["localhost"]) as server:
        print(json.dumps({"addr": server.local_addr,
                          "fingerprints": server.cert_fingerprints()}), flush=True)
        sessions: set[asyncio.Task[None]] = set()

        async def hold(request: Any) -> None:
            # what Server.serve() does, minus the traceback when a client hangs up (moq-rs
            # reports a session its peer closed as MoqError.Protocol)
            with contextlib.suppress(Exception):
                session = await request.accept()
                await session.closed()

        async def accept_all() -> None:
            async for request in server:
                task = asyncio.create_task(hold(request))
                sessions.add(task)
                task.add_done_callback(sessions.discard)

        serving = asyncio.create_task(accept_all())
        try:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
        finally:
            for task in (serving, *sessions):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.gather(serving, *sessions, return_exceptions=True)


async def _subscribe(url: str, fingerprint: str, groups: int, frames: int,
                     object_bytes: int) -> dict[str, Any]:
    """Child: one moq-rs subscriber; receives and checks every frame."""
    import moq

    filler = _filler(object_bytes)
    total = groups * frames
    seen: set[tuple[int, int]] = set()
    errors: list[str] = []
    latencies: list[float] = []
    state = {"bytes": 0, "last": 0.0}
    complete = asyncio.Event()

    async def read_group(grp: Any) -> None:
        seq = grp.sequence
        while (frame := await grp.read_frame()) is not None:
            now = time.perf_counter()
            p = frame.payload
            if len(p) != object_bytes:
                errors.append(f"group {seq}: frame of {len(p)} bytes")
                continue
            stamp, g, i = _HEADER.unpack_from(p, 0)
            if g != seq or p[_HEADER.size:] != filler:
                errors.append(f"group {seq}: frame {g}/{i} corrupt")
                continue
            if (g, i) in seen:
                errors.append(f"frame {g}/{i} twice")
                continue
            seen.add((g, i))
            latencies.append(round((now - stamp) * 1e3, 4))
            state["bytes"] += len(p)
            state["last"] = now
            if len(seen) == total:
                complete.set()

    async def receive(tc: Any) -> None:
        readers: set[asyncio.Task[None]] = set()
        try:
            while (grp := await tc.recv_group()) is not None:
                task = asyncio.create_task(read_group(grp))
                readers.add(task)
                task.add_done_callback(readers.discard)
            await asyncio.gather(*readers)
        finally:
            complete.set()  # the track ended (or failed): stop waiting, report what came

    async with _client(url, [fingerprint], "sub") as client:
        async with asyncio.timeout(TIMEOUT):
            broadcast = await client.announced_broadcast(BROADCAST)
            tc = await broadcast.subscribe_track(
                TRACK, moq.Subscription(max_age_us=NO_SKIP_US, group_start=0))
        receiver = asyncio.create_task(receive(tc))  # its first recv_group sends SUBSCRIBE
        await asyncio.sleep(SETTLE)
        print(json.dumps({"ready": True}), flush=True)
        try:
            async with asyncio.timeout(TIMEOUT):
                await complete.wait()
        except TimeoutError:
            errors.append(f"timed out with {len(seen)}/{total} frames")
        if receiver.done() and receiver.exception() is not None:
            errors.append(f"receive failed: {receiver.exception()!r}")
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await receiver
        tc.cancel()
    return {"frames": len(seen), "bytes": state["bytes"], "last": state["last"],
            "latency_ms": latencies, "errors": errors[:20]}


# -- parent ----------------------------------------------------------------------------------


async def write_track(track: Any, layers: int, frames: int, filler: bytes) -> float:
    """Write ``layers`` groups of ``frames`` stamped frames; the first frame's stamp."""
    t0 = 0.0
    for g in range(layers):
        group = track.append_group()
        for i in range(frames):
            stamp = time.perf_counter()
            t0 = t0 or stamp  # the first frame written
            group.write_frame(_HEADER.pack(stamp, g, i) + filler)
            await asyncio.sleep(0)
        group.finish()
    return t0


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, _SELF, *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, limit=1 << 26)  # a result line lists every latency


async def _line(proc: asyncio.subprocess.Process, what: str) -> dict[str, Any]:
    assert proc.stdout is not None
    async with asyncio.timeout(TIMEOUT):
        line = await proc.stdout.readline()
    if not line:
        raise RuntimeError(f"moq-rs {what} exited (rc {await proc.wait()}) without output")
    out: dict[str, Any] = json.loads(line)
    return out


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    for p in procs:
        if p.stdin is not None and not p.stdin.is_closing():
            p.stdin.close()
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), 5)
        except TimeoutError:
            p.kill()
            await p.wait()


async def moqrs_fanout(nbytes_per_track: int, object_bytes: int, subscribers: int,
                       layers: int) -> dict[str, float]:
    """1 publisher -> moq-rs server -> N subscribers, all moq-rs clients.
    Returns {"mbps_per_subscriber": ..., "median_latency_ms": ...,
    "server_cpu_s_per_gb": ...}."""
    # here, not at the top: this file also runs as a script (the server and subscribers)
    from benchmarks._proc import cpu_per_gb, cpu_seconds

    _check_clock()
    frames = nbytes_per_track // layers // object_bytes
    if object_bytes < _HEADER.size or frames < 1 or subscribers < 1:
        raise ValueError("need object_bytes >= 16, one frame per layer and a subscriber")
    total = layers * frames
    filler = _filler(object_bytes)
    procs: list[asyncio.subprocess.Process] = []
    try:
        server = await _spawn("serve")
        procs.append(server)
        info = await _line(server, "server")
        url = f"moqt://127.0.0.1:{info['addr'].rsplit(':', 1)[1]}/"
        fingerprints: list[str] = info["fingerprints"]
        async with _client(url, fingerprints, "pub") as pub:
            broadcast = pub.create_broadcast(BROADCAST)
            track = broadcast.publish_track(TRACK)
            broadcast.announce()
            subs = [await _spawn("sub", url, fingerprints[0], str(layers), str(frames),
                                 str(object_bytes)) for _ in range(subscribers)]
            procs.extend(subs)
            for p in subs:
                if not (await _line(p, "subscriber")).get("ready"):
                    raise RuntimeError("moq-rs subscriber not ready")
            await asyncio.wait_for(track.used(), TIMEOUT)

            cpu0 = cpu_seconds(server.pid)
            t0 = await write_track(track, layers, frames, filler)
            results = [await _line(p, "subscriber") for p in subs]
            cpu = cpu_seconds(server.pid) - cpu0
            track.finish()  # only now: finishing earlier drops in-flight groups (docstring)
        for n, r in enumerate(results):
            if r["errors"] or r["frames"] != total or r["bytes"] != total * object_bytes:
                raise RuntimeError(f"moq-rs subscriber {n}: {r['frames']}/{total} frames, "
                                   f"{r['bytes']} bytes, errors {r['errors']}")
    finally:
        await _stop(procs)
    nbytes = total * object_bytes
    return {
        "mbps_per_subscriber": statistics.mean(nbytes / (r["last"] - t0) / 1e6
                                               for r in results),
        "median_latency_ms": statistics.median(x for r in results for x in r["latency_ms"]),
        "server_cpu_s_per_gb": cpu_per_gb(cpu, nbytes * subscribers),
    }


async def _main() -> None:
    if not await moqrs_available():
        print("moq-rs (import moq) is not installed")
        return
    for n in (1, 8):
        r = await moqrs_fanout(16 * 1024 * 1024, 32 * 1024, n, 8)
        print(f"moq-rs server 1->{n}: {r['mbps_per_subscriber']:.1f} MB/s per subscriber, "
              f"median latency {r['median_latency_ms']:.1f} ms", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        asyncio.run(_serve(*sys.argv[2:3]))
    elif sys.argv[1:2] == ["sub"]:
        url, fp, groups, frames, size = sys.argv[2:7]
        result = asyncio.run(_subscribe(url, fp, int(groups), int(frames), int(size)))
        print(json.dumps(result), flush=True)
    else:
        asyncio.run(_main())
