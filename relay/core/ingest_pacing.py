"""A Track's ingest paced on its live subscribers: a relay that cannot forward as fast as a
publisher sends holds the publisher back instead of collapsing (docs/relay.md, "Overload").

The relay does everything on one core. Taking an Object in (decrypting, parsing, caching)
costs about what sending it costs, and QUIC grants a publisher credit as soon as the relay
has read its bytes, so a publisher that offers more than the relay can forward got all the
CPU: the relay read 1,500-1,900 Objects/s of 32 KiB and sent 100-160 (aioquic, loopback),
and the subscriber's queue grew until it was ended as too far behind.

So before taking the next Object, a Track's ingest waits while its least-behind forwarding
subscriber (a Forwarder) has more than ``hold_bytes`` queued, until that one has drained to
half of it. Not reading is what holds the publisher back: the upstream subscription's queue
fills, its stream readers stop, and no receive credit is returned (``backend.credit_on_read``;
on qh3, which grants credit before the relay reads, the relay would stop the publisher's
stream instead, so ingest there never waits). Nothing is dropped: a subscriber that keeps up
gets every Object, in order.

A subscriber is waited for at most ``PATIENCE`` seconds in a row. One that cannot drain to
half of ``hold_bytes`` in that time (it stopped reading, or its path is slow) is not waited
for again until its queue is back under that mark; meanwhile the Track's ingest goes on, its
queue grows and ends at ``max_backlog_bytes`` (TOO_FAR_BEHIND) as before. So the relay that is
itself the bottleneck feeds its live subscribers first, and a stalled subscriber, or one
slower than half of ``hold_bytes`` per PATIENCE, holds the publisher back (and a publication
out of the cache) for PATIENCE at most. One that drains faster but slower than the publisher
sends, and is the least behind, does set the publisher's pace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .counters import Counters

log = logging.getLogger("kvcs.relay")

if TYPE_CHECKING:
    from .forwarder import Forwarder

# How long ingest waits in a row for a subscriber to drain before it stops waiting for it.
# Much longer than a relay that is only busy takes: at 15 MB/s (aioquic, one core) half of
# the default bound (512 KiB) drains in about 35 ms. But a subscriber that has just joined a
# Track the relay was taking in at full speed drains its first half while the relay still
# works through what the publisher had in flight. With 0.25 s, on a machine loaded by one
# more busy process, the relay gave up on a subscriber 350 ms after it joined, which then
# fell behind for good (48 Objects/s, TOO_FAR_BEHIND 9 s later); with 1 s, 3 runs of 3 kept
# it (benchmarks/bench_overload.py at the publisher's maximum).
PATIENCE = 1.0
# How often a wait looks again at the Track's subscribers without being woken.
RECHECK = 0.05


class IngestPacer:
    """Decides when a Track's ingest waits for its subscribers, and waits."""

    __slots__ = ("_counters", "_excused", "_low", "hold_bytes")

    def __init__(self, hold_bytes: int, counters: Counters | None = None) -> None:
        self.hold_bytes = hold_bytes  # 0: never wait
        self._low = hold_bytes // 2
        self._counters = counters
        # subscribers not waited for (they did not drain within PATIENCE), until they catch up
        self._excused: set[Forwarder] = set()

    def must_wait(self, forwarders: Iterable[Forwarder]) -> bool:
        """True if every forwarding subscriber not excused has more than ``hold_bytes``
        queued (and there is at least one)."""
        return bool(self.hold_bytes) and self._all_over(forwarders, self.hold_bytes)

    def _all_over(self, forwarders: Iterable[Forwarder], bound: int) -> bool:
        over = False
        for f in forwarders:
            if f.closed or not f.forward:
                continue
            if f in self._excused:
                if f.backlog > self._low:
                    continue
                self._excused.discard(f)  # caught up by itself: waited for again
            if f.backlog <= bound:
                return False
            over = True
        return over

    async def wait(self, forwarders: set[Forwarder]) -> None:
        """Until a forwarding subscriber has drained to half of ``hold_bytes`` (or closed,
        or stopped forwarding); those that did not within PATIENCE are excused."""
        room = asyncio.Event()
        # (two upstreams of one Track waiting at once: the later watch replaces the earlier,
        # which then looks again every RECHECK)
        watched = [f for f in forwarders if not f.closed]
        for f in watched:
            f.watch_drain(self._low, room)
        started = time.monotonic()
        if self._counters is not None:
            self._counters.ingest_waits += 1
        try:
            deadline = started + PATIENCE
            while self._all_over(forwarders, self._low):
                left = deadline - time.monotonic()
                if left <= 0:
                    late = [f for f in forwarders if not f.closed and f.backlog > self._low]
                    log.info("%d subscriber(s) did not drain to %d bytes queued within %.2f s: "
                             "no longer waited for", len(late), self._low, PATIENCE)
                    self._excused.update(late)
                    break
                room.clear()
                # a slice: a subscriber that joins, or stops forwarding, sets no event
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(room.wait(), min(left, RECHECK))
        finally:
            for f in watched:
                f.watch_drain(0, None)
            self._excused.intersection_update(forwarders)  # forget the closed ones
            if self._counters is not None:
                self._counters.ingest_wait_seconds += time.monotonic() - started
