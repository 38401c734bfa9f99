"""Test-only failure injection and observation for the peers' guarantees (never part of the
product):

- a tampering relay: one running relay replaces one Object with a forgery that passes every
  check of kvcs-draft 3.5 (a self-consistent header over all-zero Data), the same for every
  subscriber and FETCH, as a compromised relay would;
- a gated publisher: publishes a plan Object by Object and lets the test hold any Object
  back, to pin down what a consumer has seen when the manifest moves on;
- a record of the requests a relay receives.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from peers_helpers import TIMEOUT

sys.path.insert(0, str(Path(__file__).parents[1] / "core"))  # the relay tests' helpers
from relay_helpers import wait_cached

from relay.core.handler import RelayHandler
from relay.core.track import RelayTrack
from relay.kvcs.payload import parse_header
from relay.kvcs.plan import PlannedObject, PublicationPlan
from relay.moqt.codes import ObjectStatus
from relay.peers.connect import RelayAccess, connect
from relay.peers.publisher import RelayPush
from relay.service import RunningRelay

__all__ = ["forge", "observe_requests", "publish_gated", "tamper_relay", "wait_cached"]


def forge(payload: bytes) -> bytes:
    """Same header fields, all-zero Data, and the digest of that Data: 3.5 cannot tell."""
    h = parse_header(payload)
    zeros = bytes(h.data_length)
    return dataclasses.replace(h, data_digest=hashlib.sha256(zeros).digest()).pack() + zeros


def tamper_relay(monkeypatch: pytest.MonkeyPatch, running: RunningRelay, track: str,
                 group: int, object_id: int) -> list[bytes]:
    """From now on ``running`` caches (and forwards) a forgery of that one Object; returns
    the list the forged payloads are appended to."""
    original = RelayTrack._on_object
    forged: list[bytes] = []

    def on_object(self: RelayTrack, ev: Any, seen: set[int]) -> None:
        if self.store is running.relay.store and self.full_name.name == track.encode() \
                and (ev.group, ev.object_id) == (group, object_id) \
                and ev.status == ObjectStatus.NORMAL:
            ev = dataclasses.replace(ev, payload=forge(bytes(ev.payload)))
            forged.append(ev.payload)
        original(self, ev, seen)

    monkeypatch.setattr(RelayTrack, "_on_object", on_object)
    return forged


def observe_requests(monkeypatch: pytest.MonkeyPatch, method: str) -> list[Any]:
    """The requests in-process relays receive through ``RelayHandler.<method>`` (e.g.
    "fetch"), recorded, then served as ever."""
    seen: list[Any] = []
    serve = getattr(RelayHandler, method)

    async def recording(self: RelayHandler, req: Any) -> None:
        seen.append(req)
        await serve(self, req)

    monkeypatch.setattr(RelayHandler, method, recording)
    return seen


Gate = Callable[[PlannedObject], Awaitable[None] | None]


async def publish_gated(plan: PublicationPlan, access: RelayAccess, gate: Gate,
                        leave: asyncio.Event) -> None:
    """Publish ``plan`` to the first relay, awaiting ``gate(obj)`` before each Object, then
    stay connected (announced, answering) until ``leave`` is set."""
    push = RelayPush(access.urls[0], await connect(access.urls[0], access))
    try:
        tracks = [plan.manifest_track] + [t for s in plan.segments
                                          for t in plan.track_names(s.segment)]
        await push.start(plan.namespace, tracks)
        for obj in plan:
            waiting = gate(obj)
            if waiting is not None:
                await waiting
            await push.write(obj)
        await leave.wait()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(push.session.aclose(), TIMEOUT)
