"""Shared pieces of the peers tests: an in-process relay on 127.0.0.1 and small synthetic
publications."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relay.kvcs.descriptor import Descriptor
from relay.kvcs.plan import PublicationPlan
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens
from relay.peers.connect import RelayAccess
from relay.peers.publisher import PublishOptions, publish_plan
from relay.service import RelayConfig, RunningRelay, start_relay
from relay.transport.tls import KEY_NAME

TIMEOUT = 20.0
SCOPE_KEY = bytes(range(32))
LAYERS, HEADS, DIM, B = 4, 2, 8, 4


async def relay_at(data_dir: Path, tls_of: RunningRelay | None = None, *,
                   upstream: Sequence[str] = (), memory_bytes: int = 64 << 20,
                   upstream_idle_timeout: float = RelayConfig.upstream_idle_timeout
                   ) -> RunningRelay:
    """``tls_of``: reuse that relay's certificate, so one CA file trusts both.
    ``upstream_idle_timeout`` also bounds each dial: a test whose upstream never answers
    gives a short one instead of waiting out the default at every dial."""
    cert = key = None
    if tls_of is not None:
        cert, key = tls_of.certfile, tls_of.certfile.parent / KEY_NAME
    cfg = RelayConfig(listen_port=0, data_dir=data_dir, memory_bytes=memory_bytes,
                      lmdb_bytes=64 << 20, cert=cert, key=key, upstream=list(upstream),
                      upstream_insecure=True, upstream_idle_timeout=upstream_idle_timeout)
    return await start_relay(cfg)


def access(*relays: RunningRelay) -> RelayAccess:
    return RelayAccess(tuple(r.url for r in relays), ca_file=relays[0].certfile)


@dataclass
class Cache:
    descriptor: Descriptor
    k: np.ndarray
    v: np.ndarray
    tokens: list[int]


def cache(blocks: int = 6, seed: int = 1, layers: int = LAYERS, dtype: str = "float16"
          ) -> Cache:
    d = synthetic_descriptor(layers, HEADS, DIM, dtype, block_tokens=B)
    k, v = synthetic_kv(layers, HEADS, DIM, blocks * B, dtype, seed)
    return Cache(d, k, v, synthetic_tokens(blocks * B, seed))


def plan(c: Cache, segment_blocks: Sequence[int] | None = None, **kw: object
         ) -> PublicationPlan:
    return PublicationPlan(c.k, c.v, c.descriptor, SCOPE_KEY, c.tokens,
                           segment_blocks=segment_blocks, **kw)  # type: ignore[arg-type]


@asynccontextmanager
async def announced(p: PublicationPlan, *relays: RunningRelay, confirm: str = "fetch"
                    ) -> AsyncIterator[None]:
    """``p`` published and confirmed, its publisher still connected inside the block:
    NAMESPACE is only sent for a namespace that is announced."""
    hold, confirmed = asyncio.Event(), asyncio.Event()
    pub = asyncio.ensure_future(publish_plan(p, access(*relays), PublishOptions(
        hold=hold, confirmed=confirmed, confirm=confirm)))
    try:
        await asyncio.wait_for(confirmed.wait(), TIMEOUT)
        yield
    finally:
        hold.set()
        await asyncio.wait_for(pub, TIMEOUT)
