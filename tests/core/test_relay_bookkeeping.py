"""One long-lived session's bookkeeping stays flat: every finished request (TRACK_STATUS
answered or refused, a completed FETCH) is forgotten on both ends (issue 11, item 8)."""

from __future__ import annotations

import contextlib
import gc
import tracemalloc
from pathlib import Path

from relay_helpers import client, group_payloads, make_ns, push_track, relay_at

from relay.moqt.primitives import FullTrackName
from relay.session import MoqtSession, RequestRejected
from relay.transport import RecvStream

ROUNDS = 100  # x 3 requests


def _streams() -> int:
    return sum(isinstance(o, RecvStream) for o in gc.get_objects())


async def _round(c: MoqtSession, name: FullTrackName, i: int) -> None:
    await c.track_status(name.namespace, name.name)
    with contextlib.suppress(RequestRejected):
        await c.track_status(name.namespace, b"nothing-%d" % i)
    resp = await c.fetch(name.namespace, name.name)
    await resp.collect()


async def test_a_long_lived_session_stays_flat(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        t = await push_track(await client(r), name, layers=1)
        await t.group(0, group_payloads(0, 2, size=100))
        c = await client(r)
        for i in range(ROUNDS):  # warm-up: caches, dict sizes, counters' keys
            await _round(c, name, i)
        gc.collect()
        streams = _streams()
        tracemalloc.start(1)
        try:
            for i in range(ROUNDS, ROUNDS + ROUNDS // 2):  # tracemalloc's own warm-up
                await _round(c, name, i)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for i in range(2 * ROUNDS, 3 * ROUNDS):
                await _round(c, name, i)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert _streams() - streams <= 4  # finished requests' streams are forgotten
        # (Request-ID reuse detection stays bounded too: tests/moqt/test_moqt_state.py.)
        # before: about 2.5 kB per request; what is left is QUIC's own (aioquic's set of
        # finished stream IDs) and the scheduler's jitter
        assert grown < 600 * ROUNDS, f"{grown} bytes for {3 * ROUNDS} requests"
    finally:
        await r.close()
