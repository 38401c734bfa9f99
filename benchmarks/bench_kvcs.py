"""KVCS end to end through one relay: time to the first usable layer and to the full cache,
live (subscribed before production, layers paced like a prefill) vs completed (FETCH after
production), for a synthetic cache of 32 KiB Objects (8 heads x 16 tokens x 128 dims, fp16).

Default 8 layers x 8 blocks (4 MiB of K+V); BENCH_KVCS_FULL=1 runs the full 32 layers x
256 blocks shape (512 MiB). BENCH_KVCS_LAYER_MS sets the emulated prefill time per layer
(default 20). The relay runs in this process (relay.service.start_relay) on 127.0.0.1.
Run: ``python -m benchmarks kvcs``.
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


async def _run(layers: int, blocks: int, layer_ms: float) -> list[list[Any]]:
    d = synthetic_descriptor(layers, HEADS, DIM, "float16", block_tokens=B)
    k, v = synthetic_kv(layers, HEADS, DIM, blocks * B, "float16", seed=1)
    tokens = synthetic_tokens(blocks * B, seed=1)
    rows: list[list[Any]] = []
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
                layer_ms=layer_ms, confirm="fetch"))
            produced = (time.monotonic() - produce_start) * 1000
            res = await asyncio.wait_for(live, 600)
            shift = (produce_start - consumer_start) * 1000
            rows.append(_row("live", res.report, shift, produced, summary.bytes))

            opts = RetrieveOptions(access, d, SCOPE_KEY, tokens, mode="completed",
                                   publications=[(plan.namespace, None)])
            res = await asyncio.wait_for(retrieve(opts), 600)
            rows.append(_row("completed", res.report, 0.0, produced, summary.bytes))
        finally:
            await running.close()
    return rows


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
    rows = asyncio.run(_run(layers, blocks, layer_ms))
    report("kvcs", ["mode", "first_layer_ms", "full_cache_ms", "production_ms", "objects",
                    "published_bytes", "MiB/s"], rows,
           {"layers": layers, "blocks": blocks, "object_bytes": HEADS * B * DIM * 2,
            "layer_ms": layer_ms,
            "note": "live times count from the start of production, completed times from "
                    "the start of the FETCH retrieval"})


if __name__ == "__main__":
    main()
