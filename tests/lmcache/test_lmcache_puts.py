"""The connector's puts (relay/peers/lmcache/puts.py) on a real relay, without LMCache."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from relay_helpers import relay_at

import relay.peers.lmcache.puts as puts_module
from relay.peers.lmcache.chunks import ChunkPlan
from relay.peers.lmcache.link import RelayLink
from relay.peers.lmcache.mapping import EngineShape, KeyMapper
from relay.peers.lmcache.puts import ChunkPuts, ChunkServer
from relay.peers.lmcache.settings import parse_settings

SHAPE = EngineShape(layers=3, kv_heads=2, head_dim=4, chunk_tokens=8)
KEY = bytes(range(32))


async def test_a_put_is_asked_about_once_the_relay_acknowledged_all_of_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first TRACK_STATUS goes out when the relay has acknowledged everything the session
    sent, not after a fixed wait: with that wait made a minute, a put is confirmed at once."""
    monkeypatch.setattr(puts_module, "CONFIRM_FIRST", 60.0)
    r = await relay_at(tmp_path / "relay")
    link: RelayLink | None = None
    puts: ChunkPuts | None = None
    try:
        (tmp_path / "scope.key").write_bytes(KEY)
        settings = parse_settings(f"kvcs://127.0.0.1:{r.port}/?ca={r.certfile}&scope_key="
                                  f"{tmp_path / 'scope.key'}", None)
        server = ChunkServer()
        link = RelayLink(settings, server)
        puts = ChunkPuts(link, server, settings.timeout)
        session = await asyncio.wait_for(link.session(), 10)
        assert session is not None
        buffer = np.frombuffer(bytes(range(256)) * (2 * 3 * 8 * 2 * 4 * 4 // 256), np.uint8)
        plan = ChunkPlan(buffer, KeyMapper(KEY, SHAPE).names("m", 1, 0, "float", chunk_hash=1),
                         KEY)
        released = asyncio.Event()
        async with asyncio.timeout(5):
            await puts.put(session, plan, lambda: None, released.set)
            await released.wait()  # the put is over
        assert (puts.stats.published, puts.stats.confirmed, puts.stats.failed) == (1, 1, 0)
    finally:
        if puts is not None:
            puts.abort()
        if link is not None:
            await link.close()
        await r.close()
