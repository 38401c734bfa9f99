"""A real engine's time to first token (TTFT): SmolLM2-135M on Hugging Face transformers
(PyTorch, CPU) continuing a prompt from its KV cache fetched through the relay, against
recomputing the prompt locally, over prompts of several lengths: where does fetching start
to beat recomputing?

For each length L, the producer (the same engine, in this process) prefills a prompt of L
tokens plus an 8-token tail and publishes the L tokens' cache (float32, blocks of 16) to a
relay in its own process (``kvcs relay``, qh3, as deployed). The consumer then, as `kvcs
fetch --engine transformers --generate` does: discovers and FETCHes the cache (completed),
builds a DynamicCache from it (load), and computes the tail on top to get the first token
(first decode step). Each fetch is a new session, handshake included. Sources: the relay's
memory, and its LMDB (the relay restarted before each such fetch, so nothing is in memory;
one session opened and closed first, so the row is not about the process's first
connection). The baseline, measured in the same run: a local
full prefill of the whole prompt (its first token). Every figure is the median of
BENCH_ENGINE_REPEAT runs (default 3); the consumer's first token is checked against the
local one each time.

Lengths: BENCH_ENGINE_TOKENS (comma-separated, default 32,128,256,512,1024,2048). Run:
``python -m benchmarks engine``; it prints the table, writes results/engine.json and draws
results/engine.png (TTFT vs prompt length, per source).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._report import pyplot, report
from benchmarks.bench_relay import _RelayProcess
from relay.peers.connect import RelayAccess, connect
from relay.peers.engines import Engine, load_engine
from relay.peers.engines.generate import continue_prompt
from relay.peers.engines.streaming import prefill_and_publish
from relay.peers.publisher import PublishOptions
from relay.peers.subscriber import RetrieveOptions, retrieve
from relay.transport.backend import set_default_backend

B, TAIL, BACKEND = 16, 8, "qh3"
SCOPE_KEY = bytes(range(32))
TEXT = ("The KV cache of a prompt is computed once by a prefill node and reused by every "
        "decode node that needs the same prefix; a relay caches it layer by layer, in memory "
        "and on disk, so that a consumer fetches it instead of computing it again. ")


def _prompt(engine: Engine, n: int) -> list[int]:
    ids = engine.encode(TEXT)
    return (ids * (n // len(ids) + 1))[:n]


def _relay(tmp: Path, nbytes: int) -> _RelayProcess:
    return _RelayProcess(tmp, 1200, BACKEND, extra=(
        "--memory-bytes", str(4 * nbytes + (64 << 20)),
        "--lmdb-bytes", str(4 * nbytes + (256 << 20))))


async def _fetched(engine: Engine, relay: _RelayProcess, toks: list[int], first: int
                   ) -> dict[str, float]:
    d = engine.descriptor(B)
    t0 = time.perf_counter()
    res = await asyncio.wait_for(retrieve(RetrieveOptions(
        RelayAccess((relay.url,), ca_file=relay.certfile), d, SCOPE_KEY, toks,
        mode="completed")), 600)
    fetch_ms = (time.perf_counter() - t0) * 1000
    assert res.exit_code == 0, res.report["decisions"]
    c = continue_prompt(engine, toks, 1, k=res.k, v=res.v, fetch_ms=fetch_ms)
    assert c.tokens == [first], (c.tokens, first)
    return c.timings_ms


async def _warm(relay: _RelayProcess) -> None:
    """One session to a freshly started relay first, so that the LMDB rows measure reads
    from LMDB, not the relay process's first connection."""
    session = await connect(relay.url, RelayAccess((relay.url,), ca_file=relay.certfile))
    await asyncio.wait_for(session.aclose(), 10)


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


