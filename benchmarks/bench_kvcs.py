"""KVCS end to end through one relay: time to the first usable layer and to the full cache,
live (subscribed before production, layers paced like a prefill) vs completed (FETCH after
production), for a synthetic cache of 32 KiB Objects (8 heads x 16 tokens x 128 dims, fp16).

Default 8 layers x 8 blocks (4 MiB of K+V); BENCH_KVCS_FULL=1 runs the full 32 layers x
256 blocks shape (512 MiB). BENCH_KVCS_LAYER_MS sets the emulated prefill time per layer
(default 20). The relay runs in this process (relay.service.start_relay) on 127.0.0.1.
Run: ``python -m benchmarks kvcs``. Besides the table and results/kvcs.json, it draws
results/kvcs.png: per-layer usable time vs layer, live and completed, beside the time each
layer was produced.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._report import report
from relay.kvcs.plan import PublicationPlan
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens
from relay.peers.connect import RelayAccess
from relay.peers.publisher import PublishOptions, publish_plan
from relay.peers.subscriber import RetrieveOptions, retrieve
from relay.service import RelayConfig, start_relay

HEADS, DIM, B = 8, 128, 16
SCOPE_KEY = bytes(range(32))


async def _run(layers: int, blocks: int, layer_ms: float
               ) -> tuple[list[list[Any]], dict[str, list[float | None]]]:
    d = synthetic_descriptor(layers, HEADS, DIM, "float16", block_tokens=B)
    k, v = synthetic_kv(layers, HEADS, DIM, blocks * B, "float16", seed=1)
    tokens = synthetic_tokens(blocks * B, seed=1)
    rows: list[list[Any]] = []
    series: dict[str, list[float | None]] = {}
    produced_at: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        running = await start_relay(RelayConfig(
            listen_port=0, data_dir=Path(tmp), memory_bytes=4 * k.nbytes + (64 << 20),
            lmdb_bytes=4 * k.nbytes + (256 << 20)))
        access = RelayAccess((running.url,), ca_file=running.certfile)
        try:
            plan = PublicationPlan(k, v, d, SCOPE_KEY, tokens)
            opts = RetrieveOptions(access, d, SCOPE_KEY, tokens, mode="live",
                                   discovery_window=60.0, stall_timeout=60.0)
            consumer_start = time.monotonic()
            live = asyncio.ensure_future(retrieve(opts))
            # give the consumer's SUBSCRIBE_NAMESPACEs a head start over the publisher
            async with asyncio.timeout(30):
                while not running.relay.namespaces._listeners:
                    await asyncio.sleep(0.001)
            produce_start = time.monotonic()
            summary = await publish_plan(plan, access, PublishOptions(
                layer_ms=layer_ms, confirm="fetch",
                on_layer=lambda _s, _g: produced_at.append(time.monotonic())))
            series["production"] = [round((t - produce_start) * 1000, 3) for t in produced_at]
            produced = (time.monotonic() - produce_start) * 1000
            res = await asyncio.wait_for(live, 600)
            shift = (produce_start - consumer_start) * 1000
            rows.append(_row("live", res.report, shift, produced, summary.bytes))
            series["live"] = _usable(res.report, shift)

            opts = RetrieveOptions(access, d, SCOPE_KEY, tokens, mode="completed",
                                   publications=[(plan.namespace, None)])
            res = await asyncio.wait_for(retrieve(opts), 600)
            rows.append(_row("completed", res.report, 0.0, produced, summary.bytes))
            series["completed"] = _usable(res.report, 0.0)
        finally:
            await running.close()
    return rows, series


def _usable(rep: dict[str, Any], shift_ms: float) -> list[float | None]:
    return [None if x["usable_ms"] is None else round(x["usable_ms"] - shift_ms, 3)
            for x in rep["layers"]]


def _plot(series: dict[str, list[float | None]], path: Path, layer_ms: float) -> None:
    try:
        import matplotlib
    except ImportError:
        print("(matplotlib is not installed: no plot; it is in the `bench` extra)")
        return
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

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


def _row(mode: str, rep: dict[str, Any], shift_ms: float, produced_ms: float,
         published_bytes: int) -> list[Any]:
    assert rep["exit_code"] == 0, rep["decisions"]
    first = rep["first_layer_ms"] - shift_ms
    full = rep["all_layers_ms"] - shift_ms
    mib_s = rep["bytes"] / (1 << 20) / (full / 1000) if full > 0 else 0.0
    return [mode, round(first, 1), round(full, 1), round(produced_ms, 1),
            rep["objects_verified"], published_bytes, round(mib_s, 1)]


def main() -> None:
    full = os.environ.get("BENCH_KVCS_FULL") == "1"
    layers, blocks = (32, 256) if full else (8, 8)
    layer_ms = float(os.environ.get("BENCH_KVCS_LAYER_MS", "20"))
    rows, series = asyncio.run(_run(layers, blocks, layer_ms))
    out = report("kvcs", ["mode", "first_layer_ms", "full_cache_ms", "production_ms", "objects",
                    "published_bytes", "MiB/s"], rows,
           {"layers": layers, "blocks": blocks, "object_bytes": HEADS * B * DIM * 2,
            "layer_ms": layer_ms,
            "note": "live times count from the start of production, completed times from "
                    "the start of the FETCH retrieval",
            "per_layer_ms": series})
    _plot(series, out.with_suffix(".png"), layer_ms)


if __name__ == "__main__":
    main()
