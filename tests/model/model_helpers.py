"""Shared pieces of the model tests: an in-process relay on 127.0.0.1, publish a model's
prefill through it and retrieve the cache back with the subscriber library."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from relay.kvcs.descriptor import Descriptor
from relay.model.llama import KVCache, Llama
from relay.peers.connect import RelayAccess
from relay.peers.subscriber import Retrieval, RetrieveOptions, retrieve
from relay.service import RelayConfig, RunningRelay, start_relay

TIMEOUT = 30.0
SCOPE_KEY = bytes(range(32))


def chunked_prefill(model: Llama, tokens: Sequence[int] | np.ndarray, chunk: int,
                    cache: KVCache | None = None) -> tuple[KVCache, np.ndarray]:
    """Prefill in passes of ``chunk`` tokens (the last one may be shorter), as an engine
    that prefills a long prompt in chunks would."""
    cache = cache if cache is not None else KVCache()
    toks = np.asarray(tokens, dtype=np.int64)
    logits = np.empty(0, dtype=np.float32)
    for s in range(0, len(toks), chunk):
        logits = model.forward(toks[s:s + chunk], cache)
    return cache, logits


async def relay_at(data_dir: Path) -> RunningRelay:
    cfg = RelayConfig(listen_port=0, data_dir=data_dir, memory_bytes=128 << 20,
                      lmdb_bytes=128 << 20)
    return await start_relay(cfg)


def access(r: RunningRelay) -> RelayAccess:
    return RelayAccess((r.url,), ca_file=r.certfile)


async def fetch_back(r: RunningRelay, d: Descriptor, tokens: Sequence[int], **kw: Any
                     ) -> Retrieval:
    res = await asyncio.wait_for(retrieve(RetrieveOptions(
        access(r), d, SCOPE_KEY, list(tokens), mode="completed", **kw)), TIMEOUT)
    assert res.exit_code == 0, res.report
    return res
