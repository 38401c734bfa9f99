"""Per-downstream-session send scheduling (§13).

aioquic has no stream priorities, so the relay decides which Object goes next: one writer task
per downstream session pops the most important pending Object — lower Subscriber Priority
first, then lower Publisher Priority (KVCS: earlier layers first), then Group, Subgroup and
Object order — and writes it. The transport only accepts a bounded amount of unsent data per
connection, so under contention Objects wait *here*, in priority order, not in QUIC's buffers.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("kvcs.relay")

Emit = Callable[[Any], Awaitable[None]]


class SessionScheduler:
    def __init__(self, spawn: Callable[..., asyncio.Task[Any]]) -> None:
        self._heap: list[tuple[Any, ...]] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._task = spawn(self._run(), "scheduler")

    def push(self, key: tuple[int, ...], emit: Emit, item: Any) -> None:
        heapq.heappush(self._heap, (key, next(self._seq), emit, item))
        self._wake.set()

    def __len__(self) -> int:
        return len(self._heap)

    async def _run(self) -> None:
        heap = self._heap
        while True:
            if not heap:
                self._wake.clear()
                await self._wake.wait()
                continue
            _, _, emit, item = heapq.heappop(heap)
            await emit(item)
