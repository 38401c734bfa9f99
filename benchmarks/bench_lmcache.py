"""LMCache's remote tier: our relay (the KVCS connector, relay/peers/lmcache) against
LMCache's own remote server (``python -m lmcache.v1.server``, ``lm://``), same run, 127.0.0.1.

Both connectors are LMCache's RemoteConnectors, driven as LMCache's RemoteBackend drives them,
on one event loop, with the same 64 MiB of chunks: SmolLM2-135M's float32 KV shape, 256-token
chunks (11.25 MiB each), random bytes. Reported per server: put MiB/s (a store's chunks as
RemoteBackend submits them: ``batched_put`` where the connector has it, else every ``put`` at
once; ours until the relay confirmed every chunk, ``lm://`` until its socket took the bytes),
the same again under other keys (a server that has stored before: what a running relay is;
the first put also pays its process's first use of the memory it stores into),
get MiB/s (a retrieve's chunks as RemoteBackend gets them: ``batched_get`` where the
connector has it, else every ``get`` at once), get MiB/s with the chunks one after another,
the first chunk's latency (one ``get`` alone, session already up), one batched lookup of
every key, the CPU seconds of a put and of a get in this process (the connector) and in the
server (every thread: the relay's LMDB writer too, though the relay writes LMDB behind a
burst, at its first quiet moment: docs/relay.md, "Persistence"), and whether every chunk
came back bit for bit. For the relay, once per QUIC backend.
"""

from __future__ import annotations

import os

os.environ["LMCACHE_TRACK_USAGE"] = "false"  # before LMCache is imported: no usage reports
os.environ["DO_NOT_TRACK"] = "1"

import asyncio
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._proc import cpu_seconds
from benchmarks._report import report

LAYERS, KV_HEADS, HEAD_DIM, CHUNK = 30, 3, 64, 256  # SmolLM2-135M, float32
TOTAL = 64 << 20
BACKENDS = ("aioquic", "qh3")


def _engine(extra: dict[str, Any]) -> tuple[Any, Any, Any]:
    plugins = ["kvcs"] if any(k.startswith("kvcs.") for k in extra) else []
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    config = LMCacheEngineConfig.from_dict({
        "chunk_size": CHUNK, "local_cpu": True, "max_local_cpu_size": 0.5,
        "remote_serde": "naive", "remote_storage_plugins": plugins, "extra_config": extra})
    md = LMCacheMetadata(model_name="SmolLM2-135M", world_size=1, local_world_size=1,
                         worker_id=0, local_worker_id=0, kv_dtype=torch.float32,
                         kv_shape=(LAYERS, 2, CHUNK, KV_HEADS, HEAD_DIM), chunk_size=CHUNK)
    return config, md, LocalCPUBackend(config, md)


def _cpu(server_pid: int) -> tuple[float, float]:
    """CPU seconds so far of this process (the connector) and of the server, every thread."""
    return time.process_time(), cpu_seconds(server_pid)


def _cpu_since(before: tuple[float, float], server_pid: int) -> str:
    now = _cpu(server_pid)
    return f"{now[0] - before[0]:.2f} / {now[1] - before[1]:.2f}"


async def _store(c: Any, keys: list[Any], objs: list[Any]) -> None:
    """A store's chunks as RemoteBackend submits them."""
    if c.support_batched_put():
        await c.batched_put(keys, objs)
    else:
        await asyncio.gather(*(c.put(k, o) for k, o in zip(keys, objs, strict=True)))


async def _put(c: Any, keys: list[Any], objs: list[Any]) -> float:
    """Seconds to store ``objs`` under ``keys``; ours until the relay holds every chunk."""
    t0 = time.perf_counter()
    await _store(c, keys, objs)
    if hasattr(c, "drain"):
        await c.drain()
    return time.perf_counter() - t0


