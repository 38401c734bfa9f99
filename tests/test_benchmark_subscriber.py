"""benchmarks/_subscriber.py: bench_relay's subscriber reports when its last Object
arrived, not when its session had closed (QUIC's closing period once counted in every MB/s
of bench_relay, against a moq-rs figure that stops at the last frame)."""

from __future__ import annotations

import asyncio
import os
import struct
import time
from pathlib import Path

import pytest
from relay_helpers import TIMEOUT, client, make_ns, push_track, relay_at

from benchmarks import _subscriber
from relay.moqt.primitives import FullTrackName
from relay.session import MoqtSession
from relay.transport.backend import default_backend


async def test_the_end_is_the_last_objects_arrival_not_the_sessions_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closing: list[float] = []
    aclose = MoqtSession.aclose

    async def timed_aclose(self: MoqtSession) -> None:  # when the close began
        closing.append(time.time())
        await aclose(self)

    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        pub = await client(r)
        track = await push_track(pub, name, layers=1)
        subscribed = asyncio.Event()
        monkeypatch.setattr(MoqtSession, "aclose", timed_aclose)
        task = asyncio.create_task(_subscriber.run(
            r.url, str(r.certfile), "/".join(f.hex() for f in name.namespace),
            name.name.decode(), 3, 1200, default_backend("client"), ready=subscribed.set))
        await asyncio.wait_for(subscribed.wait(), TIMEOUT)
        await track.group(0, [struct.pack("<d", time.time()) + os.urandom(100)
                              for _ in range(3)])
        result = await asyncio.wait_for(task, TIMEOUT)
        assert result["bytes"] == 3 * 108
        assert len(closing) == 1
        assert result["end"] <= closing[0], (result, closing)
        assert result["close_s"] > 0
        monkeypatch.undo()
        await pub.aclose()
    finally:
        await r.close()
