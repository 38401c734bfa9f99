"""The bounded queue between a data stream's reader and the request it belongs to.

Each subscription, fetch and namespace subscription is an async iterator over such a queue.
Its bound is what backpressure rests on: a full queue stops the stream reader, which then
stops returning receive credit to the sender.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Generic, Self, TypeVar

E = TypeVar("E")
END = object()  # the end that stops iteration (other ends are errors to raise)


class EventQueue:
    """A bounded queue of events, then an end: ``END`` or a terminal error.

    ``put`` waits while ``maxsize`` events are queued (that is what stops a stream reader
    and so withholds QUIC credit from the sender). The end is kept apart from the bound, so
    ending never drops a queued event: readers get every event, then the end. Only
    ``end(discard=True)`` (the consumer cancelled) drops what is queued.
    """

    def __init__(self, maxsize: int) -> None:
        self._items: deque[Any] = deque()
        self._max = maxsize
        self._end: Any = None
        self._changed = asyncio.Event()
        self.finished = False

    def put_if_room(self, item: Any) -> bool:
        """Queue ``item`` if that needs no wait (or drop it, as ``put`` would, once
        finished); False: ``put`` must wait for room."""
        if self.finished:
            return True
        if len(self._items) >= self._max:
            return False
        self._items.append(item)
        self._changed.set()
        return True

    def get_nowait(self) -> Any:
        """The next event if one is queued, else ``END`` (then ``get`` must wait, or ends
        the iteration)."""
        if not self._items:
            return END
        item = self._items.popleft()
        self._changed.set()  # room for a waiting put
        return item

    async def put(self, item: Any) -> None:
        while not self.finished and len(self._items) >= self._max:
            self._changed.clear()
            await self._changed.wait()
        if not self.finished:
            self._items.append(item)
            self._changed.set()

    def put_nowait(self, item: Any) -> None:
        """Queue ``item`` at once, past the bound: for the few events that arrived with a
        request's reply, queued before the request is handed to its caller."""
        if not self.finished:
            self._items.append(item)
            self._changed.set()

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait_end(self, item: Any = END, *, discard: bool = False) -> None:
        if self.finished:
            return
        self.finished = True
        self._end = item
        if discard:
            self._items.clear()
        self._changed.set()

    async def get(self) -> Any:
        while not self._items:
            if self.finished:
                if self._end is END:
                    raise StopAsyncIteration
                raise self._end
            self._changed.clear()
            await self._changed.wait()
        item = self._items.popleft()
        self._changed.set()  # room for a waiting put
        return item


class EventSource(Generic[E]):
    """An async iterator over one request's events (see ``EventQueue``)."""

    _events: EventQueue

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> E:
        # a queued event without a second coroutine (once per received Object)
        item = self._events.get_nowait()
        if item is END:
            item = await self._events.get()
        return item  # type: ignore[no-any-return]

    async def deliver(self, event: E) -> None:
        if not self._events.put_if_room(event):
            await self._events.put(event)
