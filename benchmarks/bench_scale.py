"""One cache over many connections: `kvcs fetch --connections C` against a `kvcs relay
--workers W`, for W x C in 1x1, 1x2, 2x1, 2x2 (docs/performance.md, "Scale").

A completed cache (Llama-3-8B-shaped: 32 layers, 8 KV heads, head dim 128, float16;
BENCH_SCALE_TOKENS tokens, default 256 = 32 MiB) is published once per relay, then FETCHed
BENCH_SCALE_REPS times (default 3) per connection count by the library's End Subscriber in
this process (as `kvcs fetch` does, without its start-up). Per row: MB/s (cache bytes over
the retrieval's wall time, best and median of the repetitions), the consumer's CPU seconds
per GB (this process, time.process_time), the relay's (every worker and the supervisor,
from /proc), and how many workers did a share of the serving (at least 20 % of the relay's
CPU of that fetch: the kernel's SO_REUSEPORT hash, not the client, puts each connection on a
worker). The baseline, measured in the same run, is 1x1: ``x_1x1`` is each row's best MB/s
over its.

Each relay worker is one process on one core, and so is the consumer: on this machine's two
cores a 2x2 row is three busy processes on two cores. docs/performance.md projects the
per-core figures to a 16-core host.

Run: ``python -m benchmarks scale`` (about two minutes).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._proc import cpu_per_gb, cpu_seconds
from benchmarks._report import report
from benchmarks.bench_relay import _RelayProcess
from relay.kvcs.plan import PublicationPlan
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens
from relay.peers.connect import RelayAccess
from relay.peers.publisher import PublishOptions, publish_plan
from relay.peers.subscriber import RetrieveOptions, retrieve
from relay.transport.backend import set_default_backend

LAYERS, HEADS, DIM, B = 32, 8, 128, 16
SCOPE_KEY = bytes(range(32))
SHAPES = ((1, 1), (1, 2), (2, 1), (2, 2))  # workers x connections; 1x1 is the baseline
BUSY_SHARE = 0.2  # a worker with this share of the relay's CPU of a fetch served part of it


class _Relay(_RelayProcess):
    """``kvcs relay --workers W`` (bench_relay's relay process), room for the cache."""

    def __init__(self, data_dir: Path, workers: int, nbytes: int, backend: str) -> None:
        super().__init__(data_dir, "auto", backend, workers=workers, extra=(
            "--memory-bytes", str(4 * nbytes + (64 << 20)),
            "--lmdb-bytes", str(4 * nbytes + (256 << 20))))
        self.nbytes = nbytes

    def cpu(self) -> list[float]:
        """CPU seconds so far of the supervisor (or lone relay) and of each worker."""
        return [cpu_seconds(p) for p in self.pids]


async def _fetch(relay: _Relay, access: RelayAccess, plan: PublicationPlan,
                 tokens: list[int], connections: int) -> dict[str, Any]:
    opts = RetrieveOptions(access, plan.descriptor, SCOPE_KEY, tokens,
                           mode="completed", publications=[(plan.namespace, None)],
                           connections=connections)
    relay_before = relay.cpu()
    cpu0, t0 = time.process_time(), time.perf_counter()
    res = await asyncio.wait_for(retrieve(opts), 300)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    relay_cpu = [a - b for a, b in zip(relay.cpu(), relay_before, strict=True)]
    rep = res.report
    assert res.exit_code == 0, rep["decisions"]
    assert res.k.tobytes() == plan.k.tobytes() and res.v.tobytes() == plan.v.tobytes()
    served = relay_cpu[1:] if relay.workers > 1 else relay_cpu
    return {"wall_s": wall, "bytes": relay.nbytes, "client_cpu_s": cpu,
            "relay_cpu_s": sum(relay_cpu),
            "workers_busy": sum(c >= BUSY_SHARE * sum(served) for c in served),
            "connections_used": len(rep["connections"])}


async def _relay_rows(backend: str, workers: int, conns: list[int], tokens_n: int, reps: int
                      ) -> list[tuple[int, int, list[dict[str, Any]]]]:
    set_default_backend(client=backend)
    d = synthetic_descriptor(LAYERS, HEADS, DIM, "float16", block_tokens=B)
    k, v = synthetic_kv(LAYERS, HEADS, DIM, tokens_n, "float16", seed=1)
    tokens = synthetic_tokens(tokens_n, seed=1)
    plan = PublicationPlan(k, v, d, SCOPE_KEY, tokens)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        async with _Relay(Path(tmp), workers, k.nbytes + v.nbytes, backend) as relay:
            access = RelayAccess((f"moqt://127.0.0.1:{relay.port}/",),
                                 ca_file=Path(tmp) / "tls" / "cert.pem")
            await asyncio.wait_for(publish_plan(plan, access, PublishOptions()), 300)
            # warm: the relay's first read of the store is not what is measured
            await _fetch(relay, access, plan, tokens, 1)
            for c in conns:
                runs = [await _fetch(relay, access, plan, tokens, c) for _ in range(reps)]
                out.append((workers, c, runs))
    return out


def _row(backend: str, workers: int, conns: int, runs: list[dict[str, Any]],
         base: float | None) -> list[Any]:
    mbs = [r["bytes"] / r["wall_s"] / 1e6 for r in runs]
    best = runs[mbs.index(max(mbs))]
    return [backend, workers, conns, round(max(mbs), 1), round(statistics.median(mbs), 1),
            round(max(mbs) / base, 2) if base else 1.0,
            round(cpu_per_gb(best["client_cpu_s"], best["bytes"]), 2),
            round(cpu_per_gb(best["relay_cpu_s"], best["bytes"]), 2),
            f"{best['workers_busy']}/{workers}", best["connections_used"]]


def main() -> None:
    tokens_n = int(os.environ.get("BENCH_SCALE_TOKENS", "256"))
    reps = int(os.environ.get("BENCH_SCALE_REPS", "3"))
    backends = os.environ.get("BENCH_SCALE_BACKENDS", "aioquic,qh3").split(",")
    rows: list[list[Any]] = []
    runs: list[dict[str, Any]] = []
    for backend in backends:
        measured: list[tuple[int, int, list[dict[str, Any]]]] = []
        for workers in sorted({w for w, _ in SHAPES}):
            conns = [c for w, c in SHAPES if w == workers]
            measured += asyncio.run(_relay_rows(backend, workers, conns, tokens_n, reps))
        base = max(r["bytes"] / r["wall_s"] / 1e6
                   for w, c, rs in measured if (w, c) == (1, 1) for r in rs)
        rows += [_row(backend, w, c, rs, None if (w, c) == (1, 1) else base)
                 for w, c, rs in measured]
        runs += [{"backend": backend, "workers": w, "connections": c, "runs": rs}
                 for w, c, rs in measured]
    report("scale", ["backend", "workers", "connections", "MB/s", "MB/s_median", "x_1x1",
                     "client_cpu_s_per_GB", "relay_cpu_s_per_GB", "workers_busy",
                     "connections_used"], rows,
           {"tokens": tokens_n, "cache_bytes": 2 * LAYERS * HEADS * tokens_n * DIM * 2,
            "reps": reps, "cores": os.cpu_count(), "load_avg_at_end": os.getloadavg(),
            "runs": runs,
            "note": "one completed cache FETCHed by the library's End Subscriber in this "
                    "process (kvcs fetch --connections C without its start-up) from kvcs "
                    "relay --workers W on 127.0.0.1, both on the backend named; MB/s = "
                    "cache bytes / the retrieval's wall time (connect, manifest, layers); "
                    "CPU per GB (of cache bytes) of the best run; workers_busy: workers with "
                    ">= 20 % of the relay's CPU of that fetch; x_1x1: best MB/s over 1x1's "
                    "on the same backend, same run"})


if __name__ == "__main__":
    main()
