"""What the relay learned of namespaces from other relays: the namespaces a namespace
subscription to a source announces become routable there (``follow``), as learned, never as
this relay's own, until withdrawn or the subscription ends. The sources are the upstream
relay (upstream_namespaces.py), sibling workers and peers (siblings.py) and lower relays
(what they hold under the prefix they announced, routing.py).

A namespace learned from above whose Objects this relay holds stays discoverable here when
its source goes (kept), until the registry forgets its last Track.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relay.moqt.primitives import TrackNamespace
from relay.session import MoqtSession
from relay.session.errors import SessionFailure

from .namespaces import CACHE, NamespaceTable, PublisherEntry
from .registry import TrackRegistry


class LearnedNamespaces:
    def __init__(self, namespaces: NamespaceTable, registry: TrackRegistry) -> None:
        self.namespaces = namespaces
        self.registry = registry
        # learned namespaces kept discoverable while Objects of them are held here (their
        # source gone, or nobody here following it any more)
        self._kept: dict[TrackNamespace, PublisherEntry] = {}

    async def follow(self, nsub: Any, source: MoqtSession, *, upstream: bool = True,
                     entries: dict[TrackNamespace, PublisherEntry] | None = None,
                     handed: set[TrackNamespace] | None = None,
                     admit: Callable[[TrackNamespace], bool] | None = None,
                     caught_up: Callable[[], None] | None = None) -> None:
        """What a namespace subscription to ``source`` announces is routable there, until
        withdrawn or the subscription ends. ``upstream``: learned from the upstream relay or
        a sibling worker (not this relay's own, see PublisherEntry). ``entries``: the
        caller's record of what was learned (it may take them over, UpstreamNamespaces);
        ``handed``: entries taken over from another subscription, kept as they are when
        announced again; ``admit``: which namespaces may be learned at all; ``caught_up``:
        called once what came with the subscription's REQUEST_OK is in the table."""
        if entries is None:
            entries = {}
        table = self.namespaces
        if caught_up is not None and not nsub.queued():
            caught_up()
            caught_up = None
        try:
            async for ev in nsub:
                ns = ev.namespace
                if ev.active:
                    if handed is not None and ns in handed:
                        handed.discard(ns)  # announced again: the entry taken over stays
                        continue
                    if ns in entries:
                        continue
                    if admit is not None and not admit(ns):
                        continue
                    e = PublisherEntry(ns, source, upstream=upstream)
                    entries[ns] = e
                    table.add_publisher(e)
                else:
                    e2 = entries.pop(ns, None)
                    if handed is not None:
                        handed.discard(ns)
                    if e2 is not None:
                        table.remove_publisher(e2)
                if caught_up is not None and not nsub.queued():
                    caught_up()
                    caught_up = None
        except SessionFailure:
            pass
        finally:
            for e in list(entries.values()):
                self.drop(e)
            entries.clear()

    def drop(self, e: PublisherEntry) -> None:
        """A learned namespace's source no longer offers it. If it was learned from above
        and this relay holds Objects of it, it stays discoverable and served (kept)."""
        if e.upstream and self.registry.holds(e.namespace):
            self.keep(e.namespace)
        self.namespaces.remove_publisher(e)

    def keep(self, namespace: TrackNamespace) -> None:
        """Discoverable here as learned, until the registry forgets its last Track (sweep).
        Still learned, not this relay's own: never announced upward, or the upstream (once
        back) would route requests for it down here while this relay asks up for the same
        Track; never a route either (the cache serves what it holds)."""
        if namespace not in self._kept:
            kept = self._kept[namespace] = PublisherEntry(namespace, CACHE, upstream=True)
            self.namespaces.add_publisher(kept)

    def sweep_kept(self) -> None:
        """Kept namespaces of which the registry holds nothing any more are done."""
        for ns in [ns for ns in self._kept if not self.registry.holds(ns)]:
            self.namespaces.remove_publisher(self._kept.pop(ns))

    def forget_kept(self, namespace: TrackNamespace) -> None:
        """A purge took what was kept of a namespace whose source has gone."""
        self._kept.pop(namespace, None)


__all__ = ["LearnedNamespaces"]
