"""Overload (docs/relay.md, "Overload"): a Track's ingest waits for its least-behind live
subscriber, so a publisher that sends faster than the relay forwards is held back instead
of the subscriber falling behind; a subscriber that stalls is not waited for long.

aioquic only (tests/conftest.py): on qh3 the relay's ingest never waits (its credit does not
follow reads; waiting would stop the publisher's stream)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    PushedTrack,
    client,
    drain,
    fetch_objects,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
)

from relay.core import ingest_pacing
from relay.core.relay import RelayOptions
from relay.moqt.primitives import FullTrackName
from relay.service import RunningRelay
from relay.session import SessionConfig, Subscription
from relay.transport import QuicSettings

KiB = 1024
OBJECT = 32 * KiB
# The subscriber's receive side holds little (4 events, 256 KiB of QUIC windows), and the
# relay's send buffer 1 MiB: a publication of 4 MiB outgrows the 1 MiB bound on what the
# relay may queue for the subscriber unless the publisher is held back.
LIMITS = RelayOptions(ingest_hold_bytes=256 * KiB, max_backlog_bytes=1024 * KiB)
SMALL_READER = {"config": SessionConfig(receive_queue=4, done_linger=1.0),
                "settings": QuicSettings(max_data=256 * KiB, max_stream_data=128 * KiB)}
GROUPS, PER_GROUP = 16, 8  # 128 Objects of 32 KiB


async def _track_and_small_subscriber(r: RunningRelay, name: FullTrackName
                                      ) -> tuple[PushedTrack, Subscription]:
    """A Track pushed to ``r`` and a live subscription to it with a small receive side."""
    track = await push_track(await client(r), name, layers=GROUPS)
    s = await client(r, **SMALL_READER)  # type: ignore[arg-type]
    sub = await asyncio.wait_for(s.subscribe(name.namespace, name.name, live_params()),
                                 TIMEOUT)
    return track, sub


async def _publish_all(track: PushedTrack) -> None:
    for g in range(GROUPS):
        await track.group(g, group_payloads(g, PER_GROUP, size=OBJECT))
    await track.end()


async def test_a_publisher_faster_than_the_subscriber_is_held_back_and_nothing_is_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The subscriber reads nothing until the relay's ingest has waited for it (or has taken
    in the whole publication), then everything: it gets every Object and the Track's end;
    without the wait its queue passes max_backlog_bytes and it is ended TOO_FAR_BEHIND."""
    # generous, so a busy test machine cannot make the relay give up on the subscriber
    monkeypatch.setattr(ingest_pacing, "PATIENCE", TIMEOUT)
    r = await relay_at(tmp_path, options=LIMITS)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        track, sub = await _track_and_small_subscriber(r, name)
        publishing = asyncio.ensure_future(_publish_all(track))
        counters = r.relay.counters
        try:
            async with asyncio.timeout(TIMEOUT):
                # the Track's changes wake this; a wait that began is seen on the next look
                while counters.ingest_waits == 0:
                    if counters.objects_received == GROUPS * PER_GROUP:
                        break  # all taken in without waiting (what must not happen)
                    t = r.relay.tracks.get(name)
                    if t is None:
                        await asyncio.sleep(0.01)
                    else:
                        await t.wait_change(0.05)
            async with asyncio.timeout(TIMEOUT):
                got = await drain(sub)
            await asyncio.wait_for(publishing, TIMEOUT)
        finally:
            publishing.cancel()
        assert r.relay.counters.too_far_behind == 0
        assert got.done is not None and got.done.status == 0x2, got.done  # TRACK_ENDED
        assert got.objects == track.sent and not got.duplicates
        assert r.relay.counters.ingest_waits >= 1
    finally:
        await r.close()


async def test_a_stalled_subscriber_does_not_hold_the_publisher(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The only subscriber reads nothing: the relay waits for it at most PATIENCE, then
    takes the whole publication into its cache and ends that subscriber TOO_FAR_BEHIND.
    Were it waited for without end, the publication would never be complete."""
    monkeypatch.setattr(ingest_pacing, "PATIENCE", 0.25)  # the default's second is wall time
    r = await relay_at(tmp_path, options=LIMITS)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        track, stalled = await _track_and_small_subscriber(r, name)
        await asyncio.wait_for(_publish_all(track), TIMEOUT)
        _resp, cached = await fetch_objects(await client(r), name)
        assert cached == track.sent
        assert r.relay.counters.ingest_waits >= 1  # it was waited for, first
        async with asyncio.timeout(TIMEOUT):
            slow = await drain(stalled)
        assert slow.done is not None and slow.done.status == 0x5  # TOO_FAR_BEHIND
        assert r.relay.counters.too_far_behind == 1
    finally:
        await r.close()
