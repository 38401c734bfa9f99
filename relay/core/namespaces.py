"""The namespace table: who publishes which Track Namespace, and who wants to hear about it.

Publishers register namespaces with PUBLISH_NAMESPACE (or are learned from an upstream
relay's NAMESPACE messages); SUBSCRIBE_NAMESPACE subscribers get NAMESPACE for every matching
namespace present now and later, and NAMESPACE_DONE when the last publisher of it leaves
(§7.13, §14.4). Matching is field by field (§2.7).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from relay.moqt.primitives import TrackNamespace, namespace_matches_prefix

Visible = Callable[[TrackNamespace], bool]


@dataclass(eq=False)
class NamespaceListener:
    """One SUBSCRIBE_NAMESPACE: ``notify(namespace, active)`` is called for each change;
    ``visible`` hides namespaces outside the requester's authorized scopes."""

    prefix: TrackNamespace
    notify: Callable[[TrackNamespace, bool], None]
    visible: Visible = field(default=lambda ns: True)
    session: Any = None


@dataclass(eq=False)
class PublisherEntry:
    """One source of a namespace: a publisher session or an upstream relay."""

    namespace: TrackNamespace
    source: Any  # the MoqtSession (or upstream link) SUBSCRIBE/FETCH are routed to
    upstream: bool = False


class NamespaceTable:
    def __init__(self) -> None:
        self._publishers: dict[TrackNamespace, list[PublisherEntry]] = {}
        self._listeners: list[NamespaceListener] = []

    # publishers --------------------------------------------------------------------------------

    def add_publisher(self, entry: PublisherEntry) -> None:
        entries = self._publishers.setdefault(entry.namespace, [])
        first = not entries
        entries.append(entry)
        if first:
            self._notify(entry.namespace, True)

    def remove_publisher(self, entry: PublisherEntry) -> None:
        entries = self._publishers.get(entry.namespace)
        if not entries:
            return
        with contextlib.suppress(ValueError):
            entries.remove(entry)
        if not entries:
            del self._publishers[entry.namespace]
            self._notify(entry.namespace, False)

    def remove_source(self, source: Any) -> None:
        """Drop every namespace ``source`` published (its session closed)."""
        for entries in list(self._publishers.values()):
            for e in list(entries):
                if e.source is source:
                    self.remove_publisher(e)

    def remove_namespace(self, namespace: TrackNamespace) -> bool:
        """Drop every source of ``namespace`` at once (an operator's purge); listeners get
        one NAMESPACE_DONE. False if nothing announced it."""
        if self._publishers.pop(namespace, None) is None:
            return False
        self._notify(namespace, False)
        return True

    def publishers_for(self, namespace: TrackNamespace) -> list[PublisherEntry]:
        """Publishers whose announced namespace is a prefix of (or equal to) ``namespace``,
        local publishers first, longest match first (§14.4: route to every matching one)."""
        found = [e for ns, entries in self._publishers.items()
                 if namespace_matches_prefix(namespace, ns) for e in entries]
        found.sort(key=lambda e: (e.upstream, -len(e.namespace)))
        return found

    def namespaces(self) -> Iterator[TrackNamespace]:
        return iter(list(self._publishers))

    def __contains__(self, namespace: object) -> bool:
        return namespace in self._publishers

    # listeners ---------------------------------------------------------------------------------

    def add_listener(self, listener: NamespaceListener) -> list[TrackNamespace]:
        """Register and return the matching namespaces present now (to announce at once)."""
        self._listeners.append(listener)
        return [ns for ns in self._publishers
                if namespace_matches_prefix(ns, listener.prefix) and listener.visible(ns)]

    def remove_listener(self, listener: NamespaceListener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def listeners_of(self, session: Any) -> list[NamespaceListener]:
        return [x for x in self._listeners if x.session is session]

    def _notify(self, namespace: TrackNamespace, active: bool) -> None:
        for lst in list(self._listeners):
            if namespace_matches_prefix(namespace, lst.prefix) and lst.visible(namespace):
                lst.notify(namespace, active)
