"""A seeded UDP impairment forwarder: what netem would do, for kernels without it.

``python impair.py --listen IP:PORT --to IP:PORT [--delay-ms D] [--loss P] [--reorder P]
[--duplicate P] [--reorder-ms R] [--seed S]`` forwards every datagram a client sends to
``--listen`` on to ``--to`` from a socket of its own per client (so the answers find their way
back), and the answers back to that client. Each datagram, in both directions, independently:
is dropped with probability ``--loss``; else is sent ``--delay-ms`` later (one-way delay: the
round trip gains twice that), ``--reorder-ms`` later still with probability ``--reorder`` (so
datagrams behind it overtake it), and a second time with probability ``--duplicate``.

It prints one JSON line ``{"ready": ..., "settings": ...}`` once listening, serves until its
stdin closes (or SIGTERM), then prints one JSON line of counters per direction. One thread,
one selector: in this harness it forwards 15-25 MB/s, which bounds what a measurement through
it can show (every compared stack goes through the same forwarder).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import selectors
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

_BUFFER = 4 << 20  # like the relay's own sockets: a burst of a long round trip's window fits
_BURST = 256  # datagrams read per readiness event before sending what is due
_FORCE = {socket.SO_RCVBUF: 33, socket.SO_SNDBUF: 32}  # SO_RCVBUFFORCE, SO_SNDBUFFORCE


@dataclass(frozen=True)
class Impairment:
    """What the forwarder does to each datagram, in each direction."""

    delay_ms: float = 0.0
    loss: float = 0.0
    reorder: float = 0.0
    reorder_ms: float = 10.0
    duplicate: float = 0.0
    seed: int = 1

    def argv(self) -> list[str]:
        return [f"--{k.replace('_', '-')}={v}" for k, v in asdict(self).items()]

    def describe(self) -> str:
        parts = [f"RTT {2 * self.delay_ms:g} ms"]
        if self.loss:
            parts.append(f"loss {self.loss * 100:g} %")
        if self.reorder:
            parts.append(f"reorder {self.reorder * 100:g} % (+{self.reorder_ms:g} ms)")
        if self.duplicate:
            parts.append(f"duplicate {self.duplicate * 100:g} %")
        return ", ".join(parts)


def _socket(bind: tuple[str, int]) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for opt, force in _FORCE.items():
        try:
            s.setsockopt(socket.SOL_SOCKET, force, _BUFFER)
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, opt, _BUFFER)
    s.bind(bind)
    s.setblocking(False)
    return s


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def serve(listen: tuple[str, int], target: tuple[str, int], imp: Impairment
          ) -> dict[str, Any]:
    """Forward until stopped; returns the counters per direction and the number of client
    addresses (each QUIC connection dials from its own socket)."""
    rnd = random.Random(imp.seed)
    front = _socket(listen)
    sel = selectors.DefaultSelector()
    sel.register(front, selectors.EVENT_READ, None)
    sel.register(sys.stdin, selectors.EVENT_READ, "stop")
    back: dict[tuple[str, int], socket.socket] = {}  # client address -> its own socket
    queue: list[tuple[float, int, socket.socket, bytes, tuple[str, int]]] = []
    seq = 0
    stats = {d: {"in": 0, "sent": 0, "lost": 0, "reordered": 0, "duplicated": 0,
                 "overflow": 0, "largest": 0} for d in ("up", "down")}
    delay, extra = imp.delay_ms / 1e3, imp.reorder_ms / 1e3
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    print(json.dumps({"ready": f"{listen[0]}:{front.getsockname()[1]}",
                      "to": f"{target[0]}:{target[1]}", "settings": asdict(imp)}), flush=True)
    while not stopping:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 1.0
        for key, _ in sel.select(timeout):
            if key.data == "stop":
                if not sys.stdin.buffer.read1(4096):  # type: ignore[attr-defined]
                    stopping = True
                    sel.unregister(sys.stdin)
                continue
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            now = time.monotonic()
            for _ in range(_BURST):
                try:
                    data, src = sock.recvfrom(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # e.g. ICMP unreachable reported on the socket: no datagram
                    break
                if key.data is None:  # from a client, towards the target
                    direction, dest = "up", target
                    out = back.get(src)
                    if out is None:
                        out = back[src] = _socket((listen[0], 0))
                        sel.register(out, selectors.EVENT_READ, src)
                else:  # an answer, back to the client whose socket this is
                    direction, dest, out = "down", key.data, front
                st = stats[direction]
                st["in"] += 1
                st["largest"] = max(st["largest"], len(data))  # UDP payload, reassembled
                if rnd.random() < imp.loss:
                    st["lost"] += 1
                    continue
                due = now + delay
                if imp.reorder and rnd.random() < imp.reorder:
                    due += extra
                    st["reordered"] += 1
                copies = 1
                if imp.duplicate and rnd.random() < imp.duplicate:
                    copies, st["duplicated"] = 2, st["duplicated"] + 1
                for _c in range(copies):
                    seq += 1
                    heapq.heappush(queue, (due, seq, out, data, dest))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, data, dest = heapq.heappop(queue)
            st = stats["up" if out is not front else "down"]
            try:
                out.sendto(data, dest)
                st["sent"] += 1
            except OSError:  # full socket buffer or an unreachable peer (a cut link): lost
                st["overflow"] += 1
    for s in (front, *back.values()):
        s.close()
    return {**stats, "clients": len(back)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--to", required=True)
    for name in ("delay-ms", "loss", "reorder", "reorder-ms", "duplicate"):
        p.add_argument(f"--{name}", type=float, default=None)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    given = {k: v for k, v in vars(a).items() if k not in ("listen", "to") and v is not None}
    stats = serve(_addr(a.listen), _addr(a.to), Impairment(**given))
    print(json.dumps({"stats": stats}), flush=True)


if __name__ == "__main__":
    main()