async def _length(engine: Engine, n: int, repeat: int) -> list[list[Any]]:
    toks = _prompt(engine, n + TAIL)
    local_runs = [continue_prompt(engine, toks, 1).timings_ms for _ in range(repeat)]
    local = _median(local_runs)
    first = continue_prompt(engine, toks, 1).tokens[0]
    kv_bytes = 2 * engine.layers * engine.kv_heads * n * engine.head_dim * 4
    memory: list[dict[str, float]] = []
    lmdb: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with _relay(Path(tmp), kv_bytes) as relay:
            access = RelayAccess((relay.url,), ca_file=relay.certfile)
            await asyncio.wait_for(prefill_and_publish(
                engine, engine.descriptor(B), SCOPE_KEY, toks, access,
                options=PublishOptions(confirm="fetch")), 600)
            for _ in range(repeat):
                memory.append(await _fetched(engine, relay, toks, first))
        for _ in range(repeat):  # restarted each time: the cache is only in LMDB
            async with _relay(Path(tmp), kv_bytes) as relay:
                await _warm(relay)
                lmdb.append(await _fetched(engine, relay, toks, first))
    mib = round(kv_bytes / (1 << 20), 2)
    base = local["ttft_ms"]
    rows: list[list[Any]] = [[n + TAIL, n, mib, "local prefill (baseline)", 0.0, 0.0,
                              round(local["first_decode_ms"], 1), round(base, 1), 1.0]]
    for name, runs in (("relay memory", memory), ("relay LMDB", lmdb)):
        m = _median(runs)
        rows.append([n + TAIL, n, mib, name, round(m["fetch_ms"], 1), round(m["load_ms"], 2),
                     round(m["first_decode_ms"], 1), round(m["ttft_ms"], 1),
                     round(m["ttft_ms"] / base, 3)])
    return rows


def _plot(rows: list[list[Any]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for source, style in (("local prefill (baseline)", "k--o"), ("relay memory", "s-"),
                          ("relay LMDB", "^-")):
        pts = [(r[0], r[7]) for r in rows if r[3] == source]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=source, markersize=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens (cached prefix + 8)")
    ax.set_ylabel("time to first token, ms")
    ax.set_title("SmolLM2-135M, transformers on CPU: fetched KV cache vs local prefill")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"(plot written to {path})")


def main() -> None:
    lengths = [int(x) for x in os.environ.get(
        "BENCH_ENGINE_TOKENS", "32,128,256,512,1024,2048").split(",")]
    repeat = int(os.environ.get("BENCH_ENGINE_REPEAT", "3"))
    set_default_backend(client=BACKEND)
    t0 = time.perf_counter()
    engine = load_engine("transformers")
    load_s = time.perf_counter() - t0
    engine.run(_prompt(engine, 64), engine.new_cache())  # warm-up: first-call set-up costs
    rows: list[list[Any]] = []
    for n in lengths:
        rows += asyncio.run(_length(engine, n // B * B, repeat))
    beats = [r[1] for r in rows if r[3] == "relay memory" and r[8] < 1.0]
    out = report("engine", ["prompt_tokens", "cached_tokens", "kv_MiB", "source", "fetch_ms",
                            "load_ms", "first_decode_ms", "ttft_ms", "ttft_vs_local"], rows,
                 {"engine": "transformers", "model": "SmolLM2-135M-Instruct (GGUF Q4_1, "
                  "float32 weights and KV cache)", "block_tokens": B, "tail_tokens": TAIL,
                  "quic_backend": BACKEND, "repeat": repeat,
                  "torch_threads": _threads(), "model_load_s": round(load_s, 1),
                  "fetch_from_memory_beats_local_at_cached_tokens": beats,
                  "note": "ttft = fetch (discovery + FETCH + verification) + load (KVCS arrays "
                          "-> DynamicCache) + first decode step (the tail on top); local = "
                          "a full prefill of the prompt; medians; relay in its own process"})
    print(f"fetching from the relay's memory beat recomputing at {beats or 'no'} cached tokens "
          f"(of {lengths})")
    _plot(rows, out.with_suffix(".png"))


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


if __name__ == "__main__":
    main()
