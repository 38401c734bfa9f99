"""Fan-out: one Forwarder per downstream subscription of a relayed Track (§14.3).

The Track's ingest hands every new Object to each Forwarder with the upstream stream it came
on. The Forwarder applies the subscription's filters and queues what passes on its session's
scheduler; when emitted, an Object goes on the downstream subgroup stream that mirrors its
upstream stream (so Objects of a Subgroup stay in order and the "next Object" rule of §11.5
holds). A downstream stream is FINed when its upstream stream was, unless Objects at or above
the subscription's start fell outside its Location window (an update narrowed it) — then it
is reset (§11.5). Objects left out by the subscriber's own Range filters do not cause a reset
(docs/relay.md: plain RESET_STREAM would discard the Objects it did ask for).

A Forwarder bounds what it holds for a slow subscriber: past ``max_backlog`` bytes the
subscription ends with PUBLISH_DONE TOO_FAR_BEHIND and its streams are reset with
TOO_FAR_BEHIND (§14.3); other subscribers are not affected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relay.moqt.codes import ObjectStatus, PublishDoneCode, StreamResetCode
from relay.moqt.dataplane.objects import SubgroupHeader
from relay.moqt.params import Params
from relay.moqt.primitives import Location
from relay.moqt.range_filter import ObjectFilter, RangeFilter, override_filters
from relay.session import (
    LinkError,
    RequestCancelled,
    SendBacklog,
    ServedSubscription,
    SubgroupWriter,
)
from storage.interface import StoredObject

from .counters import Counters
from .scheduler import DEFAULT_PUBLISHER_PRIORITY, DEFAULT_SUBSCRIBER_PRIORITY, SessionScheduler

log = logging.getLogger("kvcs.relay")

_END = 1 << 64  # sorts an end-of-stream item after every Object of its Subgroup


@dataclass(eq=False)
class _Down:
    """The downstream stream mirroring one upstream subgroup stream."""

    header: SubgroupHeader
    writer: SubgroupWriter | None = None
    dropped: bool = False  # an Object of it fell outside the window: end with a reset
    first: bool = False  # the first Object we send is the Subgroup's first (FIRST_OBJECT)
    offered: int = 0
    failed: bool = False
    # The Subscriber Priority its items are queued with, fixed when it opens: a REQUEST_UPDATE
    # that changes the subscription's must not let the stream's end overtake its Objects.
    subscriber_priority: int = DEFAULT_SUBSCRIBER_PRIORITY

    @property
    def send_stream(self) -> SendBacklog | None:
        """The scheduler's lane: a stream blocked by flow control holds back only itself."""
        return self.writer.stream if self.writer is not None else None


