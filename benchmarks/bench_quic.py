"""The QUIC core, raw: one stream between two processes on loopback, per QUIC library and
datagram size, MB/s and CPU seconds per GB on each side (docs/performance.md, "The QUIC core:
aiopquic evaluated").

Each stack (``BACKEND[:CC][@SIZE]``, benchmarks/_raw_net.py) runs _raw_net.py's two children on
127.0.0.1, as bench_net's ``raw-*`` rows do over a lab path: the server writes ``nbytes`` on one
unidirectional stream in 1 MiB writes, the client reads it to its FIN. MB/s = bytes / the
client's seconds from dialling to the FIN (handshake included); CPU per GB = each process's own
CPU seconds over the transfer (every thread: aiopquic's network thread counts) per 10^9 bytes.
qh3 and aioquic go through relay.transport (their ``max_datagram_size``: 1200 or ``auto``, the
route's MTU: 16384 on loopback); aiopquic is picoquic alone (``@basic``: its path-MTU probing,
``@blocked``: none). The stacks run interleaved in rotating order, best of N (MB/s: the
highest; CPU: the lowest), and every figure is also given as a ratio to the baseline stack
measured in the same run, which is what to compare on this shared, noisy machine.

Run: ``python -m benchmarks quic`` (env: BENCH_QUIC_MB=64, BENCH_QUIC_REPEATS=3,
BENCH_QUIC_STACKS=..., BENCH_QUIC_BASELINE=qh3@auto).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks._report import report
from relay.transport import ensure_self_signed

MiB = 1 << 20
STACKS = ("qh3@1200", "qh3@auto", "aioquic@1200", "aioquic@auto", "aiopquic@blocked",
          "aiopquic@basic", "aiopquic:cubic@basic")
_RAW = str(Path(__file__).resolve().parent / "_raw_net.py")
_CERTS = Path(os.environ.get("TMPDIR", "/tmp")) / "kvcs-bench-certs"
_TIMEOUT = 120.0


async def _line(stream: asyncio.StreamReader, what: str) -> dict[str, Any]:
    line = await asyncio.wait_for(stream.readline(), _TIMEOUT)
    if not line:
        raise RuntimeError(f"{what} exited without output")
    out: dict[str, Any] = json.loads(line)
    return out


async def one(stack: str, nbytes: int) -> dict[str, float]:
    """One transfer: MB/s and each side's CPU seconds per GB."""
    certs = ensure_self_signed(_CERTS)
    py = sys.executable
    server = await asyncio.create_subprocess_exec(
        py, _RAW, "serve", "127.0.0.1", stack, str(nbytes), str(certs.certfile),
        str(certs.keyfile), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdin is not None
        port = (await _line(server.stdout, f"{stack} server"))["port"]
        client = await asyncio.create_subprocess_exec(
            py, _RAW, "get", f"moqt://127.0.0.1:{port}/", str(certs.certfile), stack,
            str(nbytes), str(_TIMEOUT), stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(client.communicate(), _TIMEOUT + 10)
        got = json.loads(out)
        if got.get("bytes") != nbytes or "seconds" not in got:
            raise RuntimeError(f"{stack}: {got}")
        sent = await _line(server.stdout, f"{stack} server")
        server.stdin.close()
        await asyncio.wait_for(server.wait(), 10)
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
    gb = nbytes / 1e9
    return {"mbps": nbytes / got["seconds"] / 1e6, "recv_cpu_gb": got["cpu"] / gb,
            "send_cpu_gb": sent["cpu"] / gb}


async def _run(stacks: list[str], nbytes: int, repeats: int) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in stacks}
    for i in range(repeats):
        k = i % len(stacks)
        for stack in stacks[k:] + stacks[:k]:  # rotating order: load hits all alike
            r = await one(stack, nbytes)
            runs[stack].append(r)
            print(f"  {stack:22} {r['mbps']:7.1f} MB/s  recv {r['recv_cpu_gb']:5.2f} s/GB  "
                  f"send {r['send_cpu_gb']:5.2f} s/GB", flush=True)
    return runs


def main(argv: list[str] | None = None) -> None:
    nbytes = int(os.environ.get("BENCH_QUIC_MB", "64")) * MiB
    repeats = int(os.environ.get("BENCH_QUIC_REPEATS", "3"))
    stacks = os.environ.get("BENCH_QUIC_STACKS", ",".join(STACKS)).split(",")
    base = os.environ.get("BENCH_QUIC_BASELINE", "qh3@auto")
    if base not in stacks:
        stacks.insert(0, base)
    runs = asyncio.run(_run(stacks, nbytes, repeats))
    best = {s: {"mbps": max(r["mbps"] for r in rs),
                "recv": min(r["recv_cpu_gb"] for r in rs),
                "send": min(r["send_cpu_gb"] for r in rs),
                "median_mbps": statistics.median(r["mbps"] for r in rs)}
            for s, rs in runs.items()}
    b = best[base]
    rows = [[s, nbytes // MiB, round(v["mbps"], 1), round(v["median_mbps"], 1),
             round(v["recv"], 2), round(v["send"], 2), round(v["mbps"] / b["mbps"], 2),
             round(v["recv"] / b["recv"], 2), round(v["send"] / b["send"], 2)]
            for s, v in best.items()]
    report("quic", ["stack", "MiB", "MB/s", "median MB/s", "recv CPU s/GB", "send CPU s/GB",
                    f"MB/s : {base}", f"recv CPU : {base}", f"send CPU : {base}"], rows,
           extra={"baseline": base, "repeats": repeats, "runs": runs,
                  "note": "one stream, two processes, 127.0.0.1; best of N interleaved "
                          "runs (MB/s highest, CPU lowest); ratios within this run"})


if __name__ == "__main__":
    main()