async def _run(url: str, extra: dict[str, Any], chunks: list[bytes], server_pid: int
               ) -> dict[str, Any]:
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.storage_backend.connector import CreateConnector

    config, md, cpu = _engine(extra)
    conn = CreateConnector(url, asyncio.get_running_loop(), cpu, config, md)
    keys = [CacheEngineKey("SmolLM2-135M", 1, 0, 0x5EED0000 + i, torch.float32)
            for i in range(len(chunks))]
    objs = []
    for data in chunks:
        obj = cpu.allocate(md.get_shapes()[0], torch.float32, conn._connector.meta_fmt)
        np.frombuffer(obj.byte_array, np.uint8, count=len(data))[:] = \
            np.frombuffer(data, np.uint8)
        objs.append(obj)
    size = sum(len(c) for c in chunks) / (1 << 20)
    c = conn._connector
    await c.exists(keys[0])  # the session / TCP connection up before timing
    cpu0 = _cpu(server_pid)
    put_s = await _put(c, keys, objs)
    put_cpu = _cpu_since(cpu0, server_pid)
    again_s = await _put(c, [CacheEngineKey("SmolLM2-135M", 1, 0, 0x5EED8000 + i, torch.float32)
                             for i in range(len(chunks))], objs)
    t0 = time.perf_counter()
    held = await conn.batched_async_contains("bench", keys)
    lookup_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    first = await c.get(keys[0])
    first_ms = (time.perf_counter() - t0) * 1000
    cpu0 = _cpu(server_pid)
    t0 = time.perf_counter()
    got = await c.batched_get(keys) if c.support_batched_get() \
        else await asyncio.gather(*(c.get(k) for k in keys))
    get_s = time.perf_counter() - t0
    get_cpu = _cpu_since(cpu0, server_pid)
    t0 = time.perf_counter()
    one_by_one = [await c.get(k) for k in keys]
    serial_s = time.perf_counter() - t0
    same = all(g is not None and bytes(np.frombuffer(g.byte_array, np.uint8,
                                                     count=len(d))) == d
               for gets in (got, one_by_one) for g, d in zip(gets, chunks, strict=True))
    same = same and first is not None and bytes(np.frombuffer(
        first.byte_array, np.uint8, count=len(chunks[0]))) == chunks[0]
    stats = dict(getattr(c, "stats", {}))
    await c.close()
    # the chunks and what the gets returned go back to LMCache's allocator (else it warns
    # of each one at exit)
    for o in [*objs, *got, *one_by_one, first]:
        if o is not None:
            o.ref_count_down()
    return {"put_mib_s": size / put_s, "put_again_mib_s": size / again_s, "get_mib_s": size / get_s,
            "serial_get_mib_s": size / serial_s, "first_chunk_ms": first_ms,
            "lookup_ms": lookup_ms, "put_cpu_s": put_cpu, "get_cpu_s": get_cpu,
            "held": held, "bit_for_bit": same,
            "sessions": stats.get("sessions_opened", "")}


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_line(proc: subprocess.Popen[str], pattern: str, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(pattern, line)
        if m:
            return m
    raise RuntimeError(f"{proc.args} did not start")


def _relay(folder: Path, backend: str) -> tuple[subprocess.Popen[str], int]:
    # BENCH_PROFILE=path: the relay runs under cProfile, into path.<backend> (as bench_relay)
    profile = os.environ.get("BENCH_PROFILE")
    profile = profile and f"{profile}.{backend}"
    proc = subprocess.Popen([sys.executable, *(("-m", "cProfile", "-o", profile) if profile
                                               else ()), "-m", "relay.cli", "relay", "--listen",
                             "127.0.0.1:0", "--data-dir", str(folder), "--metrics-listen",
                             "off", "--quic-backend", backend],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = int(_wait_line(proc, r"relay ready on moqt://127\.0\.0\.1:(\d+)/", 30)[1])
    # never block the relay on a full pipe
    subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)
    return proc, port


def _lm_server() -> tuple[subprocess.Popen[bytes], int]:
    port = _free_tcp_port()
    proc = subprocess.Popen([sys.executable, "-m", "lmcache.v1.server", "127.0.0.1",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.1)  # polling a port that is not yet listening: nothing to wait on
    raise RuntimeError("lmcache.v1.server did not start")


def _stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(15)


def main() -> None:
    chunk_bytes = 2 * LAYERS * CHUNK * KV_HEADS * HEAD_DIM * 4
    n = -(-TOTAL // chunk_bytes)
    rng = np.random.default_rng(27)
    chunks = [rng.bytes(chunk_bytes) for _ in range(n)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-lmcache-") as tmp:
        folder = Path(tmp)
        (folder / "scope.key").write_bytes(os.urandom(32))
        for backend in BACKENDS:
            relay, port = _relay(folder / backend, backend)
            try:
                r = asyncio.run(_run("plugin://kvcs", {
                    "remote_storage_plugin.kvcs.module_path": "relay.peers.lmcache.connector",
                    "remote_storage_plugin.kvcs.class_name": "KvcsConnectorAdapter",
                    "kvcs.url": f"kvcs://127.0.0.1:{port}/",
                    "kvcs.ca_file": str(folder / backend / "tls" / "cert.pem"),
                    "kvcs.scope_key_file": str(folder / "scope.key"),
                    "kvcs.quic_backend": backend, "kvcs.timeout_s": 30}, chunks, relay.pid))
            finally:
                _stop(relay)
            rows.append([f"kvcs relay ({backend})", *r.values()])
        server, port = _lm_server()
        try:
            r = asyncio.run(_run(f"lm://127.0.0.1:{port}", {}, chunks, server.pid))
        finally:
            _stop(server)
        rows.append(["lmcache.v1.server (lm://)", *r.values()])
    report("lmcache", ["server", "put MiB/s", "put again MiB/s", "get MiB/s", "get 1 by 1 MiB/s",
                       "first chunk ms", "lookup ms", "put CPU s conn / server",
                       "get CPU s conn / server", "held", "bit for bit", "sessions"], rows,
           {"chunks": n, "chunk_bytes": chunk_bytes, "total_mib": n * chunk_bytes / 2**20})


if __name__ == "__main__":
    main()
