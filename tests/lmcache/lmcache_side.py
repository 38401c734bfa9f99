"""One side of the LMCache tests, as a process of its own: LMCache's own engine on the CPU
with the KVCS connector as its remote tier, and SmolLM2 on transformers computing the KV.

Reads one JSON command per line on stdin, answers one JSON line on stdout:

The process holds one LMCache engine per entry of its setup's ``engines`` (name -> the
connector's ``extra_config``); a command names its engine (``"engine"``).

- ``{"op": "store", "tokens": [...]}``: prefill, hand the KV to LMCache (``store``), wait for
  the connector's puts; answers the KV's SHA-256 and the last pass's logits.
- ``{"op": "retrieve", "tokens": [...], "decode": bool}``: ``lookup`` then ``retrieve``
  through LMCache; answers how many tokens came back, their KV's SHA-256, and with
  ``decode`` the decode check: the next-token logits computed on the retrieved cache and
  those of a local prefill in the same pass shapes. LMCache's local CPU tier is emptied
  first, so the chunks come from the relay every time.
- ``{"op": "puts", "n": N}``: a new connector of the engine's configuration, on the engine's
  own loop, takes N chunks of random bytes as LMCache's RemoteBackend hands them over (one
  ``put`` each, all submitted at once from this thread), then gets them back in one
  ``batched_get``; answers whether each came back bit for bit and the connector's stats.

Every answer carries the engine's connector's ``stats`` (sessions opened, puts).

Prefills run in two passes, the full chunks then the rest, so that the retrieving side
(which computes the rest on top of the retrieved chunks) repeats the storing side's last pass
and its logits can be compared bit for bit.
"""

from __future__ import annotations

import os

# Before anything imports LMCache: no usage reports from a test.
os.environ["LMCACHE_TRACK_USAGE"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.setdefault("PYTHONHASHSEED", "0")

import asyncio
import dataclasses
import hashlib
import json
import sys
import time
from typing import Any

import numpy as np
import torch
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.metadata import LMCacheMetadata
from lmcache_harness import MARK

from relay.peers.engines import Engine, load_engine

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


class ArrayConnector(GPUConnectorInterface):
    """LMCache's GPU connector over CPU tensors: K and V as [layers][tokens][heads][dim]
    (``k=``, ``v=`` of store/retrieve) <-> a chunk's KV_2LTD buffer."""

    def __init__(self, layers: int, width: int) -> None:
        self.layers, self.width = layers, width

    def from_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kw: Any) -> None:
        t, n = memory_obj.tensor, end - start
        assert t is not None
        t[0, :, :n] = kw["k"][:, start:end].reshape(self.layers, n, self.width)
        t[1, :, :n] = kw["v"][:, start:end].reshape(self.layers, n, self.width)

    def to_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kw: Any) -> None:
        t, n = memory_obj.tensor, end - start
        assert t is not None
        shape = kw["k"][:, start:end].shape
        kw["k"][:, start:end] = t[0, :, :n].reshape(shape)
        kw["v"][:, start:end] = t[1, :, :n].reshape(shape)

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kw: Any) -> None:
        for m, s, e in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(m, s, e, **kw)

    def batched_to_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kw: Any) -> None:
        for m, s, e in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(m, s, e, **kw)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.layers, num_tokens, self.width])


def lmcache_config(chunk: int, extra: dict[str, Any]) -> LMCacheEngineConfig:
    """The config both sides use: a small local CPU tier (each process starts empty) and the
    KVCS plugin as the remote tier."""
    return LMCacheEngineConfig.from_dict({
        "chunk_size": chunk, "local_cpu": True, "max_local_cpu_size": 0.2,
        "save_unfull_chunk": False, "remote_serde": "naive",
        "remote_storage_plugins": ["kvcs"],
        "extra_config": {
            "remote_storage_plugin.kvcs.module_path": "relay.peers.lmcache.connector",
            "remote_storage_plugin.kvcs.class_name": "KvcsConnectorAdapter",
            **extra}})


