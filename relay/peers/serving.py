"""Answering for what we published (MOQT-PROFILE 15.1 step 6).

While a publisher stays connected it serves FETCH and SUBSCRIBE for its own Tracks from what
it has written. A relay whose memory tier evicted Groups before it could commit the Track to
LMDB does not hold them any more; it asks the session that announced the namespace (us)
with an upstream FETCH, and without an answer its consumers would get "unknown" spans.

SUBSCRIBE is answered for ended Tracks only: while a Track is produced, the relay already
receives it on our PUBLISH, and a second live copy would need a second writer per Object.
An ended Track's SUBSCRIBE gets its fill (if asked) from what was written, then PUBLISH_DONE.
Data Objects are not kept: each is made again from the cache (the plan's ``reload``: read
back from the KV file's mapping, regenerated for a synthetic cache), so a connected publisher
holds no copy of what it sent; only the small manifest versions are kept as written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from relay.kvcs.plan import PlannedObject
from relay.moqt.codes import GroupOrder, LocationFilterType, PublishDoneCode, RequestErrorCode
from relay.moqt.location_filter import LocationFilter, resolve_fetch_range
from relay.moqt.primitives import FullTrackName, Location, LocationRange, TrackNamespace
from relay.moqt.range_filter import RangeFilter, evaluate_range_filters
from relay.moqt.vi64 import MAX_VI64
from relay.session import FetchWriter, IncomingFetch, IncomingSubscribe, SessionHandler


@dataclass
class _Written:
    """One Track as written: payload Objects, where each Group ended, End of Track."""

    # (priority, payload or what makes it again)
    objects: dict[Location, tuple[int, bytes | Callable[[], bytes]]] = field(
        default_factory=dict)
    group_ends: dict[int, int] = field(default_factory=dict)  # Group -> End of Group Object
    end: Location | None = None  # End of Track

    def largest(self) -> Location | None:
        if self.end is not None:
            return self.end
        known = [*self.objects, *(Location(g, o) for g, o in self.group_ends.items())]
        return max(known, default=None)

    def whole_group_end(self, end: Location) -> Location:
        """A range ending "at the end of Group G" ends at the last Location known in G."""
        if end.object != MAX_VI64:
            return end
        last = self.group_ends.get(end.group)
        if last is None:
            last = max((loc.object for loc in self.objects if loc.group == end.group),
                       default=0)
        return Location(end.group, last)

    def select(self, rng: LocationRange, filters: Iterable[RangeFilter],
               order: GroupOrder) -> list[Location]:
        locs = [loc for loc, (prio, _) in self.objects.items()
                if rng.contains(loc) and evaluate_range_filters(
                    filters, subgroup_id=0, object_id=loc.object, priority=prio)]
        if order == GroupOrder.DESCENDING:
            return sorted(locs, key=lambda loc: (-loc.group, loc.object))
        return sorted(locs)

    async def write(self, w: FetchWriter, locs: list[Location]) -> None:
        for loc in locs:
            prio, payload = self.objects[loc]
            await w.write_object(loc.group, 0, loc.object, prio,
                                 payload() if callable(payload) else payload)
        await w.finish()


def _location_filter(lf: LocationFilter | None) -> LocationFilter | None:
    return None if lf is None or lf.type == LocationFilterType.NONE else lf


class PublishedTracks(SessionHandler):
    """The session handler of a publisher: one per publication, shared by its relays."""

    def __init__(self) -> None:
        self.tracks: dict[FullTrackName, _Written] = {}

    def wrote(self, namespace: TrackNamespace, obj: PlannedObject) -> None:
        t = self.tracks.setdefault(FullTrackName(namespace, obj.track.encode()), _Written())
        t.objects[Location(obj.group, obj.object_id)] = (obj.priority, obj.reload or obj.payload)
        if obj.ends_group:
            t.group_ends[obj.group] = obj.object_id + 1
        if obj.ends_track:
            t.end = Location(obj.group + 1, 0)

    async def fetch(self, req: IncomingFetch) -> None:
        t = self.tracks.get(req.full_name)
        if t is None:
            await req.reject(RequestErrorCode.DOES_NOT_EXIST, "not published here")
            return
        rng = resolve_fetch_range(_location_filter(req.params.location_filter), t.largest())
        if rng is None or rng.is_empty or rng.end is None:
            await req.reject(RequestErrorCode.INVALID_RANGE, "start is past the Largest Object")
            return
        end = t.whole_group_end(rng.end)
        locs = t.select(LocationRange(rng.start, end), req.params.range_filters,
                        req.group_order)
        w = await req.accept(t.end is not None and end >= t.end, end)
        await t.write(w, locs)

    async def subscribe(self, req: IncomingSubscribe) -> None:
        t = self.tracks.get(req.full_name)
        if t is None or t.end is None:
            await req.reject(RequestErrorCode.DOES_NOT_EXIST,
                             "not published here" if t is None else "in production: on PUBLISH")
            return
        served = await req.accept(t.end)
        fill = req.params.fill
        if fill is not None:
            rng = resolve_fetch_range(
                _location_filter(fill.location_filter or req.params.location_filter), t.end)
            if rng is not None and not rng.is_empty and rng.end is not None:
                order = fill.group_order or served.group_order
                locs = t.select(LocationRange(rng.start, t.whole_group_end(rng.end)),
                                fill.range_filters or req.params.range_filters, order)
                await t.write(await served.open_fill(group_order=order), locs)
        await served.done(PublishDoneCode.TRACK_ENDED)
