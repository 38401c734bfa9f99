"""SUBSCRIBEs held for a publisher to appear (RENDEZVOUS_TIMEOUT, §6.3, §14.4): a SUBSCRIBE for
a Track nobody publishes waits, up to its RENDEZVOUS_TIMEOUT capped by the relay's
``max_rendezvous_timeout``, for a source: a PUBLISH of the Track, a PUBLISH_NAMESPACE of its
namespace or of a prefix of it, or such a namespace learned from the upstream relay (the wait
holds a namespace subscription upstream for the Track's namespace, so the tree is heard too).
Each such change wakes the waiters of that namespace, which then try their sources again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from relay.moqt.primitives import TrackNamespace


class Rendezvous:
    def __init__(self) -> None:
        # each held SUBSCRIBE's wake-up, by the namespace of its Track
        self._waiting: dict[TrackNamespace, set[asyncio.Event]] = {}

    @contextmanager
    def waiting(self, namespace: TrackNamespace) -> Iterator[asyncio.Event]:
        """An Event set when a source for ``namespace`` may have appeared (clear it before
        trying again); forgotten on exit, however the wait ended."""
        ev = asyncio.Event()
        self._waiting.setdefault(namespace, set()).add(ev)
        try:
            yield ev
        finally:
            events = self._waiting.get(namespace)
            if events is not None:
                events.discard(ev)
                if not events:
                    del self._waiting[namespace]

    def appeared(self, namespace: TrackNamespace) -> None:
        """A source for ``namespace`` (and every namespace under it) appeared."""
        if not self._waiting:
            return
        for ns, events in self._waiting.items():
            if ns[:len(namespace)] == namespace:
                for ev in events:
                    ev.set()

    def __len__(self) -> int:
        return sum(map(len, self._waiting.values()))


__all__ = ["Rendezvous"]