class Side:
    def __init__(self, engine: Engine, chunk: int, extra: dict[str, Any], name: str) -> None:
        self.model, self.chunk = engine, chunk
        e = engine
        self.shape = (e.layers, e.kv_heads, e.head_dim)  # type: ignore[attr-defined]
        layers, heads, dim = self.shape
        md = LMCacheMetadata(model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
                             local_worker_id=0, kv_dtype=torch.float32,
                             kv_shape=(layers, 2, chunk, heads, dim), chunk_size=chunk)
        self.lmc: LMCacheEngine = LMCacheEngineBuilder.get_or_create(
            name, lmcache_config(chunk, extra), md, ArrayConnector(layers, heads * dim),
            lambda *a: None, lambda *a: None)
        self.lmc.post_init()

    def connector(self) -> Any:
        backend = self.lmc.storage_manager.storage_backends["RemoteBackend-kvcs"]
        return backend.connection._connector, backend.loop

    def puts(self, n: int) -> dict[str, Any]:
        """N chunks through a connector of their own: put as RemoteBackend puts, get back.
        Its chunks have 2 layers (49 KiB), not the model's 30: what is tested is how puts
        share a session, and the test relay runs on aioquic."""
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.storage_backend.connector import CreateConnector

        storage = self.lmc.storage_manager
        cpu = storage.storage_backends["LocalCPUBackend"]
        _, loop = self.connector()
        backend = storage.storage_backends["RemoteBackend-kvcs"]
        md = dataclasses.replace(backend.metadata,
                                 kv_shape=(2, *backend.metadata.kv_shape[1:]))
        conn = asyncio.run_coroutine_threadsafe(_create(
            CreateConnector, backend.remote_url, loop, cpu, backend.config, md),
            loop).result(30)
        c = conn._connector
        rng = np.random.default_rng(37)
        keys = [CacheEngineKey(MODEL, 1, 0, 0xC0FFEE00 + i, torch.float32) for i in range(n)]
        objs, shas = [], []
        for _ in keys:
            obj = cpu.allocate(c.meta_shapes[0], c.meta_dtypes[0], c.meta_fmt)
            view = np.frombuffer(obj.byte_array, np.uint8, count=c.full_chunk_size_bytes)
            view[:] = rng.integers(0, 256, view.size, dtype=np.uint8)
            objs.append(obj)
            shas.append(hashlib.sha256(view).hexdigest())
        started = time.monotonic()
        futures = [asyncio.run_coroutine_threadsafe(c.put(k, o), loop)
                   for k, o in zip(keys, objs, strict=True)]
        for f in futures:
            f.result(30)
        asyncio.run_coroutine_threadsafe(c.drain(), loop).result(30)
        put_s = time.monotonic() - started
        got = asyncio.run_coroutine_threadsafe(c.batched_get(keys), loop).result(30)
        same = [g is not None and hashlib.sha256(np.frombuffer(
            g.byte_array, np.uint8, count=c.full_chunk_size_bytes)).hexdigest() == h
            for g, h in zip(got, shas, strict=True)]
        stats = dict(c.stats)
        asyncio.run_coroutine_threadsafe(c.close(), loop).result(30)
        for o in [*objs, *(g for g in got if g is not None)]:
            o.ref_count_down()
        return {"bit_for_bit": same, "put_s": put_s, "puts_stats": stats}

    def prefill(self, tokens: list[int], split: int) -> tuple[Any, np.ndarray]:
        cache = self.model.new_cache()
        logits = self.model.run(tokens[:split], cache) if split else None
        if split < len(tokens):
            logits = self.model.run(tokens[split:], cache)
        assert logits is not None
        return cache, logits

    def store(self, tokens: list[int]) -> dict[str, Any]:
        split = len(tokens) // self.chunk * self.chunk
        cache, logits = self.prefill(tokens, split)
        k, v = (torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1, 3)))
                for a in self.model.kv_of(cache))
        started = time.monotonic()
        self.lmc.store(tokens, k=k, v=v)
        conn, loop = self.connector()
        asyncio.run_coroutine_threadsafe(conn.drain(), loop).result(60)
        return {"kv_sha256": _sha(k[:, :split], v[:, :split]), **_logits("logits", logits),
                "put_s": time.monotonic() - started}

    def retrieve(self, tokens: list[int], decode: bool) -> dict[str, Any]:
        layers, heads, dim = self.shape
        # LMCache keeps what it got from the relay in its local CPU tier: emptied, so that
        # every retrieve asks the relay
        self.lmc.storage_manager.clear(["LocalCPUBackend"])
        t0 = time.monotonic()
        hit = int(self.lmc.lookup(tokens))
        t1 = time.monotonic()
        k = torch.zeros(layers, len(tokens), heads, dim)
        v = torch.zeros_like(k)
        got = int(self.lmc.retrieve(tokens, k=k, v=v).sum()) if hit else 0
        out: dict[str, Any] = {"lookup": hit, "retrieved": got,
                               "kv_sha256": _sha(k[:, :got], v[:, :got]),
                               "lookup_s": t1 - t0, "retrieve_s": time.monotonic() - t1}
        if got and decode:
            cache = self.model.cache_from_kv(k[:, :got].permute(0, 2, 1, 3).numpy(),
                                             v[:, :got].permute(0, 2, 1, 3).numpy())
            tail = tokens[got:] or tokens[-1:]
            out.update(_logits("logits", self.model.run(tail, cache)))
            out.update(_logits("local", self.prefill(tokens, got)[1]))
        return out


async def _create(make: Any, *args: Any) -> Any:
    return make(*args)  # on the loop: the connector's session lives there


def _logits(name: str, logits: np.ndarray) -> dict[str, Any]:
    return {f"{name}_sha256": hashlib.sha256(logits.tobytes()).hexdigest(),
            f"{name}_token": int(np.argmax(logits))}


def _sha(k: torch.Tensor, v: torch.Tensor) -> str:
    h = hashlib.sha256(k.contiguous().numpy().tobytes())
    h.update(v.contiguous().numpy().tobytes())
    return h.hexdigest()


def answer(**fields: Any) -> None:
    """One line on stdout, marked: LMCache's own log lines may go there too."""
    print(MARK + json.dumps(fields), flush=True)


def main() -> None:
    setup = json.loads(sys.argv[1])
    model = load_engine("transformers")
    sides = {name: Side(model, setup["chunk"], extra, name)
             for name, extra in setup["engines"].items()}
    answer(ready=True, track_usage=os.environ.get("LMCACHE_TRACK_USAGE"),
           do_not_track=os.environ.get("DO_NOT_TRACK"))
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        side = sides[cmd["engine"]]
        started = time.monotonic()
        if cmd["op"] == "puts":
            got = side.puts(cmd["n"])
        elif cmd["op"] == "store":
            got = side.store(cmd["tokens"])
        else:
            got = side.retrieve(cmd["tokens"], cmd.get("decode", False))
        answer(**got, seconds=time.monotonic() - started, stats=side.connector()[0].stats)
    for name in sides:
        LMCacheEngineBuilder.destroy(name)


if __name__ == "__main__":
    main()
