"""Congestion control under delay and random loss: aioquic's reno and cubic against our bbr
(relay/transport/congestion.py), loopback only.

A seeded UDP impairment forwarder (its own process, so its CPU is not the transfer's) sits
between client and server on 127.0.0.1: every datagram, either direction, waits the one-way
delay (RTT / 2) and is dropped with the given probability (one seeded generator per
direction; settings in the JSON). Through it:

* ``raw``: one 16 MiB stream client -> server on plain aioquic (none of our code), the
  controller chosen by ``congestion_control_algorithm`` (bbr paced by its model, as the
  endpoint does: ``_aioquic.use_model_pacer``);
* ``kvcs`` (``BENCH_CC_KVCS=1``): ``kvcs fetch`` of a completed publication
  (``kvcs publish --synthetic 8,8,128,1024,float16,1``: issue 24's "16 MiB" cache, 16 MiB
  of K and 16 of V) from a ``kvcs relay`` whose
  ``congestion_control`` is the one measured (the relay sends; the fetch client uses the
  same controller).

Each row is the median of ``BENCH_CC_REPEATS`` runs, the controllers interleaved so load
from other processes hits them alike; ratios are against reno in the same run. A run that
misses the deadline is marked: a raw row then gives the rate of what arrived by then, a kvcs
row the whole size over the time it had (an upper bound). Run:
``python -m benchmarks cc`` (env: BENCH_CC_MB=16, BENCH_CC_RTTS_MS=20,40,
BENCH_CC_LOSSES=0,0.1,1, BENCH_CC_ALGOS=reno,cubic,bbr, BENCH_CC_REPEATS=1,
BENCH_CC_DEADLINE=90, BENCH_CC_KVCS=0; with BENCH_CC_KVCS=1, "qh3" among the algorithms
runs relay and client on qh3 with its own controller, for comparison).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import QuicEvent, StreamDataReceived

from benchmarks._report import report
from benchmarks.bench_relay import _RelayProcess
from relay.kvcs.plan import PublicationPlan
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens
from relay.peers.connect import PEER_SETTINGS, RelayAccess
from relay.peers.publisher import PublishOptions, publish_plan
from relay.peers.subscriber import RetrieveOptions, retrieve
from relay.transport import ensure_self_signed
from relay.transport._aioquic import use_model_pacer

MiB = 1024 * 1024
_CERTS = os.path.join(tempfile.gettempdir(), "kvcs-bench-certs")
_HOST = "127.0.0.1"
_SOCKET_BUFFER = 8 * MiB  # the forwarder's own drops would be loss nobody configured


# -- the forwarder (runs in its own process) ------------------------------------------------

class _Direction:
    """One direction of the path: a FIFO of datagrams due after the one-way delay (constant,
    so arrival order is due order: one timer for the head instead of one per datagram)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float, loss: float,
                 seed: int) -> None:
        self.loop = loop
        self.delay = delay
        self.loss = loss
        self.rng = random.Random(seed)
        self.queue: collections.deque[tuple[float, bytes, Any]] = collections.deque()
        self.timer: asyncio.TimerHandle | None = None
        self.sent = self.dropped = 0

    def push(self, data: bytes, out: asyncio.DatagramTransport, addr: Any) -> None:
        if self.loss and self.rng.random() < self.loss:
            self.dropped += 1
            return
        if not self.delay:
            out.sendto(data, addr)
            self.sent += 1
            return
        self.queue.append((self.loop.time() + self.delay, data, (out, addr)))
        if self.timer is None:
            self.timer = self.loop.call_at(self.queue[0][0], self._flush)

    def _flush(self) -> None:
        self.timer = None
        now = self.loop.time()
        q = self.queue
        while q and q[0][0] <= now:
            _, data, (out, addr) = q.popleft()
            out.sendto(data, addr)
            self.sent += 1
        if q:
            self.timer = self.loop.call_at(q[0][0], self._flush)


class _Side(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Any) -> None:
        self.on_datagram = on_datagram
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.on_datagram(data, addr)


def _udp_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        s.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)
    s.bind((_HOST, 0))
    s.setblocking(False)
    return s


