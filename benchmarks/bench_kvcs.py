"""KVCS end to end through one relay: time to the first usable layer and to the full cache,
live (subscribed before production, layers paced like a prefill) vs completed (FETCH after
production), for a synthetic cache of 32 KiB Objects (8 heads x 16 tokens x 128 dims, fp16).

Default 8 layers x 8 blocks (4 MiB of K+V); BENCH_KVCS_FULL=1 runs the full 32 layers x
256 blocks shape (512 MiB). BENCH_KVCS_LAYER_MS sets the emulated prefill time per layer
(default 20). The relay runs as its own process (``kvcs relay``, as deployed) on 127.0.0.1,
once per QUIC backend (both peers on the same backend, in this process).

The real shape (results/kvcs_real_shape.json): a completed Llama-3-8B-shaped publication (32
layers, 8 KV heads, head dim 128, bfloat16, BENCH_KVCS_REAL_TOKENS tokens: 4096 = 512 MiB;
default 512 = 64 MiB) published by `kvcs publish` and retrieved by `kvcs fetch`, real
processes: seconds until the last layer is usable, each command's wall time, and the peak
RSS of the publisher, the consumer and the relay.

Run: ``python -m benchmarks kvcs``. Besides the table and results/kvcs.json, it draws
results/kvcs.png: per-layer usable time vs layer, live and completed, beside the time each
layer was produced (qh3).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._proc import peak_rss, run_measured
from benchmarks._report import pyplot, report
from benchmarks.bench_relay import _RelayProcess
from relay.kvcs.plan import PublicationPlan
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens
from relay.peers.connect import RelayAccess
from relay.peers.publisher import PublishOptions, publish_plan
from relay.peers.subscriber import RetrieveOptions, retrieve
from relay.transport.backend import set_default_backend

KVCS = [sys.executable, "-m", "relay.cli"]

HEADS, DIM, B = 8, 128, 16
SCOPE_KEY = bytes(range(32))


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _namespace_subscriptions(metrics_port: int) -> float:
    """SUBSCRIBE_NAMESPACE requests the relay accepted so far (from its /metrics)."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kvcs_relay_requests_total{")
               and 'type="subscribe_namespace"' in line and 'result="ok"' in line)


def _relay(tmp: Path, backend: str, nbytes: int, metrics_port: int) -> _RelayProcess:
    return _RelayProcess(tmp, "auto", backend, extra=(
        "--memory-bytes", str(4 * nbytes + (64 << 20)),
        "--lmdb-bytes", str(4 * nbytes + (256 << 20)),
        "--metrics-listen", f"127.0.0.1:{metrics_port}"))


