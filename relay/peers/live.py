"""Retrieval during production (kvcs-draft 5.2, MOQT-PROFILE 15.2 steps 3-4).

Manifest: SUBSCRIBE "manifest.cose" (then "manifest") with Next Object and a fill of
Relative Start 1, so the current version comes on the fill and later ones live. Data: each
track of each reused segment with Next Object and a fill of Absolute Start {0, 0}, the
exactly-once pattern. Segments are subscribed as manifest versions announce them.

Completion is the reassembly's: every wanted block of every layer verified, and no further
segment expected (manifest track ended, or a segment that does not match the prompt). A data
subscription that ends (PUBLISH_DONE) before that leaves its blocks missing for recovery. A
SUBSCRIBE refused with DOES_NOT_EXIST means the publisher left and the relay cannot
subscribe upstream: that track is FETCHed instead (15.2 step 5).

``kvcs fetch`` ends here too when the publication it FETCHed is still being produced: what
a track already holds is not asked again, its fill starts at the first block it lacks (the
exactly-once pattern from there on).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from relay.kvcs.track_names import MANIFEST, MANIFEST_COSE
from relay.moqt.codes import ObjectStatus, RequestErrorCode
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.session import (
    MoqtSession,
    ReceivedObject,
    RequestRejected,
    Subscription,
    SubscriptionDone,
)

from .completed import PublicationGone, fetch_track
from .state import RetrievalState, Target


def data_params(fill_timeout: int | None = None, start: tuple[int, int] = (0, 0)) -> Params:
    return Params(location_filter=LocationFilter.next_object(),
                  fill=Params(location_filter=LocationFilter.absolute_start(*start),
                              fill_timeout=fill_timeout))


def first_missing(state: RetrievalState, target: Target, track: str) -> tuple[int, int] | None:
    """(layer, block) of the first wanted block ``track`` lacks (None: it has them all).
    A FETCH cut short mid-layer holds that layer's first blocks: they are not asked again."""
    for g in range(state.descriptor.layers):
        for b in range(target.blocks):
            if not target.reasm.has(track, g, b):
                return g, b
    return None


def manifest_params(fill_timeout: int | None = None) -> Params:
    return Params(location_filter=LocationFilter.next_object(),
                  fill=Params(location_filter=LocationFilter.relative_start(1),
                              fill_timeout=fill_timeout))


async def _subscribe_manifest(session: MoqtSession, state: RetrievalState
                              ) -> tuple[str, Subscription]:
    assert state.namespace is not None and state.verifier is not None
    names = [MANIFEST_COSE, MANIFEST]
    for name in names:
        try:
            sent = time.monotonic()
            sub = await session.subscribe(state.namespace.fields, name.encode(),
                                          manifest_params(state.fill_timeout_ms()))
            state.note_rtt(time.monotonic() - sent)
        except RequestRejected as e:
            if e.code == RequestErrorCode.DOES_NOT_EXIST:
                continue
            raise
        return name, sub
    raise PublicationGone("the relay cannot subscribe to this publication's manifest")


def on_manifest_event(state: RetrievalState, name: str, ev: object) -> list[Target]:
    """One event of a manifest subscription into ``state``; the segments it adds."""
    if isinstance(ev, ReceivedObject):
        if ev.status == ObjectStatus.END_OF_TRACK:
            state.manifest_final = True
            state.bump()
        elif ev.status == ObjectStatus.NORMAL and ev.object_id == 0:
            return state.on_manifest(name, ev.group, ev.payload)
    elif isinstance(ev, SubscriptionDone):
        state.manifest_final = True
        state.bump()
    return []


async def await_listing(session: MoqtSession, url: str, state: RetrievalState,
                        timeout: float) -> None:
    """--require-cose during production: the FETCHed Objects are ahead of the manifest.
    Follow the manifest track until a signed version lists them all, the track ends, or
    ``timeout`` passes (kvcs-draft 5.4: never wait indefinitely); what is still unlisted
    then stays unusable."""
    state.decide("await-listing", relay=url, unlisted=len(state.unlisted))
    name, sub = await _subscribe_manifest(session, state)
    try:
        async with asyncio.timeout(timeout):
            async for ev in sub:
                on_manifest_event(state, name, ev)
                if not state.unlisted or state.manifest_final:
                    return
    except TimeoutError:
        state.decide("listing-timeout", relay=url, unlisted=len(state.unlisted))
    finally:
        with contextlib.suppress(Exception):
            sub.cancel()


class LiveRetrieval:
    def __init__(self, session: MoqtSession, url: str, state: RetrievalState,
                 stall_timeout: float) -> None:
        self.session = session
        self.url = url
        self.state = state
        self.stall_timeout = stall_timeout
        self.tasks: set[asyncio.Task[Any]] = set()
        self.subs: list[Subscription] = []
        self.failure: BaseException | None = None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = task.exception()
        self.state.bump()

    async def run(self) -> None:
        name, msub = await _subscribe_manifest(self.session, self.state)
        self.subs.append(msub)
        self._spawn(self._manifest(name, msub))
        # Targets already known (recovery on another relay) are subscribed at once.
        for target in list(self.state.targets.values()):
            self._start(target)
        try:
            while not self.state.complete:
                if self.failure is not None:
                    raise self.failure
                if all(t.done() for t in self.tasks):
                    break
                if not await self.state.wait_progress(self.stall_timeout):
                    self.state.decide("stalled", relay=self.url,
                                      after_ms=round(self.stall_timeout * 1000))
                    break
            if self.failure is not None and not self.state.complete:
                raise self.failure
        finally:
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            for s in self.subs:
                with contextlib.suppress(Exception):
                    s.cancel()

    def _start(self, target: Target) -> None:
        if target.reasm.complete:
            return
        for track in target.tracks:
            start = first_missing(self.state, target, track)
            if start is not None:
                self._spawn(self._data(target, track, start))

    async def _manifest(self, name: str, sub: Subscription) -> None:
        async for ev in sub:
            for target in on_manifest_event(self.state, name, ev):
                self._start(target)

    async def _data(self, target: Target, track: str, start: tuple[int, int]) -> None:
        """One data track from Location ``start`` on: the fill up to now, then live."""
        state = self.state
        assert state.namespace is not None
        try:
            sent = time.monotonic()
            sub = await self.session.subscribe(state.namespace.fields, track.encode(),
                                               data_params(state.fill_timeout_ms(), start))
            state.note_rtt(time.monotonic() - sent)
        except RequestRejected as e:
            if e.code != RequestErrorCode.DOES_NOT_EXIST:
                raise
            state.decide("fetch-instead-of-subscribe", relay=self.url, track=track)
            await fetch_track(self.session, self.url, state, target, track, start[0],
                              state.descriptor.layers - 1)
            return
        self.subs.append(sub)
        async for ev in sub:
            if isinstance(ev, ReceivedObject) and ev.status == ObjectStatus.NORMAL:
                state.on_object(self.url, target, track, ev.group, ev.object_id, ev.payload)
