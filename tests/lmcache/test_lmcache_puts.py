"""The connector's puts (relay/peers/lmcache/puts.py) on a real relay, without LMCache: the
chunks of one store send their requests at once and then their Objects, one chunk after the
other, in order."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_helpers import relay_at

from relay.kvcs.plan import PlannedObject
from relay.peers.lmcache.chunks import ChunkPlan
from relay.peers.lmcache.link import RelayLink
from relay.peers.lmcache.mapping import EngineShape, KeyMapper
from relay.peers.lmcache.puts import ChunkPuts, ChunkServer
from relay.peers.lmcache.settings import parse_settings
from relay.peers.publisher import RelayPush

SHAPE = EngineShape(layers=3, kv_heads=2, head_dim=4, chunk_tokens=8)
KEY = bytes(range(32))


async def test_puts_called_together_overlap_their_requests_and_keep_their_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = await relay_at(tmp_path / "relay")
    link: RelayLink | None = None
    try:
        (tmp_path / "scope.key").write_bytes(KEY)
        settings = parse_settings(f"kvcs://127.0.0.1:{r.port}/?ca={r.certfile}&scope_key="
                                  f"{tmp_path / 'scope.key'}", None)
        server = ChunkServer()
        link = RelayLink(settings, server)
        puts = ChunkPuts(link, server, settings.timeout)
        session = await asyncio.wait_for(link.session(), 10)
        assert session is not None
        seen: list[tuple[str, bytes]] = []  # (what, Publication ID), in the order done
        publish = session.publish

        async def publishing(fields: tuple[bytes, ...], track: bytes, *a: Any) -> Any:
            seen.append(("PUBLISH", fields[-1]))
            return await publish(fields, track, *a)

        write = RelayPush.write

        async def writing(push: RelayPush, obj: PlannedObject) -> None:
            seen.append(("Object", push.announced.namespace[-1] if push.announced
                         else b"?"))
            await write(push, obj)

        monkeypatch.setattr(session, "publish", publishing)
        monkeypatch.setattr(RelayPush, "write", writing)
        mapper = KeyMapper(KEY, SHAPE)
        plans = [ChunkPlan(np.frombuffer(bytes([i]) * (2 * 3 * 8 * 2 * 4 * 4), np.uint8),
                           mapper.names("m", 1, 0, "float", chunk_hash=i), KEY)
                 for i in range(3)]
        ids = [p.namespace.pub_id for p in plans]
        async with asyncio.timeout(10):
            await puts.put_many(session, [(p, lambda: None, lambda: None) for p in plans])
            await puts.drain()
        assert (puts.stats.published, puts.stats.confirmed) == (3, 3), puts.stats
        # every chunk's requests before the first chunk's Objects: their round trips overlap
        first_object = next(i for i, (what, _) in enumerate(seen) if what == "Object")
        assert sorted(pub for what, pub in seen[:first_object]) == sorted(ids * 2), seen
        # the Objects chunk after chunk, in the order the puts were called
        order = [pub for what, pub in seen if what == "Object"]
        assert order == sorted(order, key=ids.index) and set(order) == set(ids), order
    finally:
        if link is not None:
            await link.close()
        await r.close()
