"""Retrieval of completed caches (kvcs-draft 5.3, MOQT-PROFILE 15.2 step 5).

One FETCH per data track for layers a..b: Absolute Start, Group End {a, 0, b}, GROUP_ORDER
Ascending, and OBJECTID_FILTER 0..n-1 when only the first n blocks of the segment are wanted
and the relay's MAX_FILTER_RANGES allows a filter (otherwise the extra blocks are received
and discarded). The manifest is FETCHed with Relative Start 2: the last two Groups, because
a finished manifest track's Largest Object is its End of Track at {M, 0}, a Group that holds
no version (status is not carried on fetch streams), so Relative Start 1 would return nothing.

Every FETCH carries FILL_TIMEOUT = the time left before the consumer's deadline, so a relay
whose upstream is slow answers with End of Timed-Out Range instead of outwaiting us.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from relay.kvcs.track_names import MANIFEST, MANIFEST_COSE
from relay.moqt.codes import GroupOrder, ParameterType, RequestErrorCode
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.range_filter import Range, RangeFilter
from relay.session import MoqtSession, RangeMarker, ReceivedObject, RequestRejected

from .errors import PeerError
from .state import RetrievalState, Target

_ABSENT = (RequestErrorCode.DOES_NOT_EXIST, RequestErrorCode.INVALID_RANGE)


class PublicationGone(PeerError):
    """The relay knows no manifest of this publication (not cached, publisher gone)."""


async def fetch_manifest(session: MoqtSession, state: RetrievalState) -> str:
    """FETCH the latest manifest version into ``state``; return the manifest track's name.
    Raises ManifestRefused (untrusted) or PublicationGone (nothing there).

    Both manifest tracks are asked for at once, and manifest.cose is used whenever it holds
    a version (as when they were asked one after the other): a publication that signs
    nothing costs no extra round trip for its refused manifest.cose, which on a 40 ms path
    was 44 ms of a fetch's start."""
    assert state.namespace is not None
    asked = {name: asyncio.ensure_future(_manifest_versions(session, state, name))
             for name in (MANIFEST_COSE, MANIFEST)}
    try:
        for name, job in asked.items():  # manifest.cose first
            got = await job
            if got is None:
                continue
            versions, end_of_track = got
            group, payload = max(versions)
            state.on_manifest(name, group, payload)
            state.manifest_final = end_of_track
            return name
    finally:
        for job in asked.values():
            job.cancel()
        await asyncio.gather(*asked.values(), return_exceptions=True)
    raise PublicationGone("no manifest of this publication at the relay")


async def _manifest_versions(session: MoqtSession, state: RetrievalState, name: str
                             ) -> tuple[list[tuple[int, bytes]], bool] | None:
    """The versions the relay holds of manifest track ``name`` and whether the track has
    ended, or None if it holds none."""
    assert state.namespace is not None
    try:
        sent = time.monotonic()
        resp = await session.fetch(state.namespace.fields, name.encode(), Params(
            location_filter=LocationFilter.relative_start(2),
            fill_timeout=state.fill_timeout_ms()))
        state.note_rtt(time.monotonic() - sent)
        versions = [(e.group, bytes(e.payload)) async for e in resp
                    if isinstance(e, ReceivedObject) and e.object_id == 0]
    except RequestRejected as e:
        if e.code in _ABSENT:
            return None
        raise
    return (versions, resp.end_of_track) if versions else None


def objectid_filter(session: MoqtSession, target: Target) -> tuple[RangeFilter, ...]:
    if target.blocks < target.entry.blocks and session.peer_max_filter_ranges > 0:
        return (RangeFilter(ParameterType.OBJECTID_FILTER, 0, (Range(0, target.blocks - 1),)),)
    return ()


async def fetch_track(session: MoqtSession, url: str, state: RetrievalState, target: Target,
                      track: str, first: int, last: int, connection: str | None = None
                      ) -> None:
    """FETCH layers first..last of one data track into ``state``; gaps stay missing.
    ``connection`` names ``session`` in the report's per-connection counts."""
    assert state.namespace is not None
    params = Params(location_filter=LocationFilter.absolute_group_end(first, 0, last),
                    group_order=GroupOrder.ASCENDING,
                    range_filters=objectid_filter(session, target),
                    fill_timeout=state.fill_timeout_ms())
    sent = time.monotonic()
    resp = await session.fetch(state.namespace.fields, track.encode(), params)
    state.note_rtt(time.monotonic() - sent)
    async for ev in resp:
        if isinstance(ev, ReceivedObject):
            if connection is not None:
                state.carry(connection, len(ev.payload))
            state.on_object(url, target, track, ev.group, ev.object_id, ev.payload)
        elif isinstance(ev, RangeMarker):
            state.decide("unknown-range", relay=url, track=track, end=list(ev.end))


async def retrieve_completed(sessions: Sequence[MoqtSession], url: str,
                             state: RetrievalState, layers: list[int] | None = None,
                             labels: Sequence[str] | None = None) -> None:
    """FETCH every reused segment's tracks (restricted to ``layers`` if given). With several
    ``sessions`` (connections to the one relay) the layer range is cut into as many
    contiguous slices, one FETCH per track and slice, each slice on its own connection.
    ``labels`` name the sessions in the report. A slice whose connection fails leaves its
    layers missing (decision "fetch-failed"): the caller's recovery FETCHes them again."""
    wanted = sorted(layers) if layers else list(range(state.descriptor.layers))
    first, last = wanted[0], wanted[-1]
    n = max(1, min(len(sessions), last - first + 1))
    bounds = [first + (last - first + 1) * i // n for i in range(n + 1)]
    jobs = [fetch_track(sessions[i], url, state, t, track, bounds[i], bounds[i + 1] - 1,
                        labels[i] if labels is not None else None)
            for t in state.targets.values() if not t.reasm.complete for track in t.tracks
            for i in range(n)]
    results = await asyncio.gather(*jobs, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, Exception):
            raise r
        if isinstance(r, Exception):
            state.decide("fetch-failed", relay=url, error=str(r))
