"""Library-level: publish a synthetic cache through an in-process relay, retrieve it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from peers_helpers import SCOPE_KEY, TIMEOUT, access, cache, plan, relay_at

from relay.peers.publisher import PublishOptions, publish_plan
from relay.peers.subscriber import RetrieveOptions, retrieve


async def test_publish_then_fetch_bit_exact(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    try:
        c = cache()
        p = plan(c, [4, 2])
        summary = await asyncio.wait_for(publish_plan(p, access(r), PublishOptions()), TIMEOUT)
        assert summary.confirmed == "fetch"
        res = await asyncio.wait_for(retrieve(RetrieveOptions(
            access(r), c.descriptor, SCOPE_KEY, c.tokens, mode="completed",
            publications=[(p.namespace, None)])), TIMEOUT)
        assert res.exit_code == 0, res.report
        assert res.k.tobytes() == np.ascontiguousarray(c.k).tobytes()
        assert res.v.tobytes() == np.ascontiguousarray(c.v).tobytes()
    finally:
        await r.close()