class Forwarder:
    def __init__(self, params: Params, scheduler: SessionScheduler,
                 start: Location, end: Location | None, *, max_backlog: int,
                 on_close: Callable[[Forwarder], None]) -> None:
        # Registered with the Track before SUBSCRIBE_OK is sent (so no Object above L can slip
        # between the two); ``attach`` gives it the subscription once the reply is out.
        self.served: ServedSubscription | None = None
        self._ready = asyncio.Event()
        self._finished = asyncio.Event()
        self.params = params
        self.scheduler = scheduler
        self.start = start
        self.end = end
        self.max_backlog = max_backlog
        self._on_close = on_close
        self.range_filters: tuple[RangeFilter, ...] = ()
        self._filter: ObjectFilter | None = None
        self.update_filters(params.range_filters)
        self._streams: dict[int, _Down] = {}
        self.backlog = 0
        self.pending = 0
        self.closed = False
        self._done_status: int | None = None
        self._done_reason = ""
        self._holds = 0
        self.counters: Counters | None = None  # the Relay's (objects sent, too far behind)
        # set while the Track's ingest waits for this queue to drain (ingest_pacing.py)
        self._drain_at = 0
        self._drained: asyncio.Event | None = None

    # Forward and Subscriber Priority are the subscription's (REQUEST_UPDATE changes them
    # there); until it is attached, what the SUBSCRIBE asked for.

    @property
    def forward(self) -> bool:
        if self.served is not None:
            return self.served.forward
        return self.params.forward is not False

    @property
    def subscriber_priority(self) -> int:
        if self.served is not None:
            return self.served.subscriber_priority
        p = self.params.subscriber_priority
        return p if p is not None else DEFAULT_SUBSCRIBER_PRIORITY

    def attach(self, served: ServedSubscription) -> None:
        self.served = served
        self._ready.set()

    def update_filters(self, changes: tuple[RangeFilter, ...]) -> None:
        """Apply Range filters of a SUBSCRIBE or REQUEST_UPDATE (each type given replaces
        that type; a zero-length one removes it, §6.5)."""
        self.range_filters = override_filters(self.range_filters, changes)
        self._filter = ObjectFilter.of(self.range_filters)

    # -- fed by the Track's ingest ---------------------------------------------------------------

    def in_window(self, obj: StoredObject) -> bool:
        loc = Location(obj.group, obj.object_id)
        return loc >= self.start and (self.end is None or loc <= self.end)

    def passes(self, obj: StoredObject) -> bool:
        """Inside the Location window and through the Range filters (§6.3: Forward AND
        Location filter AND Range filters). Status Objects are Objects too: one outside the
        filters is not sent either."""
        f = self._filter
        return self.in_window(obj) and (
            f is None or f.passes(None if obj.datagram else obj.subgroup, obj.object_id,
                                  obj.priority, obj.properties))

    def offer(self, stream_key: int, header: SubgroupHeader, obj: StoredObject,
              first_in_stream: bool) -> None:
        if self.closed or not self.forward:
            return
        down = self._streams.get(stream_key)
        if down is None:
            down = _Down(header, first=header.first_object and first_in_stream,
                         subscriber_priority=self.subscriber_priority)
            self._streams[stream_key] = down
        if not self.passes(obj):
            if down.offered == 0:
                down.first = False  # the first Object we send is not the Subgroup's first
            if Location(obj.group, obj.object_id) >= self.start and not self.in_window(obj):
                down.dropped = True  # outside the window, not merely below the start
            return
        down.offered += 1
        size = len(obj.payload) + 64
        self.backlog += size
        self.pending += 1
        if self.backlog > self.max_backlog:
            self.too_far_behind()
            return
        key = (down.subscriber_priority, obj.priority, obj.group, obj.subgroup,
               obj.object_id)
        self.scheduler.push(key, self._emit, (stream_key, obj, size), down, size)

    def stream_ended(self, stream_key: int, fin: bool) -> None:
        down = self._streams.get(stream_key)
        if down is None or self.closed:
            return
        h = down.header
        sub = h.subgroup_id or 0
        prio = h.publisher_priority if h.publisher_priority is not None \
            else DEFAULT_PUBLISHER_PRIORITY
        self.pending += 1
        self.scheduler.push((down.subscriber_priority, prio, h.group_id, sub, _END),
                            self._emit, (stream_key, None, fin), down)

    def announce_group_end(self, group: int, subgroup: int, priority: int, *,
                           first_object: bool = False) -> None:
        """Tell the subscriber on the live path that ``group`` has ended, with an empty
        subgroup stream flagged END_OF_GROUP and FINed (§11.2, §11.5): no Object of it is
        sent, so nothing below the subscription's start is. For a Group a fill delivered
        whose End of Group Object is L itself: the fill stream cannot carry that status
        (§11.4) and the live part starts after it, so the subscriber would otherwise learn
        of the Group's end only from PUBLISH_DONE (moq-rs 0.5.1 keeps the Group open).
        Also a Group its publisher ended without any Object: ``first_object``, as the
        stream that said so set it (§11.2: the stream begins the Subgroup)."""
        if self.closed:
            return
        self.pending += 1
        self.scheduler.push((self.subscriber_priority, priority, group, subgroup, _END),
                            self._emit_group_end, (group, subgroup, priority, first_object))

    async def _emit_group_end(self, item: tuple[int, int, int, bool]) -> None:
        group, subgroup, priority, first_object = item
        self.pending -= 1
        try:
            if self.served is None:
                await self._ready.wait()
            assert self.served is not None
            if self.closed or not self.served.forward:
                return
            w = await self.served.open_subgroup(group, subgroup, priority,
                                                first_object=first_object, end_of_group=True)
            await w.finish()
        except (LinkError, RequestCancelled):
            pass
        finally:
            self._maybe_done()

    def upstream_done(self, status: int, reason: str = "") -> None:
        """The Track's last upstream ended: PUBLISH_DONE once everything queued is sent."""
        if self.closed or self._done_status is not None:
            return
        self._done_status = status
        self._done_reason = reason
        self._maybe_done()

    def end_subscription(self, status: int, reason: str = "") -> None:
        """End the subscription now, whatever is queued (a failed REQUEST_UPDATE, §7.5): its
        streams are reset and PUBLISH_DONE follows."""
        if self.closed:
            return
        self.close()
        self._spawn(self._send_done(status, reason), "publish-done")

    # -- emitted by the scheduler -----------------------------------------------------------------

    async def _emit(self, item: tuple[int, StoredObject | None, Any]) -> None:
        stream_key, obj, extra = item
        self.pending -= 1
        if self.served is None:
            await self._ready.wait()
        try:
            if self.closed:
                return
            down = self._streams.get(stream_key)
            if down is None or down.failed:
                return
            if obj is None:
                await self._end_stream(stream_key, down, fin=bool(extra))
            else:
                self.backlog -= extra
                if self._drained is not None and self.backlog <= self._drain_at:
                    self._drained.set()
                await self._write(down, obj)
        except LinkError:
            down = self._streams.get(stream_key)
            if down is not None:
                down.failed = True
        finally:
            self._maybe_done()

    async def _write(self, down: _Down, obj: StoredObject) -> None:
        w = down.writer
        if w is None:
            h = down.header
            assert self.served is not None
            w = await self.served.open_subgroup(
                h.group_id, obj.subgroup, obj.priority, first_object=down.first,
                end_of_group=h.end_of_group, properties=h.has_properties)
            down.writer = w
        if obj.status == ObjectStatus.NORMAL:
            props = bytes(obj.properties) if obj.properties else None
            await w.write_object(obj.object_id, obj.payload, properties=props)
            if self.counters is not None:
                self.counters.objects_sent += 1
                self.counters.bytes_sent += len(obj.payload)
        else:
            await w.write_status(obj.object_id, ObjectStatus(obj.status))

    async def _end_stream(self, key: int, down: _Down, fin: bool) -> None:
        del self._streams[key]
        w = down.writer
        if w is None:
            return
        if fin and not down.dropped:
            await w.finish()
        else:
            w.reset(StreamResetCode.INTERNAL_ERROR if not fin else StreamResetCode.CANCELLED)

    def watch_drain(self, at: int, event: asyncio.Event | None) -> None:
        """Set ``event`` once at most ``at`` bytes are queued, or the subscription ends
        (None: stop watching). The Track's ingest waits on it (ingest_pacing.py)."""
        self._drain_at = at
        self._drained = event

    def hold(self) -> None:
        """Keep PUBLISH_DONE back (e.g. until the fill stream is open: it counts, §7.7)."""
        self._holds += 1

    def release(self) -> None:
        self._holds -= 1
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self._done_status is not None and self.pending == 0 and not self._holds \
                and not self.closed:
            status, reason = self._done_status, self._done_reason
            self.close()
            self._spawn(self._send_done(status, reason), "publish-done")

    def _spawn(self, coro: Any, name: str) -> None:
        if self.served is not None:
            self.served.session.spawn(coro, name)
        else:
            coro.close()

    async def _send_done(self, status: int, reason: str) -> None:
        for down in list(self._streams.values()):
            if down.writer is not None:
                down.writer.reset(StreamResetCode.INTERNAL_ERROR)
        self._streams.clear()
        try:
            assert self.served is not None
            await self.served.done(status, reason)
        except LinkError:
            pass

    # -- ending -----------------------------------------------------------------------------------

    def too_far_behind(self) -> None:
        log.info("a subscription is too far behind (%d bytes queued): ending it", self.backlog)
        if self.counters is not None:
            self.counters.too_far_behind += 1
        self.close()
        for down in self._streams.values():
            if down.writer is not None:
                down.writer.reset(StreamResetCode.TOO_FAR_BEHIND)
        self._streams.clear()
        self.backlog = 0
        self._spawn(self._safe_done(PublishDoneCode.TOO_FAR_BEHIND, "too far behind"),
                    "too-far-behind")

    async def _safe_done(self, status: int, reason: str) -> None:
        try:
            assert self.served is not None
            await self.served.done(status, reason, timeout=1.0)
        except LinkError:
            pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._finished.set()
        if self._drained is not None:
            self._drained.set()
        self._on_close(self)

    async def wait_finished(self, cancelled: asyncio.Event) -> None:
        """Until the subscription ends: the subscriber cancels (then drop what is queued),
        or the Forwarder ended it (PUBLISH_DONE)."""
        waits = {asyncio.ensure_future(cancelled.wait()),
                 asyncio.ensure_future(self._finished.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if cancelled.is_set():
            self.cancel()

    def cancel(self) -> None:
        """The subscriber cancelled: drop what is queued (its streams were reset already)."""
        self.close()
        self._streams.clear()
        self.backlog = 0
