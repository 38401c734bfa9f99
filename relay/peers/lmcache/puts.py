"""Puts on the connector's one session: pipelined, confirmed in batches.

A put is one publication (mapping.py): PUBLISH of its two tracks and PUBLISH_NAMESPACE, all
three in flight at once, then its Objects; it returns once they are queued in QUIC, so the
next chunk's requests and Objects follow without waiting on this one's confirmation. One
confirmer asks TRACK_STATUS of every put written but not yet confirmed, all at
once, until each track's Largest Object is its End of Track (the relay holds the whole chunk;
the same test a lookup makes): first when the relay has acknowledged everything the session
sent, or ``CONFIRM_FIRST`` after the put was written if that comes first, then backing off.
Then the put is over: its namespace is withdrawn (the relay lists a pushed Track's namespace
on its own until LMDB holds it), its request streams end, and its reference on LMCache's
buffer is released.

Until then the put holds a reference on LMCache's buffer (``ref_count_up``) and the session's
handler answers the relay's FETCHes of the chunk from it (MOQT-PROFILE 15.1 step 6), without a
copy. At most ``MAX_IN_FLIGHT`` puts are unconfirmed at once: each holds three request streams
at the relay and a chunk of LMCache's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relay.moqt.codes import PublishDoneCode
from relay.moqt.primitives import FullTrackName, Location, TrackNamespace
from relay.peers.errors import Unconfirmed
from relay.peers.publisher import RelayPush
from relay.peers.serving import PublishedTracks
from relay.session import MoqtSession, RequestRejected

from .chunks import ChunkPlan
from .link import RelayLink

log = logging.getLogger("kvcs.lmcache")
MAX_IN_FLIGHT = 8
# A written put's first TRACK_STATUS, then again while the relay still takes the chunk in,
# backing off: about the time what QUIC still queues of it takes to go out, then longer
CONFIRM_FIRST, CONFIRM_MAX = 0.01, 0.1


@dataclass
class PutStats:
    published: int = 0  # puts whose Objects were all queued
    confirmed: int = 0
    failed: int = 0
    skipped: int = 0  # already held by the relay, or already in flight


class ChunkServer(PublishedTracks):
    """The session's handler: the chunks in flight, answered from LMCache's buffers."""

    def forget(self, namespace: TrackNamespace, tracks: list[str]) -> None:
        for t in tracks:
            self.tracks.pop(FullTrackName(namespace, t.encode()), None)


@dataclass
class _Put:
    plan: ChunkPlan
    push: RelayPush
    tracks: list[str]
    release: Callable[[], None]  # gives LMCache's buffer back
    deadline: float  # for its confirmation, from when it was written
    ends: dict[str, Location] = field(default_factory=dict)  # End of Track per track
    wait: float = CONFIRM_FIRST  # until the next TRACK_STATUS
    next_check: float = 0.0
    asked: bool = False  # a TRACK_STATUS went out
    over: asyncio.Event = field(default_factory=asyncio.Event)


class ChunkPuts:
    def __init__(self, link: RelayLink, server: ChunkServer, timeout: float) -> None:
        self.link = link
        self.server = server
        self.timeout = timeout
        self.stats = PutStats()
        self._in_flight: dict[bytes, _Put] = {}  # by Publication ID: written or being written
        self._written: list[_Put] = []  # to confirm
        self._freed = asyncio.Event()  # a put ended: its place in the window is free
        self._confirmer: asyncio.Task[None] | None = None

    def in_flight(self, pub_id: bytes) -> bool:
        return pub_id in self._in_flight

    async def put(self, session: MoqtSession, plan: ChunkPlan, hold: Callable[[], None],
                  release: Callable[[], None]) -> None:
        """Publish ``plan`` on ``session``; returns once its Objects are queued. ``hold`` and
        ``release`` take and give back a reference on the buffer the plan reads."""
        pub_id = plan.namespace.pub_id
        deadline = time.monotonic() + self.timeout
        while len(self._in_flight) >= MAX_IN_FLIGHT:  # the window is full: wait, bounded
            self._freed.clear()
            await asyncio.wait_for(self._freed.wait(), max(0.0, deadline - time.monotonic()))
        if pub_id in self._in_flight:
            self.stats.skipped += 1
            return
        hold()
        p = _Put(plan, RelayPush(self.link.settings.relay_url, session),
                 [plan.manifest_track, *plan.track_names(0)], release, deadline)
        self._in_flight[pub_id] = p
        try:
            await self._start(p)
            await self._produce(p)
        except Exception as e:
            self._end(p, e)
            return
        except BaseException as e:  # cancelled: the caller's bound, or the loop's end
            self._end(p, e)
            raise
        now = time.monotonic()
        p.deadline = now + self.timeout
        # asked then at the latest: what QUIC still queues of it goes out meanwhile
        p.next_check = now + CONFIRM_FIRST
        self.stats.published += 1
        self._written.append(p)
        if self._confirmer is None or self._confirmer.done():
            self._confirmer = asyncio.ensure_future(self._confirm_loop())

    async def _start(self, p: _Put) -> None:
        """The three requests at once: one round trip, not three."""
        s, fields = p.push.session, p.plan.namespace.fields
        got = await asyncio.gather(*(s.publish(fields, t.encode()) for t in p.tracks),
                                   s.publish_namespace(fields), return_exceptions=True)
        for t, g in zip(p.tracks, got, strict=False):
            if not isinstance(g, BaseException):
                p.push.served[t] = g
        if not isinstance(got[-1], BaseException):
            p.push.announced = got[-1]
        failed = next((g for g in got if isinstance(g, BaseException)), None)
        if failed is not None:
            raise failed

    async def _produce(self, p: _Put) -> None:
        ns = p.plan.namespace.fields
        for obj in p.plan:
            self.server.wrote(ns, obj)  # served from here on, until confirmed
            await p.push.write(obj)
            if obj.ends_track:
                p.ends[obj.track] = Location(obj.group + 1, 0)

    async def _confirm_loop(self) -> None:
        """TRACK_STATUS of the written puts' tracks, every put due for a check in one batch,
        all in flight together; a put not held yet is asked again later, backing off."""
        while self._written:
            now = time.monotonic()
            due = [p for p in self._written if p.next_check <= now]
            if not due:
                # no event says when the relay has taken a chunk in: it is polled, and asked
                # at once when QUIC has nothing of ours unacknowledged any more (the last
                # put's Objects are all at the relay) instead of after the first wait
                wait = min(p.next_check for p in self._written) - now
                fresh = [p for p in self._written if not p.asked]
                if fresh and await fresh[-1].push.session.conn.drain(wait):
                    for p in fresh:
                        p.next_check = 0.0
                    continue
                # not drained in time, or the session is gone (drain returns at once)
                await asyncio.sleep(max(0.0, min(p.next_check for p in self._written)
                                        - time.monotonic()))
                continue
            for p in due:
                p.asked = True
            held = await asyncio.gather(*(self._held(p) for p in due))
            now = time.monotonic()
            for p, ok in zip(due, held, strict=True):
                if ok is True:
                    self._end(p, None)
                elif isinstance(ok, BaseException) or now > p.deadline:
                    self._end(p, ok if isinstance(ok, BaseException) else Unconfirmed(
                        f"the relay holds part of it after {self.timeout:g} s"))
                else:
                    p.wait = min(p.wait * 2, CONFIRM_MAX)
                    p.next_check = now + p.wait

    async def _held(self, p: _Put) -> bool | BaseException:
        s, fields = p.push.session, p.plan.namespace.fields
        try:
            got = await asyncio.wait_for(asyncio.gather(
                *(s.track_status(fields, t.encode()) for t in p.tracks)), self.timeout)
        except RequestRejected:
            return False  # not there yet
        except Exception as e:
            return e
        return all(ok.params.largest_object == p.ends.get(t)
                   for t, ok in zip(p.tracks, got, strict=True))

    def _end(self, p: _Put, error: BaseException | None) -> None:
        """The put is over (confirmed, or failed): its requests end, LMCache's buffer goes
        back, its place in the window is free."""
        if p.over.is_set():
            return
        p.over.set()
        if p in self._written:
            self._written.remove(p)
        self._in_flight.pop(p.plan.namespace.pub_id, None)
        self.server.forget(p.plan.namespace.fields, p.tracks)
        if p.push.announced is not None:
            p.push.announced.withdraw()
        for t, served in p.push.served.items():
            if t not in p.ends:
                # a put cut short: its tracks end as a failure, not as complete
                p.push.session.spawn(_quietly(served.done(PublishDoneCode.INTERNAL_ERROR)),
                                     "lmcache-put-cut")
        p.release()
        if error is None:
            self.stats.confirmed += 1
        else:
            self.stats.failed += 1
            log.warning("KVCS put of %s failed: %s", p.plan.namespace.pub_id.hex(),
                        error or type(error).__name__)
            if not isinstance(error, RequestRejected | Unconfirmed):
                # no answer, or the session broke: the next use dials again
                self.link.drop(p.push.session, f"put: {error or type(error).__name__}")
        self._freed.set()

    async def drain(self) -> None:
        """Wait until every put in flight is confirmed or failed."""
        while self._in_flight:
            await asyncio.wait([asyncio.ensure_future(p.over.wait())
                                for p in list(self._in_flight.values())])

    def abort(self) -> None:
        """The connector closes: puts in flight end unconfirmed."""
        for p in list(self._in_flight.values()):
            self._end(p, ConnectionAbortedError("connector closed"))
        if self._confirmer is not None:
            self._confirmer.cancel()


async def _quietly(aw: Any) -> None:
    with contextlib.suppress(Exception):
        await aw