async def _run(layers: int, blocks: int, layer_ms: float, backend: str
               ) -> tuple[list[list[Any]], dict[str, list[float | None]]]:
    set_default_backend(client=backend)
    d = synthetic_descriptor(layers, HEADS, DIM, "float16", block_tokens=B)
    k, v = synthetic_kv(layers, HEADS, DIM, blocks * B, "float16", seed=1)
    tokens = synthetic_tokens(blocks * B, seed=1)
    rows: list[list[Any]] = []
    series: dict[str, list[float | None]] = {}
    produced_at: list[float] = []
    mport = _free_tcp_port()
    with tempfile.TemporaryDirectory() as tmp:
        async with _relay(Path(tmp), backend, k.nbytes, mport) as running:
            access = RelayAccess((running.url,), ca_file=running.certfile)
            plan = PublicationPlan(k, v, d, SCOPE_KEY, tokens)
            opts = RetrieveOptions(access, d, SCOPE_KEY, tokens, mode="live",
                                   discovery_window=60.0, stall_timeout=60.0)
            before = await asyncio.to_thread(_namespace_subscriptions, mport)
            consumer_start = time.monotonic()
            live = asyncio.ensure_future(retrieve(opts))
            # give the consumer's SUBSCRIBE_NAMESPACEs a head start over the publisher
            async with asyncio.timeout(30):
                while await asyncio.to_thread(_namespace_subscriptions, mport) <= before:
                    await asyncio.sleep(0.005)
            produce_start = time.monotonic()
            summary = await publish_plan(plan, access, PublishOptions(
                layer_ms=layer_ms, confirm="fetch",
                on_layer=lambda _s, _g: produced_at.append(time.monotonic())))
            series["production"] = [round((t - produce_start) * 1000, 3) for t in produced_at]
            produced = (time.monotonic() - produce_start) * 1000
            res = await asyncio.wait_for(live, 600)
            shift = (produce_start - consumer_start) * 1000
            first_produced = series["production"][0] if series["production"] else 0.0
            rows.append(_row(backend, "live", res.report, shift, produced, summary.bytes,
                             first_produced))
            series["live"] = _usable(res.report, shift)

            # An engine retrieves into KV buffers it allocated once; a fresh process's first
            # touch of new memory is the host's to price (on these VMs 0.1-1.3 s per 512
            # MiB, run to run): the same FETCH again into the same arrays shows the rest.
            held: list[tuple[np.ndarray, np.ndarray]] = []

            def engine_buffer(shape: tuple[int, int, int, int]
                              ) -> tuple[np.ndarray, np.ndarray]:
                if not held:
                    held.append((np.zeros(shape, d.dtype), np.zeros(shape, d.dtype)))
                return held[0]

            for mode in ("completed", "completed, buffer reused"):
                opts = RetrieveOptions(access, d, SCOPE_KEY, tokens, mode="completed",
                                       publications=[(plan.namespace, None)],
                                       allocate=engine_buffer)
                res = await asyncio.wait_for(retrieve(opts), 600)
                rows.append(_row(backend, mode, res.report, 0.0, produced, summary.bytes,
                                 None))
                series[mode] = _usable(res.report, 0.0)
    return rows, series


async def _real_shape(tokens_n: int, backend: str, tmp: Path) -> list[Any]:
    """A completed Llama-3-8B-shaped cache through real processes, as a user runs them:
    `kvcs publish --synthetic` (confirm=fetch), then `kvcs fetch --out`, through a `kvcs
    relay`. Seconds until the last layer is usable (the fetch's report), each command's wall
    time, and each process's peak RSS (wait4's for the peers, VmHWM for the relay)."""
    spec = f"32,8,128,{tokens_n},bfloat16,1"
    d = synthetic_descriptor(32, 8, 128, "bfloat16", block_tokens=B)
    (tmp / "desc.json").write_bytes(d.canonical_json())
    (tmp / "tokens.json").write_text(json.dumps(synthetic_tokens(tokens_n, 1)))
    (tmp / "scope.key").write_bytes(SCOPE_KEY)
    cache = 2 * 32 * 8 * tokens_n * 128 * 2
    peer = ["--scope-key", str(tmp / "scope.key"), "--quic-backend", backend, "--quiet"]
    async with _relay(tmp / "relay", backend, cache, _free_tcp_port()) as running:
        at = ["--relay", running.url, "--ca", str(running.certfile)]
        pub = await asyncio.to_thread(run_measured, [
            *KVCS, "publish", *at, *peer, "--synthetic", spec], 1800)
        assert pub.returncode == 0, pub.stderr
        got = await asyncio.to_thread(run_measured, [
            *KVCS, "fetch", *at, *peer, "--namespace", pub.stdout.strip(),
            "--descriptor", str(tmp / "desc.json"), "--tokens", str(tmp / "tokens.json"),
            "--out", str(tmp / "fetched.kv"), "--report", str(tmp / "fetch.json")], 1800)
        assert got.returncode == 0, got.stderr
        assert running.proc is not None
        relay_rss = peak_rss(running.proc.pid)
    rep = json.loads((tmp / "fetch.json").read_text())
    last_s = rep["all_layers_ms"] / 1000
    mb = 1e6
    return [backend, tokens_n, cache, round(last_s, 2), round(got.wall_s, 2),
            round(got.wall_s - last_s, 2), round(pub.wall_s, 2),
            round(pub.peak_rss / mb), round(pub.peak_rss / cache, 2),
            round(got.peak_rss / mb), round(got.peak_rss / cache, 2), round(relay_rss / mb),
            round(1.2 * cache / mb + 150)]