async def _forward(server_port: int, delay: float, loss: float, seed: int) -> None:
    """Listen on a port (printed), relay one client's datagrams to ``server_port`` and the
    answers back, each direction delayed and thinned; stop when stdin closes."""
    loop = asyncio.get_running_loop()
    up = _Direction(loop, delay, loss, seed)
    down = _Direction(loop, delay, loss, seed + 1)
    client: list[Any] = []
    front: _Side
    back: _Side

    def from_client(data: bytes, addr: Any) -> None:
        if not client or client[0] != addr:
            client[:] = [addr]  # the newest client (one at a time)
        assert back.transport is not None
        up.push(data, back.transport, (_HOST, server_port))

    def from_server(data: bytes, addr: Any) -> None:
        if client:
            assert front.transport is not None
            down.push(data, front.transport, client[0])

    front = _Side(from_client)
    back = _Side(from_server)
    fs, bs = _udp_socket(), _udp_socket()
    await loop.create_datagram_endpoint(lambda: front, sock=fs)
    await loop.create_datagram_endpoint(lambda: back, sock=bs)
    print(fs.getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin
    print(json.dumps({"up_sent": up.sent, "up_dropped": up.dropped, "down_sent": down.sent,
                      "down_dropped": down.dropped}), flush=True)


class Forwarder:
    """The forwarder process, as a context manager: ``port`` is where clients send."""

    def __init__(self, server_port: int, rtt: float, loss: float, seed: int = 1) -> None:
        self.args = [str(server_port), str(rtt / 2), str(loss), str(seed)]
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.stats: dict[str, int] = {}

    def __enter__(self) -> Forwarder:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_cc", "--forward", *self.args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=Path(__file__).resolve().parents[1])
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            out, _ = self.proc.communicate(timeout=5)
            self.stats = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        except (subprocess.TimeoutExpired, ValueError):
            self.proc.kill()
            self.proc.wait()


# -- raw aioquic through the forwarder ------------------------------------------------------

class _Sink(QuicConnectionProtocol):
    """Counts the bytes of the stream; ``done`` gets the time its FIN arrived."""

    done: asyncio.Future[float]
    received: list[int]

    def __init__(self, quic: QuicConnection, *args: Any, **kwargs: Any) -> None:
        use_model_pacer(quic)  # bbr paced by its model, as relay.transport does
        super().__init__(quic, *args, **kwargs)

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, StreamDataReceived):
            type(self).received[0] += len(event.data)
            if event.end_stream and not type(self).done.done():
                type(self).done.set_result(time.perf_counter())


class _Sender(QuicConnectionProtocol):
    def __init__(self, quic: QuicConnection, *args: Any, **kwargs: Any) -> None:
        use_model_pacer(quic)
        super().__init__(quic, *args, **kwargs)


async def raw_transfer(nbytes: int, algo: str, rtt: float, loss: float, seed: int,
                       deadline: float) -> tuple[float, bool]:
    """(MB/s, completed) of one aioquic stream client -> server through the forwarder."""
    certs = ensure_self_signed(_CERTS)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()
    received = [0]
    sink = type("_SinkRun", (_Sink,), {"done": done, "received": received})
    scfg = QuicConfiguration(is_client=False, alpn_protocols=["bench"],
                             congestion_control_algorithm=algo, idle_timeout=60.0)
    scfg.load_cert_chain(certs.certfile, certs.keyfile)
    server = await serve(_HOST, 0, configuration=scfg, create_protocol=sink)
    port = server._transport.get_extra_info("sockname")[1]
    ccfg = QuicConfiguration(is_client=True, alpn_protocols=["bench"],
                             congestion_control_algorithm=algo, idle_timeout=60.0)
    ccfg.load_verify_locations(cafile=str(certs.certfile))
    ccfg.server_name = "localhost"
    try:
        with Forwarder(port, rtt, loss, seed) as fwd:
            async with connect(_HOST, fwd.port, configuration=ccfg,
                               create_protocol=_Sender) as client:
                sid = client._quic.get_next_available_stream_id(is_unidirectional=True)
                t0 = time.perf_counter()
                client._quic.send_stream_data(sid, bytes(nbytes), end_stream=True)
                client.transmit()
                try:
                    t1 = await asyncio.wait_for(asyncio.shield(done), deadline)
                    return nbytes / (t1 - t0) / 1e6, True
                except TimeoutError:
                    return received[0] / (time.perf_counter() - t0) / 1e6, False
    finally:
        server.close()


# -- kvcs fetch from a kvcs relay through the forwarder -------------------------------------

SCOPE_KEY = bytes(range(32))
KVCS_BYTES = 32 * MiB  # K and V (16 MiB each) of the cache below


def _cache() -> tuple[Any, Any, Any, list[int]]:
    """The synthetic cache of ``kvcs publish --synthetic 8,8,128,1024,float16,1``
    (8 layers, 8 KV heads, head dim 128, 1024 tokens, fp16, seed 1)."""
    d = synthetic_descriptor(8, 8, 128, "float16", block_tokens=16)
    k, v = synthetic_kv(8, 8, 128, 1024, "float16", seed=1)
    return d, k, v, synthetic_tokens(1024, seed=1)


