"""A request's bounded event queue (relay/session/event_queue.py): what backpressure rests on.
A full queue holds its producer until the consumer takes an event, whichever way either
side goes in and out (at once when no wait is needed, or waiting)."""

from __future__ import annotations

import asyncio

from relay.session.event_queue import EventQueue, EventSource


class _Source(EventSource[int]):
    def __init__(self, maxsize: int) -> None:
        self._events = EventQueue(maxsize)


async def test_a_full_queue_holds_its_producer_until_the_consumer_takes_one() -> None:
    src = _Source(2)
    async with asyncio.timeout(5):
        await src.deliver(0)
        await src.deliver(1)  # full now
        third = asyncio.ensure_future(src.deliver(2))
        await asyncio.sleep(0)  # one turn: a deliver that could go on would have
        assert not third.done() and len(src._events) == 2
        assert await anext(src) == 0  # taken without a wait: must still make room
        await third
        assert [await anext(src), await anext(src)] == [1, 2]
        src._events.put_nowait_end()
        assert [e async for e in src] == []
