"""Serving a range of a relayed Track from cache: the walk behind fills and FETCH (§14.5,
§14.6). Known Objects are written as the cache holds them; an unknown span is waited for
(Objects in flight upstream) or fetched upstream within the request's budget
(FILL_TIMEOUT); what stays unknown is reported, never turned into does-not-exist (§14.9).

The walk reads the Track's store and waits on its changes (``ServedTrack``, what it needs of
the Track); the Track itself (its upstream subscriptions, its forwarders, its commit) is
relay/core/track.py, which binds the upstream lookups to itself before it calls the walk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from relay.moqt.codes import EndOfRangeType, GroupOrder, ObjectStatus, StreamResetCode
from relay.moqt.primitives import Location
from relay.moqt.range_filter import ObjectFilter
from relay.session import LinkError, SessionClosed
from storage.interface import OBJECT_MAX, Span, SpanKind, StoredObject, Tier, TrackKey

from . import cache
from .counters import ServeStats
from .spans import before

if TYPE_CHECKING:
    from storage.tiered import TieredStore

# (start, end, budget): upstream FETCH of [start, end] of the Track served, with ``budget``
# seconds of the request's FILL_TIMEOUT left (Routing.fetch_upstream)
RangeFetch = Callable[[Location, Location, float], Awaitable[bool]]
# The upstream FETCH of the Track served on its way whose range holds a Location, if any.
RangeInFlight = Callable[[Location], "asyncio.Future[Any] | None"]

# Bytes of Objects read from the store in one step of a walk before they are written: LMDB
# views cannot outlive the step, so the LMDB-held ones among them are copied.
READ_BATCH = 256 * 1024

IdRanges = list[tuple[int, int | None]]


class RangeWriter(Protocol):
    """A fetch or fill fetch stream as ``serve_range`` writes it (``FetchWriter``, or one
    scheduled among the session's other writes)."""

    async def write_object(self, group: int, subgroup: int | None, object_id: int,
                           priority: int, payload: Any, *, properties: bytes | None = None
                           ) -> None: ...

    async def write_marker(self, kind: EndOfRangeType, end_group: int, end_object: int
                           ) -> None: ...

    def reset(self, code: int) -> None: ...


class ServedTrack(Protocol):
    """What the walk reads of a relayed Track (relay/core/track.py's RelayTrack)."""

    store: TieredStore
    key: TrackKey
    absent: list[tuple[Location, Location]]

    @property
    def live(self) -> bool: ...

    def largest(self) -> Location | None: ...

    def still_unknown(self, span: Span) -> Span | None: ...

    def may_come_live(self, span: Span) -> bool: ...

    async def wait_change(self, timeout: float) -> bool: ...

    async def wait_change_or(self, other: asyncio.Future[Any], timeout: float | None
                             ) -> None: ...


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Reads a finished upstream FETCH's outcome, so one that nobody awaits any more (the
    walk went on) does not log "exception never retrieved"."""
    if not task.cancelled():
        task.exception()


class _ReadAhead:
    """The upstream FETCHes one serving walk asked past the span it stood on (``end``:
    how far it may ask, None for none: a Descending walk, or one with Object ID filters,
    asks span by span), each with the range it holds."""

    def __init__(self, end: Location | None) -> None:
        self.end = end
        self._jobs: list[tuple[Location, Location, asyncio.Future[Any]]] = []

    def add(self, start: Location, end: Location, job: asyncio.Future[Any]) -> None:
        self._jobs.append((start, end, job))

    def holding(self, at: Location) -> asyncio.Future[Any] | None:
        """The last FETCH asked whose range holds ``at`` (done or not)."""
        for start, end, job in reversed(self._jobs):
            if start <= at <= end:
                return job
        return None

    def cancel(self) -> None:
        for _, _, job in self._jobs:
            job.cancel()


async def serve_range(track: ServedTrack, writer: RangeWriter, start: Location, end: Location,
                      order: GroupOrder, flt: ObjectFilter | None, budget: float,
                      upstream_fetch: RangeFetch, in_flight_wait: float,
                      in_flight: RangeInFlight | None = None) -> ServeStats:
    """Write every Object of [start, end] ``track``'s cache holds or can obtain, in
    ``order``, that passes the request's Range filters ``flt`` (§6.5).

    Unknown spans are waited for (Objects still in flight on the upstream subscription,
    or on an upstream FETCH already on its way: ``in_flight``), then fetched upstream
    (``upstream_fetch``), within ``budget`` seconds (FILL_TIMEOUT);
    what stays unknown is reported with an End of Range marker (§14.5 step 3), or, where
    §17 item 20 forbids a marker, by resetting the stream with UNKNOWN_OBJECT_STATUS.
    """
    # Object IDs no Object can pass are not even walked (nor asked upstream); the other
    # filters need the Object itself (its Subgroup, priority, Properties): an unknown
    # span stays to be resolved, and what it brings is filtered like the rest.
    id_ranges = flt.object_ids() if flt is not None else None
    # Ascending, an unknown span is asked upstream with the unknown run after it (one
    # FETCH, not a round trip per Group), and served as it arrives: see _resolve. Not
    # with Object ID filters: the run would bring every Object of its Groups, where the
    # walk's spans ask only for the IDs that pass.
    ahead = _ReadAhead(end if order != GroupOrder.DESCENDING and id_ranges is None
                       else None)
    walk = _Walk(track, writer, flt, id_ranges, budget, upstream_fetch, in_flight_wait,
                 in_flight, ahead)
    groups = range(start.group, end.group + 1)
    if order == GroupOrder.DESCENDING:
        groups = range(end.group, start.group - 1, -1)
    try:
        await walk.run(groups, start, end)
    except BaseException:
        ahead.cancel()  # nobody is served by what it would bring any more
        raise
    return walk.stats


class _Walk:
    """One serving walk: what stays the same from its first Group to its last."""

    def __init__(self, track: ServedTrack, writer: RangeWriter, flt: ObjectFilter | None,
                 id_ranges: IdRanges | None, budget: float, upstream_fetch: RangeFetch,
                 in_flight_wait: float, in_flight: RangeInFlight | None,
                 ahead: _ReadAhead) -> None:
        self.track = track
        self.writer = writer
        self.flt = flt
        self.id_ranges = id_ranges
        self.stats = ServeStats()
        self.loop = asyncio.get_running_loop()
        self.deadline = self.loop.time() + budget
        self.upstream_fetch = upstream_fetch
        self.in_flight_wait = in_flight_wait
        self.in_flight = in_flight
        self.ahead = ahead

    async def run(self, groups: range, start: Location, end: Location) -> None:
        last_group: int | None = None  # Group of the last element written
        attempted: set[tuple[Location, Location]] = set()
        for g in groups:
            lo = start.object if g == start.group else 0
            hi = end.object if g == end.group else OBJECT_MAX
            cursor = lo
            while cursor is not None and cursor <= hi:
                span, cursor, last_group = await self._serve_group(g, cursor, hi, last_group)
                if span is None:
                    break
                key = (span.start, span.end)
                resolved = False
                if key not in attempted:
                    attempted.add(key)
                    resolved = await self._resolve(span)
                if resolved:
                    cursor = span.start.object
                    continue
                timed_out = self.loop.time() >= self.deadline
                kind = EndOfRangeType.TIMED_OUT if timed_out else EndOfRangeType.UNKNOWN
                if last_group == g:
                    # §17 item 20: a marker cannot end in the Group of the previous element.
                    self.writer.reset(StreamResetCode.UNKNOWN_OBJECT_STATUS)
                    self.stats.reset = True
                    return
                await self.writer.write_marker(kind, span.end.group, span.end.object)
                self.stats.markers += 1
                last_group = g
                nxt = span.end.object + 1
                cursor = nxt if span.end.object < OBJECT_MAX else None

    async def _serve_group(self, g: int, cursor: int, hi: int, last_group: int | None
                           ) -> tuple[Span | None, int | None, int | None]:
        """Write Group ``g`` from ``cursor`` to ``hi``; stop at the first unknown span.

        No read session stays open across a write (a stalled consumer would keep LMDB from
        growing its map, storage/lmdb_store.py): each batch is read in one synchronous step,
        with the LMDB-held payloads in it copied out (memory-tier ones are kept as they
        are), then written."""
        stats = self.stats
        while True:
            batch, span, nxt = self._read_batch(g, cursor, hi)
            for tier, item in batch:
                sub = None if item.datagram else item.subgroup
                props = bytes(item.properties) if item.properties else None
                await self.writer.write_object(item.group, sub, item.object_id, item.priority,
                                               item.payload, properties=props)
                stats.objects += 1
                stats.bytes += len(item.payload)
                stats.by_tier[tier] = stats.by_tier.get(tier, 0) + 1
                last_group = g
            if span is not None:
                return span, span.start.object, last_group
            if nxt is None:
                return None, None, last_group
            cursor = nxt

    def _read_batch(self, g: int, cursor: int, hi: int
                    ) -> tuple[list[tuple[Tier, StoredObject]], Span | None, int | None]:
        """The Objects of Group ``g`` from ``cursor`` to write next (about ``READ_BATCH``
        bytes), safe to keep once the read session is closed; then the unknown span that
        stops the walk, or the Object ID to read on from (None: the Group is done)."""
        track, flt = self.track, self.flt
        out: list[tuple[Tier, StoredObject]] = []
        size = 0
        with track.store.reader() as r:
            for tier, item in cache.walk(r, track.key, Location(g, cursor), Location(g, hi),
                                         self.id_ranges):
                if isinstance(item, Span):
                    if item.kind == SpanKind.NON_EXISTENT:
                        continue
                    sp = track.still_unknown(item)
                    if sp is None:
                        continue
                    return out, sp, None
                if item.status != ObjectStatus.NORMAL:
                    continue
                sub = None if item.datagram else item.subgroup
                if flt is not None and not flt.passes(sub, item.object_id, item.priority,
                                                      item.properties):
                    continue
                if size >= READ_BATCH:
                    return out, None, item.object_id
                out.append((tier, item.copy() if tier == Tier.LMDB else item))
                size += item.nbytes
        return out, None, None

    async def _resolve(self, span: Span) -> bool:
        """Try to turn an unknown span into known Objects; True if anything changed."""
        track, deadline, ahead, loop = self.track, self.deadline, self.ahead, self.loop
        if self._span_changed(span):
            # found before the Objects ahead of it were written, which can take long (a
            # slow consumer): an upstream FETCH may have brought it and ended meanwhile
            return True
        pending = self.in_flight(span.start) if self.in_flight is not None else None
        mine = ahead.holding(span.start)
        for fetch in (pending, mine):
            # An upstream FETCH on its way holds the span (a pull-through's, another
            # request's, or this walk's own run): what it brings is cached as it arrives, so
            # wait for that, not for all of it; asked again below only if it ends without
            # telling.
            if fetch is not None and await self._changed_while(fetch, span):
                return True
        if mine is not None and mine.done() and not mine.cancelled() and \
                mine.exception() is None and mine.result():
            return False  # this walk's own FETCH was answered and left the span unknown
        largest = track.largest()
        if track.live and largest is not None and span.start <= largest and \
                track.may_come_live(span):
            # Objects at or below L may still be in flight on the upstream subscription.
            wait_until = min(deadline, loop.time() + self.in_flight_wait)
            while loop.time() < wait_until:
                if not await track.wait_change(wait_until - loop.time()):
                    break
                if self._span_changed(span):
                    return True
        if loop.time() >= deadline:
            return False
        self.stats.upstream_fetches += 1
        to = span.end
        if ahead.end is not None:
            to = self._unknown_run_end(span, ahead.end)
        left = max(0.0, deadline - loop.time())
        job = asyncio.ensure_future(asyncio.wait_for(
            self.upstream_fetch(span.start, to, left), left))
        job.add_done_callback(_retrieve)
        if to != span.end:
            ahead.add(span.start, to, job)
            # the rest of the run is served as it arrives, while the FETCH goes on
            if await self._changed_while(job, span):
                return True
        try:
            await job
        except (TimeoutError, LinkError, SessionClosed):
            return False
        return self._span_changed(span)

    async def _changed_while(self, fetch: asyncio.Future[Any], span: Span) -> bool:
        """True as soon as ``span`` changes while ``fetch`` is on its way (until the
        deadline); False once it is done without changing it."""
        while not fetch.done() and self.loop.time() < self.deadline:
            await self.track.wait_change_or(fetch, self.deadline - self.loop.time())
            if self._span_changed(span):
                return True
        return False

    def _unknown_run_end(self, span: Span, end: Location) -> Location:
        """Where the unknown run that starts with ``span`` ends, up to ``end``: the last
        Location of the cache's unknown Span from there (across Groups) not known absent.
        Known-absent Locations inside the run are asked with it (one range, not one FETCH
        per piece); the answer can only confirm them (§14.9 forbids the other way)."""
        track = self.track
        stop = span.end
        with track.store.reader() as r:
            for _, item in cache.walk(r, track.key, span.start, end):
                if isinstance(item, Span) and item.kind == SpanKind.UNKNOWN and \
                        tuple(item.start) == tuple(span.start):
                    stop = max(stop, Location(*item.end))
                break
        moved = True
        while moved and stop > span.end:
            moved = False
            for a_start, a_end in track.absent:
                if a_start <= stop <= a_end:
                    stop, moved = max(span.end, before(a_start)), True
        return stop

    def _span_changed(self, span: Span) -> bool:
        track = self.track
        if track.still_unknown(span) != span:
            return True
        with track.store.reader() as r:
            for _, item in cache.walk(r, track.key, span.start, span.end):
                if not (isinstance(item, Span) and item.kind == SpanKind.UNKNOWN
                        and tuple(item.start) == tuple(span.start)
                        and tuple(item.end) == tuple(span.end)):
                    return True
        return False


__all__ = ["READ_BATCH", "RangeFetch", "RangeInFlight", "RangeWriter", "ServedTrack",
           "serve_range"]