async def kvcs_fetch(algo: str, rtt: float, loss: float, seed: int, deadline: float
                     ) -> tuple[float, bool, int]:
    """(seconds to the last usable layer, complete, bytes) of a completed publication
    fetched (what ``kvcs fetch`` runs) through the forwarder from a ``kvcs relay`` process
    on aioquic whose ``congestion_control`` is ``algo``; the fetching client uses ``algo``
    too. ``algo`` "qh3": relay and client on qh3 instead, with its core's own controller
    (for comparison: it has no choice)."""
    d, k, v, tokens = _cache()
    backend = "qh3" if algo == "qh3" else "aioquic"
    extra = () if algo == "qh3" else ("--congestion-control", algo)
    settings = (dataclasses.replace(PEER_SETTINGS, backend="qh3") if algo == "qh3"
                else dataclasses.replace(PEER_SETTINGS, congestion_control=algo))
    with tempfile.TemporaryDirectory() as tmp:
        async with _RelayProcess(Path(tmp), 1200, backend, extra=extra) as relay:
            direct = RelayAccess((relay.url,), ca_file=relay.certfile, settings=settings)
            plan = PublicationPlan(k, v, d, SCOPE_KEY, tokens)
            await asyncio.wait_for(publish_plan(plan, direct, PublishOptions(confirm="fetch")),
                                   120)
            with Forwarder(relay.port, rtt, loss, seed) as fwd:
                access = RelayAccess(
                    (f"moqt://{_HOST}:{fwd.port}/",), ca_file=relay.certfile,
                    settings=settings)
                opts = RetrieveOptions(access, d, SCOPE_KEY, tokens, mode="completed",
                                       publications=[(plan.namespace, None)],
                                       deadline=deadline)
                t0 = time.perf_counter()
                res = await asyncio.wait_for(retrieve(opts), deadline + 30)
                took = time.perf_counter() - t0
    rep = res.report
    complete = rep["exit_code"] == 0
    if complete:
        assert np.array_equal(res.k, k) and np.array_equal(res.v, v)  # bit for bit
        took = rep["all_layers_ms"] / 1000
    return took, complete, k.nbytes + v.nbytes


# -- the table ------------------------------------------------------------------------------

def _env_list(name: str, default: str) -> list[str]:
    return [x for x in os.environ.get(name, default).split(",") if x]


Measure = Callable[[str, float, float, int], Awaitable[tuple[float, bool]]]
"""(controller, RTT, loss fraction, seed) -> (MB/s, completed before the deadline)."""


async def _table(measure: Measure, nbytes: int, rtts: list[float], losses: list[float],
                 algos: list[str], repeats: int) -> list[list[Any]]:
    rows = []
    for rtt in rtts:
        for loss in losses:
            rates: dict[str, list[float]] = {a: [] for a in algos}
            complete = dict.fromkeys(algos, True)
            # interleaved in rotating order: load from other processes hits all alike
            for i in range(repeats):
                k = i % len(algos)
                for algo in algos[k:] + algos[:k]:
                    rate, ok = await measure(algo, rtt, loss / 100, i + 1)
                    rates[algo].append(rate)
                    complete[algo] &= ok
            med = {a: statistics.median(v) for a, v in rates.items()}
            for algo in algos:
                base = med.get("reno")
                rows.append([round(rtt * 1000), loss, algo, round(med[algo], 2),
                             round(nbytes / med[algo] / 1e6, 1) if med[algo] else None,
                             round(med[algo] / base, 2) if base else None,
                             "yes" if complete[algo] else "deadline"])
            print(*rows[-len(algos):], sep="\n", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--forward"]:
        port, delay, loss, seed = argv[1:5]
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_forward(int(port), float(delay), float(loss), int(seed)))
        return
    nbytes = int(os.environ.get("BENCH_CC_MB", "16")) * MiB
    rtts = [float(x) / 1000 for x in _env_list("BENCH_CC_RTTS_MS", "20,40")]
    losses = [float(x) for x in _env_list("BENCH_CC_LOSSES", "0,0.1,1")]
    algos = _env_list("BENCH_CC_ALGOS", "reno,cubic,bbr")
    repeats = int(os.environ.get("BENCH_CC_REPEATS", "1"))
    deadline = float(os.environ.get("BENCH_CC_DEADLINE", "90"))
    columns = ["rtt_ms", "loss_%", "cc", "MB/s", "seconds", "x_reno", "complete"]
    settings = {"repeats": repeats, "deadline_s": deadline,
                "seeds": list(range(1, repeats + 1)), "rtts_ms": [r * 1000 for r in rtts],
                "losses_%": losses}
    if os.environ.get("BENCH_CC_KVCS", "0") == "1":
        async def fetch(algo: str, rtt: float, loss: float, seed: int) -> tuple[float, bool]:
            took, ok, n = await kvcs_fetch(algo, rtt, loss, seed, deadline)
            return n / took / 1e6, ok

        rows = asyncio.run(_table(fetch, KVCS_BYTES, rtts, losses, algos, repeats))
        report("cc_kvcs", columns, rows, extra={
            "what": "kvcs fetch (in-process retrieve, completed mode) of the synthetic "
                    "cache (16 MiB of K, 16 of V) from a kvcs relay process on aioquic, "
                    "both with the controller named, through the seeded forwarder; seconds "
                    "to the last usable layer",
            **settings})
        return

    async def raw(algo: str, rtt: float, loss: float, seed: int) -> tuple[float, bool]:
        return await raw_transfer(nbytes, algo, rtt, loss, seed, deadline)

    rows = asyncio.run(_table(raw, nbytes, rtts, losses, algos, repeats))
    report("cc", columns, rows, extra={
        "what": "one aioquic stream client->server through the seeded forwarder (delay RTT/2 "
                "and loss each direction), max_datagram_size 1200, both QUIC ends in one "
                "process, the forwarder in another", "bytes": nbytes, **settings})


if __name__ == "__main__":
    main()
