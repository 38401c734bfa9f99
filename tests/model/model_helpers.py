"""Shared pieces of the model tests: an in-process relay on 127.0.0.1, publish a model's
prefill through it and retrieve the cache back with the subscriber library."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relay.kvcs.descriptor import Descriptor
from relay.peers.connect import RelayAccess
from relay.peers.subscriber import Retrieval, RetrieveOptions, retrieve
from relay.service import RelayConfig, RunningRelay, start_relay

TIMEOUT = 30.0
SCOPE_KEY = bytes(range(32))


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
