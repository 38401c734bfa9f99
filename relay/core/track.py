"""One relayed Track: its upstream subscription(s), its cache entries, its downstream
Forwarders and its commit to LMDB. Serving ranges of it from cache (fills and FETCH,
§14.5, §14.6) is the walk in range_serve.py.

The relay never looks into payloads: Objects go from the upstream subscription into the
store and out to Forwarders as opaque buffers (§14.9).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from relay.moqt.codes import (
    GroupOrder,
    LocationFilterType,
    ObjectStatus,
    PropertyType,
    PublishDoneCode,
    StreamResetCode,
)
from relay.moqt.location_filter import resolve_fetch_range, resolve_subscription_range
from relay.moqt.primitives import FullTrackName, Location, format_full_track_name
from relay.moqt.range_filter import ObjectFilter
from relay.session import (
    RangeMarker,
    ReceivedObject,
    RequestCancelled,
    SessionClosed,
    Source,
    StreamEnded,
    Subscription,
    SubscriptionDone,
)
from storage.interface import (
    OBJECT_MAX,
    AppendResult,
    ConflictError,
    Span,
    StoredObject,
    TrackKey,
)

from . import cache
from .cache import status_object, stored_object
from .counters import Counters, ServeStats
from .ingest_pacing import IngestPacer
from .range_serve import RangeWriter, serve_range
from .scheduler import DEFAULT_PUBLISHER_PRIORITY
from .spans import MarkerSpans, Spans

if TYPE_CHECKING:
    from storage.tiered import TieredStore

    from .forwarder import Forwarder

log = logging.getLogger("kvcs.relay")

# (track, start, end, budget): upstream FETCH of [start, end] with ``budget`` seconds of the
# request's FILL_TIMEOUT left (Routing.fetch_upstream)
UpstreamFetch = Callable[["RelayTrack", Location, Location, float], Awaitable[bool]]
# The upstream FETCH on its way for a Track whose range holds a Location, if any (Routing).
InFlightFetch = Callable[["RelayTrack", Location], "asyncio.Future[Any] | None"]

# Upstream PUBLISH_DONE codes passed through downstream as they are (§14.4); the others are
# about the relay's own upstream subscription and become INTERNAL_ERROR.
_PASS_THROUGH = {PublishDoneCode.TRACK_ENDED, PublishDoneCode.MALFORMED_TRACK}

# Pauses between attempts of a commit LMDB could not take (seconds, doubling up to the max).
COMMIT_RETRY_FIRST = 0.05
COMMIT_RETRY_MAX = 5.0


def _fill_start(sub: Subscription) -> Location | None:
    """Where the fill our upstream subscription ``sub`` asked for starts, resolved against
    the Largest Object its SUBSCRIBE_OK reported, as its publisher resolved it (§9.6);
    None: no fill asked, or nothing published then (no fill stream comes, §9.3)."""
    fill = sub.params.fill
    if fill is None:
        return None
    rng = resolve_fetch_range(fill.location_filter, sub.largest)
    return rng.start if rng is not None and not rng.is_empty else None


class RelayTrack:
    def __init__(self, full_name: FullTrackName, store: TieredStore,
                 on_commit: Callable[[RelayTrack], Awaitable[bool]] | None = None) -> None:
        self.full_name = full_name
        self.key: TrackKey = (tuple(full_name.namespace), bytes(full_name.name))
        self.store = store
        self.upstreams: list[Subscription] = []
        self.forwarders: set[Forwarder] = set()
        self.upstream_largest: Location | None = None
        self.establishing: asyncio.Future[None] | None = None
        self.malformed = False
        self._changed = asyncio.Event()
        self._on_commit = on_commit
        self.committed = False
        self._commit_task: asyncio.Future[None] | None = None
        # Locations an upstream fill or FETCH proved absent (its FIN with no Range filters:
        # skipped Locations do not exist, §10 item 6). Fetch and fill streams carry no Object
        # Status, so without this a relay fed by them could never tell "the Group ends here"
        # from "unknown". Only what such a stream skipped is recorded, so an Object it
        # delivered is unknown once evicted, never absent (even evicted before the FIN).
        self.absent: list[tuple[Location, Location]] = []
        self.properties: tuple[Any, ...] = ()  # Track Properties from upstream (§12)
        self._commit_again = False
        self.counters: Counters | None = None  # the Relay's (objects received)
        # told when the Track gains a live upstream (held SUBSCRIBEs, SUBSCRIBE_TRACKS)
        self.on_available: Callable[[RelayTrack], None] | None = None
        # paces ingest on the live subscribers (ingest_pacing.py); None: never waits
        self.pacer: IngestPacer | None = None

    def __repr__(self) -> str:
        return f"<RelayTrack {format_full_track_name(*self.full_name)}>"

    # -- state ------------------------------------------------------------------------------------

    @property
    def live(self) -> bool:
        """An upstream subscription is attached and its ingest has not finished: Objects it
        already queued still count as in flight until ingest has taken them."""
        return bool(self.upstreams)

    def largest(self) -> Location | None:
        """The relay's Largest Object: never less than what upstream reported (§6.3)."""
        loc = self.store.largest_object(self.key)
        up = self.upstream_largest
        if loc is None:
            return up
        return loc if up is None or loc > up else up

    def set_properties(self, properties: Sequence[Any]) -> None:
        """The Track Properties as received (§12: the most recent set replaces the cached
        one); MAX_CACHE_DURATION among them bounds how long the cache may serve Objects."""
        self.properties = tuple(properties)
        self.store.memory.set_cache_duration(self.key, self.cache_duration)

    @property
    def cache_duration(self) -> float | None:
        """MAX_CACHE_DURATION in seconds (§12), None when the publisher set none."""
        for p in self.properties:
            if p.type == PropertyType.MAX_CACHE_DURATION and isinstance(p.value, int):
                return p.value / 1000
        return None

    def note_largest(self, loc: Location | None) -> None:
        if loc is not None and (self.upstream_largest is None or loc > self.upstream_largest):
            self.upstream_largest = loc
            self._bump()  # a FETCH waiting for a source's answer may go on

    async def wait_change_or(self, other: asyncio.Future[Any], timeout: float | None) -> None:
        """Until the Track changes, ``other`` is done, or ``timeout`` passes."""
        changed = asyncio.ensure_future(self._next_change().wait())
        try:
            await asyncio.wait((changed, other), timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()

    def _bump(self) -> None:
        self._changed.set()

    def _next_change(self) -> asyncio.Event:
        """The event the Track's next change sets: the current one until a change set it,
        then a fresh one. Made here, by a waiter, rather than by every change: ``_bump``
        runs per received Object, waiters far less often."""
        ev = self._changed
        if ev.is_set():
            ev = self._changed = asyncio.Event()
        return ev

    async def wait_change(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._next_change().wait(), timeout)
            return True
        except TimeoutError:
            return False

    # -- upstream ---------------------------------------------------------------------------------

    def attach_upstream(self, sub: Subscription) -> None:
        """Count ``sub`` as live and learn its Largest Object now, before ``ingest`` first
        runs: a SUBSCRIBE answered in between must see both (§6.3: never report less)."""
        if sub not in self.upstreams:
            self.upstreams.append(sub)
            if len(self.upstreams) == 1 and self.on_available is not None:
                self.on_available(self)
        self.note_largest(sub.largest)
        if sub.track_properties:
            # the most recent set replaces the cached one (§12); forwarded unchanged
            self.set_properties(sub.track_properties)

    async def ingest(self, sub: Subscription) -> None:
        """Cache and fan out everything the upstream subscription delivers."""
        self.attach_upstream(sub)
        seen_streams: set[int] = set()
        last: dict[int, ReceivedObject] = {}  # per subgroup stream, its last Object so far
        fills: dict[int, MarkerSpans] = {}  # per fill stream of ours (its start: fill_from)
        fill_from = _fill_start(sub) or Location(0, 0)
        status: int | None = None
        reason = ""
        # waiting holds the publisher back only where credit follows reads (see there)
        pacer = self.pacer if sub.session.conn.credit_follows_reads else None
        forwarders = self.forwarders
        try:
            async for ev in sub:
                if isinstance(ev, ReceivedObject):
                    self._on_object(ev, seen_streams)
                    if pacer is not None and forwarders and pacer.must_wait(forwarders):
                        await pacer.wait(forwarders)
                    if ev.stream.source is Source.SUBGROUP:
                        last[ev.stream.stream_id] = ev
                    if ev.stream.source is Source.FILL:
                        fills.setdefault(ev.stream.stream_id,
                                         MarkerSpans(fill_from)).object(ev.location)
                elif isinstance(ev, StreamEnded):
                    sid = ev.stream.stream_id
                    seen_streams.discard(sid)
                    spans = fills.pop(sid, MarkerSpans(fill_from))
                    if ev.stream.source is Source.FILL and ev.fin and sub.largest is not None \
                            and sub.params.fill is not None:
                        # our own fill request is fill_from..L with no Range filters
                        self.mark_absent(spans.absent(fill_from, sub.largest))
                    if ev.stream.source is Source.SUBGROUP:
                        final = last.pop(sid, None)
                        header = ev.stream.header
                        if ev.fin and header is not None and header.end_of_group:
                            if final is not None:
                                self._group_ends_after(final)
                            else:
                                self._group_ends_before_start(sub, header)
                        for f in list(self.forwarders):
                            f.stream_ended(sid, ev.fin)
                    self.maybe_commit()
                elif isinstance(ev, SubscriptionDone):
                    status, reason = ev.status, ev.reason
                elif isinstance(ev, RangeMarker):
                    # an unknown span in the upstream fill stays unknown here
                    fills.setdefault(ev.stream.stream_id,
                                     MarkerSpans(fill_from)).marker(ev)
                if self.malformed:
                    sub.cancel(StreamResetCode.MALFORMED_TRACK)
                    status = PublishDoneCode.MALFORMED_TRACK
                    break
        except (SessionClosed, RequestCancelled) as e:
            log.info("%r: upstream subscription ended: %s", self, e)
        finally:
            self.upstreams.remove(sub)
            await self._upstream_gone(status, reason)

    def _on_object(self, ev: ReceivedObject, seen_streams: set[int]) -> None:
        obj = stored_object(ev)
        if self.counters is not None and ev.status == ObjectStatus.NORMAL:
            self.counters.objects_received += 1
            self.counters.bytes_received += len(ev.payload)
        try:
            result = self.store.append(self.key, obj)
        except ConflictError as e:
            log.warning("%r is malformed: %s", self, e)
            self.malformed = True
            return
        if ev.stream.source is Source.SUBGROUP:
            sid = ev.stream.stream_id
            first = sid not in seen_streams
            seen_streams.add(sid)
            if result is AppendResult.STORED or result is AppendResult.NOT_KEPT:
                header = ev.stream.header
                assert header is not None
                for f in list(self.forwarders):
                    f.offer(sid, header, obj, first)
        self._bump()
        if ev.status != ObjectStatus.NORMAL:
            self.maybe_commit()

    def _group_ends_after(self, final: ReceivedObject) -> None:
        """A subgroup stream with END_OF_GROUP ended with FIN after ``final``: no larger
        Object ID exists in its Group (§11.2). Cached as the End of Group Object it is
        equivalent to (§14.1), so FETCH_OK can say where the Group ends and the Track can
        be committed, from publishers that end Groups this way rather than with a status
        Object (moq-rs). Only cached: live subscribers got the same FIN and flag."""
        if final.status != ObjectStatus.NORMAL or final.object_id >= OBJECT_MAX:
            return  # ended by its own status Object (or no room after it)
        self._cache_group_end(final.group, final.subgroup, final.object_id + 1,
                              final.priority)

    def _group_ends_before_start(self, sub: Subscription, header: Any) -> None:
        """An empty subgroup stream flagged END_OF_GROUP and FINed: no Object of its Group
        lies at or after the point the stream starts (§11.2, §11.5): the subscription's
        start in the Group it starts in, Object 0 in any later Group. Two senders: an
        upstream relay whose fill for us ended at an End of Group
        (Forwarder.announce_group_end), which the fill stream cannot carry (§11.4); and a
        publisher's Group with no Object at all (moq-rs: a Group finished with no frame).
        Cached as the End of Group Object it implies (§14.1, as ``_group_ends_after``),
        and passed on to the subscribers whose live part holds that point, so the Group
        ends (or exists, empty) for them too, down a tree."""
        start = resolve_subscription_range(sub.params.location_filter, sub.largest).start
        g = header.group_id
        if g < start.group or (g == start.group and start.object >= OBJECT_MAX):
            return
        at = Location(g, start.object if g == start.group else 0)
        subgroup = header.subgroup_id or 0
        prio = header.publisher_priority if header.publisher_priority is not None \
            else DEFAULT_PUBLISHER_PRIORITY
        if not self._cache_group_end(g, subgroup, at.object, prio):
            return  # known already: told to whoever joined since (_group_end_after_fill)
        # a Group that had no Object at all stays a Group begun on the stream, FIRST_OBJECT
        # as its publisher set it (moq-rs makes no Group of a stream without it)
        whole = at.object == 0 and bool(header.first_object)
        for f in list(self.forwarders):
            if (f.start.group == g and f.start >= at) if g == start.group else f.start <= at:
                f.announce_group_end(g, subgroup, prio, first_object=whole)

    def _cache_group_end(self, g: int, subgroup: int, end: int, priority: int) -> bool:
        """Cache an End of Group at {g, end} learned from a stream's END_OF_GROUP + FIN,
        unless the Group's or the Track's end is known already; True if it was cached."""
        final_loc = self.store.known_final(self.key)
        if self.store.group_end(self.key, g) is not None or \
                (final_loc is not None and Location(g, end) >= final_loc):
            return False
        try:
            self.store.append(self.key, status_object(g, subgroup, end, priority,
                                                      ObjectStatus.END_OF_GROUP))
        except ConflictError as e:  # a larger Object of the Group is cached: §14.2
            log.warning("%r is malformed: %s", self, e)
            self.malformed = True
            return False
        finally:
            self._bump()
        return True

    @property
    def pending_commit(self) -> asyncio.Future[None] | None:
        """The LMDB commit under way (or waiting to retry), if any."""
        task = self._commit_task
        return task if task is not None and not task.done() else None

    def stop_committing(self) -> None:
        """Never committed again, whatever arrives (a purge took the Track)."""
        self._on_commit = None

    def maybe_commit(self) -> None:
        """Once End of Track is known, try to persist after every Group-level event: the End
        of Track Object can overtake the last Groups (they travel on other streams)."""
        if self.committed or self._on_commit is None:
            return
        if self.store.known_final(self.key) is None:
            return
        if self.pending_commit is not None:
            self._commit_again = True
            return
        self._commit_task = asyncio.ensure_future(self._commit())

    async def _commit(self) -> None:
        """Commit until it is done or can never be: a commit LMDB cannot take now is
        retried after a growing pause (the Track stays served from memory meanwhile)."""
        pause = COMMIT_RETRY_FIRST
        while self._on_commit is not None and not self.committed:
            self._commit_again = False
            if await self._on_commit(self):
                await asyncio.sleep(pause)  # a back-off timer, nothing to wait for
                pause = min(pause * 2, COMMIT_RETRY_MAX)
                continue
            if not self._commit_again:
                break
        self._bump()  # wake whoever waits for the commit

    async def _upstream_gone(self, status: int | None, reason: str) -> None:
        if self.live:
            return
        self._bump()
        if self.store.known_final(self.key) is None and not self.committed:
            self.store.abort(self.key)  # a track whose publisher failed never reaches LMDB
        if status is None:
            code = PublishDoneCode.INTERNAL_ERROR
            reason = "upstream ended"
        else:
            code = PublishDoneCode(status) if status in _PASS_THROUGH \
                else PublishDoneCode.INTERNAL_ERROR
        for f in list(self.forwarders):
            f.upstream_done(code, reason)

    # -- serving ranges from cache (fills and FETCH): relay/core/range_serve.py -------------------

    async def serve_range(self, writer: RangeWriter, start: Location, end: Location,
                          order: GroupOrder, flt: ObjectFilter | None,
                          budget: float, upstream_fetch: UpstreamFetch,
                          in_flight_wait: float,
                          in_flight: InFlightFetch | None = None) -> ServeStats:
        """Write every Object of [start, end] the cache holds or can obtain (see
        ``range_serve.serve_range``)."""
        return await serve_range(
            self, writer, start, end, order, flt, budget,
            functools.partial(upstream_fetch, self), in_flight_wait,
            functools.partial(in_flight, self) if in_flight is not None else None)

    def may_come_live(self, span: Span) -> bool:
        """Objects of ``span`` may still arrive on an upstream subscription: not if each one
        is a Next Object subscription whose start (its Largest Object when it was answered)
        is at or past the span's end and whose fill, if any, starts after it: a relay that
        held part of a Track follows it live from there (it asks a fill only when it holds
        nothing), and a cold one's fill starts where its first subscriber's did."""
        for sub in self.upstreams:
            lf = sub.params.location_filter
            fill_from = _fill_start(sub)
            if lf is not None and lf.type == LocationFilterType.NEXT_OBJECT and \
                    sub.largest is not None and span.end <= sub.largest and \
                    (fill_from is None or span.end < fill_from):
                continue
            return True
        return False

    def mark_absent(self, spans: Spans) -> None:
        """Record ``spans`` as known not to exist (see ``absent``)."""
        self.absent += spans
        self._bump()

    def still_unknown(self, span: Span) -> Span | None:
        """The part of an unknown single-Group span not covered by ``absent`` (from its
        start); None when all of it is known absent."""
        start = span.start
        progressed = True
        while progressed:
            progressed = False
            for a_start, a_end in self.absent:
                if a_start <= start <= a_end:
                    if a_end >= span.end:
                        return None
                    start = Location(a_end.group, a_end.object + 1) \
                        if a_end.group == start.group else span.end
                    progressed = True
        return Span(span.kind, start, span.end) if start != span.start else span

    def last_held(self, group: int) -> Location | None:
        """The largest Location of ``group`` the cache holds an Object for."""
        last = None
        with self.store.reader() as r:
            for obj in cache.read(r, self.key, Location(group, 0),
                                  Location(group, OBJECT_MAX)):
                last = obj.location
        return last

    def append_fetched(self, obj: StoredObject) -> None:
        """An Object learned from an upstream FETCH (cached like any other, §14.6 step 5)."""
        try:
            self.store.append(self.key, obj)
        except ConflictError as e:
            log.warning("%r is malformed: %s", self, e)
            self.malformed = True
        self._bump()


__all__ = ["RelayTrack"]
