"""Per-downstream-session send scheduling (§13).

aioquic has no stream priorities, so the relay decides which Object goes next: one writer task
per downstream session pops the most important pending write — lower Subscriber Priority
first, then lower Publisher Priority (KVCS: earlier layers first), then Group, Subgroup and
Object order — and performs it. Every path that carries Objects goes through it: live
subscriptions (``push``, fire and forget) and fill and FETCH streams (``write``, awaited by
the walk that produces them). The transport only accepts a bounded amount of unsent data per
connection, so under contention writes wait *here*, in priority order, not in QUIC's buffers.

A write names its *lane*, the stream it goes to. While the whole connection is slow, the
writer waits for the write at hand: every other write would wait just the same, and the most
important one must go first once there is room. But a stream can also be held back alone —
its reader stopped reading, and the peer's flow control for that stream is exhausted. Then
the write is left to finish in the background, the lane's later writes wait for it, and the
other lanes go on. Neither library tells a stream's flow control apart from the connection's
congestion, so the writer decides on what it sees: after ``STUCK_CHECK`` seconds without
progress on that stream while the connection has room and the other streams moved (or have
nothing to send).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from relay.session import SendBacklog

log = logging.getLogger("kvcs.relay")

Emit = Callable[[Any], Awaitable[None]]

# Priorities of a request or Object that gives none (§6.1 SUBSCRIBER_PRIORITY; a subgroup
# header with DEFAULT_PRIORITY, §11.2): the middle of the range.
DEFAULT_SUBSCRIBER_PRIORITY = 128
DEFAULT_PUBLISHER_PRIORITY = 128

# How long a waiting write is watched before the writer looks at whether its stream alone
# holds it (a heuristic on progress, see the module doc; never a deadline for the write).
STUCK_CHECK = 0.05


class Lane(Protocol):
    """Where a write goes: its send stream once open (None: not opened yet)."""

    @property
    def send_stream(self) -> SendBacklog | None: ...


class SessionScheduler:
    def __init__(self, spawn: Callable[..., asyncio.Task[Any]]) -> None:
        self._spawn = spawn
        self._heap: list[tuple[Any, ...]] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._busy = False  # a write is under way (the writer task's or an inline one)
        # lanes whose write finishes in the background: their later writes, in order
        self._detached: dict[Lane, list[tuple[Any, ...]]] = {}
        self._task = spawn(self._run(), "scheduler")

    def push(self, key: tuple[int, ...], emit: Emit, item: Any, lane: Lane | None = None,
             size: int = 0) -> None:
        """Queue ``emit(item)`` (``size`` bytes to ``lane``); it runs when it is the most
        important write."""
        heapq.heappush(self._heap, (key, next(self._seq), emit, item, lane, size))
        self._wake.set()

    async def write(self, key: tuple[int, ...], lane: Lane, size: int,
                    fn: Callable[[], Awaitable[None]]) -> None:
        """Perform ``fn`` (a write of ``size`` bytes to ``lane``) in its turn; returns once
        it is done and raises what it raised. When nothing else is pending and the write
        need not wait: at once, without a task switch."""
        if not self._heap and not self._busy and lane not in self._detached:
            s = lane.send_stream
            if s is None or not s.would_wait(size):
                self._busy = True
                try:
                    await fn()
                finally:
                    self._busy = False
                    if self._heap:
                        self._wake.set()
                return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.push(key, self._run_write, (fn, done), lane, size)
        await done

    @staticmethod
    async def _run_write(item: tuple[Callable[[], Awaitable[None]], asyncio.Future[None]]
                         ) -> None:
        fn, done = item
        if done.done():  # its waiter is gone (the request was cancelled)
            return
        try:
            await fn()
        except Exception as e:
            if not done.done():
                done.set_exception(e)
            return
        if not done.done():
            done.set_result(None)

    def __len__(self) -> int:
        return len(self._heap) + sum(len(v) for v in self._detached.values())

    async def _run(self) -> None:
        heap = self._heap
        while True:
            if not heap or self._busy:
                self._wake.clear()
                await self._wake.wait()
                continue
            entry = heapq.heappop(heap)
            _, _, emit, item, lane, size = entry
            waiting = self._detached.get(lane) if lane is not None else None
            if waiting is not None:
                waiting.append(entry)  # after the lane's background write
                continue
            s = lane.send_stream if lane is not None else None
            self._busy = True
            try:
                if s is None or not s.would_wait(size):
                    await emit(item)
                else:
                    await self._watched(self._spawn(emit(item), "scheduled-write"), lane, s)
            finally:
                self._busy = False

    async def _watched(self, task: asyncio.Task[Any], lane: Any, s: SendBacklog) -> None:
        """Wait for a write that has to wait, unless its own stream is what holds it."""
        while not task.done():
            ours, others = s.unsent, s.connection_unsent - s.unsent
            await asyncio.wait({task}, timeout=STUCK_CHECK)
            if task.done():
                return
            others_now = s.connection_unsent - s.unsent
            if s.unsent >= ours and not s.connection_full and \
                    (others_now < others or others_now == 0):
                self._detached[lane] = []
                task.add_done_callback(lambda _: self._reattach(lane))
                return

    def _reattach(self, lane: Lane) -> None:
        for entry in self._detached.pop(lane, ()):
            heapq.heappush(self._heap, entry)
        self._wake.set()


class ScheduledWriter:
    """A fetch or fill fetch stream whose writes take their turn in the session's scheduler:
    FETCH responses and fills are scheduled like subscriptions, with the request's
    Subscriber Priority and each Object's Publisher Priority (§13, §9.4). Also its own lane.
    """

    __slots__ = ("_key", "_priority", "_scheduler", "_w")

    def __init__(self, writer: Any, scheduler: SessionScheduler, subscriber_priority: int
                 ) -> None:
        self._w = writer
        self._scheduler = scheduler
        self._priority = subscriber_priority
        # markers and the FIN go with the priority of the Object before them
        self._key: tuple[int, ...] = (subscriber_priority, DEFAULT_PUBLISHER_PRIORITY, 0, 0, 0)

    @property
    def send_stream(self) -> SendBacklog | None:
        return self._w.stream  # type: ignore[no-any-return]

    async def write_object(self, group: int, subgroup: int | None, object_id: int,
                           priority: int, payload: Any, *, properties: bytes | None = None
                           ) -> None:
        self._key = (self._priority, priority, group, subgroup or 0, object_id)
        size = len(payload) + (len(properties) if properties else 0) + 32
        await self._scheduler.write(self._key, self, size, lambda: self._w.write_object(
            group, subgroup, object_id, priority, payload, properties=properties))

    async def write_marker(self, kind: Any, end_group: int, end_object: int) -> None:
        await self._scheduler.write(self._key, self, 32,
                                    lambda: self._w.write_marker(kind, end_group, end_object))

    async def finish(self) -> None:
        await self._scheduler.write(self._key, self, 0, self._w.finish)

    def reset(self, code: int) -> None:
        self._w.reset(code)