def _usable(rep: dict[str, Any], shift_ms: float) -> list[float | None]:
    return [None if x["usable_ms"] is None else round(x["usable_ms"] - shift_ms, 3)
            for x in rep["layers"]]


def _plot(series: dict[str, list[float | None]], path: Path, layer_ms: float) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {"production": ("k--", "layer produced (handed to QUIC)"),
              "live": ("o-", "usable, live (from start of production)"),
              "completed": ("s-", "usable, completed (from start of FETCH)")}
    for name, (style, label) in styles.items():
        ys = series.get(name, [])
        pts = [(g, y) for g, y in enumerate(ys) if y is not None]
        if pts:
            ax.plot([g for g, _ in pts], [y for _, y in pts], style, label=label,
                    markersize=3)
    ax.set_xlabel("layer")
    ax.set_ylabel("ms")
    ax.set_title(f"KVCS per-layer usable time ({layer_ms:g} ms per layer of prefill)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"(plot written to {path})")


def _row(backend: str, mode: str, rep: dict[str, Any], shift_ms: float, produced_ms: float,
         published_bytes: int, first_produced_ms: float | None) -> list[Any]:
    assert rep["exit_code"] == 0, rep["decisions"]
    first = rep["first_layer_ms"] - shift_ms
    full = rep["all_layers_ms"] - shift_ms
    mib_s = rep["bytes"] / (1 << 20) / (full / 1000) if full > 0 else 0.0
    lag = "" if first_produced_ms is None else round(first - first_produced_ms, 1)
    return [backend, mode, round(first, 1), round(full, 1), round(produced_ms, 1), lag,
            rep["objects_verified"], published_bytes, round(mib_s, 1)]


def main() -> None:
    full = os.environ.get("BENCH_KVCS_FULL") == "1"
    layers, blocks = (32, 256) if full else (8, 8)
    layer_ms = float(os.environ.get("BENCH_KVCS_LAYER_MS", "20"))
    real_tokens = int(os.environ.get("BENCH_KVCS_REAL_TOKENS", "4096" if full else "512"))
    rows: list[list[Any]] = []
    series: dict[str, list[float | None]] = {}
    for backend in ("aioquic", "qh3"):
        r, series = asyncio.run(_run(layers, blocks, layer_ms, backend))
        rows += r
    real: list[list[Any]] = []
    for backend in ("aioquic", "qh3"):
        with tempfile.TemporaryDirectory() as tmp:
            real.append(asyncio.run(_real_shape(real_tokens, backend, Path(tmp))))
    report("kvcs_real_shape", [
        "backend", "tokens", "cache_bytes", "last_layer_s", "fetch_wall_s",
        "fetch_wall_after_last_layer_s", "publish_wall_s", "publish_peak_MB",
        "publish_peak_x_cache", "fetch_peak_MB", "fetch_peak_x_cache", "relay_peak_MB",
        "peer_bound_MB"], real,
        {"note": "kvcs publish --synthetic 32,8,128,TOKENS,bfloat16,1 (confirm=fetch), then "
                 "kvcs fetch --out, as processes through a kvcs relay process; peak RSS "
                 "from wait4 (peers) and VmHWM (relay); peer_bound = 1.2 x cache + 150 MB "
                 "(issue 23 item 7); targets for 4096 tokens: last layer <= 4 s, fetch "
                 "wall within 1 s of it (item 6)"})
    out = report("kvcs", ["backend", "mode", "first_layer_ms", "full_cache_ms",
                          "production_ms", "first_layer_after_production_ms", "objects",
                          "published_bytes", "MiB/s"], rows,
                 {"layers": layers, "blocks": blocks, "object_bytes": HEADS * B * DIM * 2,
                  "layer_ms": layer_ms, "real_shape_tokens": real_tokens,
                  "note": "relay in its own process; live times count from the start of "
                          "production, completed times from the start of the FETCH "
                          "retrieval; first_layer_after_production_ms = first usable layer "
                          "minus the time layer 0 was handed to QUIC (target <= 50)",
                  "per_layer_ms_qh3": series})
    _plot(series, out.with_suffix(".png"), layer_ms)


if __name__ == "__main__":
    main()
