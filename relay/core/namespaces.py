"""The namespace table: who publishes which Track Namespace, and who wants to hear about it.

Publishers register namespaces with PUBLISH_NAMESPACE (or are learned from an upstream
relay's, a sibling worker's or a lower relay's NAMESPACE messages); SUBSCRIBE_NAMESPACE
subscribers get NAMESPACE for every matching namespace present now and later, and
NAMESPACE_DONE when the last source they may see of it leaves (§7.13, §14.4). Matching is
field by field (§2.7).

What a listener sees depends on the namespace *and* on its sources: a lower relay is not told
of its own namespaces (no echo down a tree), a sibling worker or an upstream relay hears only
of this relay's own ones (no loops). So the table keeps, per listener, what it was told, and
re-evaluates on every change of a namespace's sources: NAMESPACE_DONE only ever follows a
NAMESPACE, and a namespace that becomes visible later (a second source) is announced then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from relay.moqt.primitives import TrackNamespace

Visible = Callable[[TrackNamespace], bool]


class Reach(Enum):
    """Where a request may be sent on when the relay cannot answer it from its cache: it
    depends on where the request came from."""

    ALL = "all"  # a client's: publishers, lower relays, sibling workers, the upstream relay
    NO_SIBLINGS = "no-siblings"  # a sibling worker's: never back to a sibling
    # the upstream relay's (docs/relay.md, "Trees"): this relay's own sources only — its
    # publishers, the lower relays that announced to it, its cache — never up again nor
    # sideways, so a request travels down a tree and never loops
    OWN = "own"


CACHE = "cache"  # the namespace source of Tracks the relay itself holds in LMDB

@dataclass(eq=False)
class PublisherEntry:
    """One source of a namespace: a publisher session, the relay's own cache, or a relay
    (upstream, sibling worker, lower relay) that announced it."""

    namespace: TrackNamespace
    source: Any  # the MoqtSession (or CACHE) SUBSCRIBE/FETCH are routed to
    # learned from the upstream relay or a sibling worker: not this relay's own, so never
    # announced to either of them (a tree has no loops)
    upstream: bool = False


def any_source(entry: PublisherEntry) -> bool:
    return True


def own_source(entry: PublisherEntry) -> bool:
    """This relay's own: its clients' (publishers and lower relays) and its cache."""
    return not entry.upstream


@dataclass(eq=False)
class NamespaceListener:
    """One SUBSCRIBE_NAMESPACE: ``notify(namespace, active)`` is called for each change;
    ``visible`` hides namespaces outside the requester's authorized scopes, ``shows`` the
    sources it must not hear of (a namespace is visible while one shown source remains)."""

    prefix: TrackNamespace
    notify: Callable[[TrackNamespace, bool], None]
    visible: Visible = field(default=lambda ns: True)
    session: Any = None
    shows: Callable[[PublisherEntry], bool] = any_source
    told: set[TrackNamespace] = field(default_factory=set)  # NAMESPACE sent, no DONE yet
    # the requester cancelled; the listener goes once its handler runs again, and until then
    # it must not refuse the same prefix asked again as overlapping (PREFIX_OVERLAP)
    over: Callable[[], bool] = field(default=lambda: False)


def not_from(session: Any) -> Callable[[PublisherEntry], bool]:
    """A client is not told of namespaces only it announced (a lower relay's own, echoed)."""
    return lambda e: e.source is not session


class NamespaceTable:
    """Indexed by prefix, so that a SUBSCRIBE_NAMESPACE, a routing lookup and a change each
    cost the number of fields of a namespace, not the number of namespaces: a relay holding
    10,000 publications in LMDB answers each of a consumer's per-Anchor-Key discovery
    requests without a scan (kvcs-draft 5.1)."""

    def __init__(self) -> None:
        self._publishers: dict[TrackNamespace, list[PublisherEntry]] = {}
        # every prefix of every announced namespace (itself and () included) -> the announced
        # namespaces under it, in announcement order (a dict as an ordered set)
        self._under: dict[TrackNamespace, dict[TrackNamespace, None]] = {}
        self._listening_at: dict[TrackNamespace, dict[NamespaceListener, None]] = {}
        self._by_session: dict[int, dict[NamespaceListener, None]] = {}  # id(session) ->
        # told of every new source (SUBSCRIBEs held for a publisher wake on it, rendezvous.py)
        self.on_add: Callable[[TrackNamespace], None] | None = None

    # publishers --------------------------------------------------------------------------------

    def add_publisher(self, entry: PublisherEntry) -> None:
        ns = entry.namespace
        entries = self._publishers.get(ns)
        if entries is None:
            entries = self._publishers[ns] = []
            for k in range(len(ns) + 1):
                self._under.setdefault(ns[:k], {})[ns] = None
        entries.append(entry)
        self._changed(ns)
        if self.on_add is not None:
            self.on_add(ns)

    def _forget(self, namespace: TrackNamespace) -> None:
        del self._publishers[namespace]
        for k in range(len(namespace) + 1):
            under = self._under[namespace[:k]]
            del under[namespace]
            if not under:
                del self._under[namespace[:k]]

    def remove_publisher(self, entry: PublisherEntry) -> None:
        entries = self._publishers.get(entry.namespace)
        if not entries:
            return
        with contextlib.suppress(ValueError):
            entries.remove(entry)
        if not entries:
            self._forget(entry.namespace)
        self._changed(entry.namespace)

    def remove_source(self, source: Any) -> None:
        """Drop every namespace ``source`` published (its session closed)."""
        for entries in list(self._publishers.values()):
            for e in list(entries):
                if e.source is source:
                    self.remove_publisher(e)

    def remove_namespace(self, namespace: TrackNamespace) -> bool:
        """Drop every source of ``namespace`` at once (an operator's purge); listeners get
        one NAMESPACE_DONE. False if nothing announced it."""
        if namespace not in self._publishers:
            return False
        self._forget(namespace)
        self._changed(namespace)
        return True

    def publishers_for(self, namespace: TrackNamespace) -> list[PublisherEntry]:
        """Publishers whose announced namespace is a prefix of (or equal to) ``namespace``,
        local publishers first, longest match first (§14.4: route to every matching one)."""
        found = [e for k in range(len(namespace) + 1)
                 for e in self._publishers.get(namespace[:k], ())]
        found.sort(key=lambda e: (e.upstream, -len(e.namespace)))
        return found

    def sources_of(self, namespace: TrackNamespace) -> list[PublisherEntry]:
        """The sources that announced exactly ``namespace``."""
        return list(self._publishers.get(namespace, ()))

    def namespaces(self) -> Iterator[TrackNamespace]:
        return iter(list(self._publishers))

    def __contains__(self, namespace: object) -> bool:
        return namespace in self._publishers

    # listeners ---------------------------------------------------------------------------------

    def _sees(self, listener: NamespaceListener, namespace: TrackNamespace) -> bool:
        return any(listener.shows(e) for e in self._publishers.get(namespace, ())) and \
            listener.visible(namespace)

    def add_listener(self, listener: NamespaceListener) -> list[TrackNamespace]:
        """Register and return the matching namespaces present now (to announce at once)."""
        self._by_session.setdefault(id(listener.session), {})[listener] = None
        self._listening_at.setdefault(listener.prefix, {})[listener] = None
        now = [ns for ns in self._under.get(listener.prefix, ()) if self._sees(listener, ns)]
        listener.told.update(now)
        return now

    def remove_listener(self, listener: NamespaceListener) -> None:
        mine = self._by_session.get(id(listener.session))
        if mine is None or listener not in mine:
            return
        del mine[listener]
        if not mine:
            del self._by_session[id(listener.session)]
        at = self._listening_at[listener.prefix]
        del at[listener]
        if not at:
            del self._listening_at[listener.prefix]

    def listener_count(self) -> int:
        """Inspection (tests): the listeners registered, which a session's end must free."""
        return sum(map(len, self._by_session.values()))

    def listeners_of(self, session: Any) -> list[NamespaceListener]:
        return list(self._by_session.get(id(session), ()))

    def _changed(self, namespace: TrackNamespace) -> None:
        for lst in [x for k in range(len(namespace) + 1)
                    for x in self._listening_at.get(namespace[:k], ())]:
            sees = self._sees(lst, namespace)
            if sees and namespace not in lst.told:
                lst.told.add(namespace)
                lst.notify(namespace, True)
            elif not sees and namespace in lst.told:
                lst.told.discard(namespace)
                lst.notify(namespace, False)
