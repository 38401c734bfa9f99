"""The relay: composition of the namespace table, the Track registry, the store, upstream
links and authorization, answering every downstream request (§14, kvcs-draft 5.1–5.3)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache

from relay.moqt.codes import (
    GroupOrder,
    LocationFilterType,
    RequestErrorCode,
    SessionErrorCode,
)
from relay.moqt.kvp import kvps_from_bytes
from relay.moqt.location_filter import (
    LocationFilter,
)
from relay.moqt.params import Params
from relay.moqt.primitives import (
    FullTrackName,
    Location,
    TrackNamespace,
    format_namespace,
    prefixes_overlap,
)
from relay.session import (
    MoqtSession,
    RangeMarker,
    ReceivedObject,
    RequestRejected,
    SessionConfig,
    StreamAborted,
)
from relay.session.errors import SessionFailure
from relay.transport import Connection, TransportError
from storage.interface import (
    OBJECT_MAX,
)
from storage.tiered import TieredStore

from .announce import UpwardAnnouncer
from .auth import Authorizer
from .cache import stored_object
from .counters import Counters
from .handler import RelayHandler
from .namespaces import CACHE, NamespaceTable, PublisherEntry, Reach
from .persistence import Persistence
from .push import UpstreamPush
from .track import MarkerSpans, RelayTrack
from .upstream import UNREACHABLE, UpstreamLink

log = logging.getLogger("kvcs.relay")



# What a lower relay says in SETUP (MOQT_IMPLEMENTATION): the relay it announces to then asks
# it which namespaces it holds under each prefix it announced (SUBSCRIBE_NAMESPACE down).
RELAY_IMPLEMENTATION = "kvcs-relay/0.1 tree"


ABSENT_TRACKS = 4096  # Track names remembered as answered DOES_NOT_EXIST upstream


# The relay evaluates every Range filter on every path, so it advertises more Ranges than the
# session layer's client default (docs/relay.md, "Range filters").
RELAY_MAX_FILTER_RANGES = 16


def _relay_session_config() -> SessionConfig:
    return SessionConfig(max_filter_ranges=RELAY_MAX_FILTER_RANGES)


@dataclass
class RelayOptions:
    # What every session of the relay advertises (SETUP) and tolerates: the session layer's
    # own defaults (relay.session.SessionConfig) but for MAX_FILTER_RANGES. Its upstream
    # links use the same, with their own authorization token.
    session: SessionConfig = field(default_factory=_relay_session_config)
    # A subscriber's queued-but-unsent bytes beyond this end its subscription (TOO_FAR_BEHIND).
    max_backlog_bytes: int = 256 * 1024 * 1024
    # FILL_TIMEOUT when a fill or FETCH does not give one (seconds).
    default_fill_timeout: float = 5.0
    in_flight_wait: float = 1.0
    # Sessions served at once (setting up included); more are refused at once. 0: no bound.
    max_sessions: int = 0
    # With an upstream relay: PUBLISH to it every Track our publishers PUBLISH, as it
    # arrives (relay/core/push.py); off: Tracks are pulled from here on demand.
    upstream_push: bool = False


class Relay:
    def __init__(self, store: TieredStore, *, options: RelayOptions | None = None,
                 authorizer: Authorizer | None = None, upstream: UpstreamLink | None = None,
                 clock: Callable[[], float] = time.time, announce_fields: int = 2,
                 upstream_token: bytes | None = None) -> None:
        self.store = store
        self.options = options or RelayOptions()
        self.auth = authorizer or Authorizer()
        self.namespaces = NamespaceTable()
        self.tracks: dict[FullTrackName, RelayTrack] = {}
        self.sessions: set[MoqtSession] = set()
        self.counters = Counters()
        self.upstream = upstream
        self._fetches: dict[tuple[FullTrackName, Location, Location, Reach],
                            asyncio.Future[bool]] = {}
        self.siblings: set[MoqtSession] = set()  # sessions to sibling workers
        self._upstream_ns: dict[TrackNamespace, Any] = {}
        # namespaces learned from a source that has gone, of which Objects are still held
        self._kept_ns: dict[TrackNamespace, PublisherEntry] = {}
        self._created = 0
        self.sweep_every = 1024  # new Tracks between two sweeps of the registry
        self.draining = False
        self._connections = 0  # connections admitted, SETUP pending or done
        # lower relays' sessions and the prefixes followed on each (SUBSCRIBE_NAMESPACE down)
        self._children: dict[MoqtSession, dict[TrackNamespace, Any]] = {}
        # Tracks a source answered DOES_NOT_EXIST for (bounded): what the relay learned of a
        # Track's absence is served like what it learned of its Objects, also while the
        # upstream is unreachable (a consumer then moves on instead of seeing an outage)
        self._absent: LRUCache[FullTrackName, bool] = LRUCache(maxsize=ABSENT_TRACKS)
        self.announcer: UpwardAnnouncer | None = None
        self.push: UpstreamPush | None = None
        if upstream is not None:
            # requests the upstream relay routes down to us are answered from our own sources
            upstream.handler_factory = lambda: RelayHandler(self, reach=Reach.OWN)
            self.announcer = UpwardAnnouncer(self, upstream, announce_fields, upstream_token)
            if self.options.upstream_push:
                self.push = UpstreamPush(self)
        self.persistence = Persistence(store, self.namespaces, self.counters, clock)

    def _holds(self, namespace: TrackNamespace) -> bool:
        """Objects of a Track of ``namespace`` are cached here (memory or LMDB)."""
        return any(t.full_name.namespace == namespace and t.largest() is not None
                   for t in self.tracks.values())

    @property
    def session_config(self) -> SessionConfig:
        return self.options.session

    # -- sessions ---------------------------------------------------------------------------------

    async def handle_connection(self, conn: Connection) -> None:
        """The transport server's per-connection handler; refuses sessions beyond
        ``max_sessions`` before SETUP, so a refused one costs next to nothing."""
        limit = self.options.max_sessions
        if limit and self._connections >= limit:
            self.counters.sessions_refused += 1
            log.warning("session refused: %d sessions open (max_sessions)", self._connections)
            conn.close(SessionErrorCode.INTERNAL_ERROR, "too many sessions")
            return
        self._connections += 1
        try:
            await self._serve_connection(conn)
        finally:
            self._connections -= 1

    async def _serve_connection(self, conn: Connection, sibling: bool = False) -> None:
        handler = RelayHandler(self, reach=Reach.NO_SIBLINGS if sibling else Reach.ALL)
        try:
            session = await MoqtSession.start(conn, self.session_config, handler)
        except (SessionFailure, TransportError) as e:
            log.info("session setup failed: %s", e)
            return
        handler.attach(session)
        # a sibling worker's session is the relay talking to itself: not a client session
        # in the metrics, and not sent GOAWAY (the sibling drains on its own)
        if not sibling:
            self.sessions.add(session)
            self.counters.session_accepted(conn.transport)
        log.info("session open: %s %s%s", conn.transport, conn.remote_address,
                 " (sibling worker)" if sibling else "")
        try:
            code, reason = await session.wait_closed()
            # the peer chooses its close code: unknown codes share one bucket (bounded keys)
            known = code in SessionErrorCode._value2member_map_
            if not sibling:
                self.counters.session_closed(conn.transport, code if known else 0x1)
            log.info("session closed: code 0x%x %s", code, reason)
        finally:
            self.sessions.discard(session)
            self._children.pop(session, None)
            self.namespaces.remove_source(session)
            for lst in self.namespaces.listeners_of(session):
                self.namespaces.remove_listener(lst)

    def track(self, name: FullTrackName) -> RelayTrack:
        t = self.tracks.get(name)
        if t is None:
            self._created += 1
            if self._created % self.sweep_every == 0:
                self.sweep()
            t = self.tracks[name] = RelayTrack(name, self.store, self.persistence.commit)
            t.counters = self.counters
            stored = self.store.track_properties(t.key)
            if stored:  # a Track held in LMDB keeps its Track Properties across restarts
                t.set_properties(kvps_from_bytes(stored))
        return t

    def sweep(self) -> int:
        """Forget Tracks that have nothing left: no upstream, no subscriber, nothing cached
        in either tier. A long-running relay sees many publications come and go; their
        registry entries must not outlive their Objects. Returns how many were dropped."""
        dropped = 0
        for t in list(self.tracks.values()):
            if t.establishing is None and not t.upstreams and not t.forwarders and \
                    t.pending_commit is None and \
                    self.store.largest_object(t.key) is None:
                self._forget(t)
                dropped += 1
        for ns in [ns for ns in self._kept_ns if not self._holds(ns)]:
            self.namespaces.remove_publisher(self._kept_ns.pop(ns))
        return dropped

    def forget_kept_namespace(self, namespace: TrackNamespace) -> None:
        """A purge took what was kept of a namespace whose source has gone."""
        self._kept_ns.pop(namespace, None)

    def forget_if_idle(self, track: RelayTrack) -> None:
        """Drop the registry entry of a Track the relay knows nothing about (a refused
        SUBSCRIBE or FETCH for a name nobody publishes), so such requests cannot grow it."""
        if track.establishing is None and not track.upstreams and not track.forwarders and \
                track.largest() is None and self.tracks.get(track.full_name) is track:
            self._forget(track)

    def _forget(self, track: RelayTrack) -> None:
        del self.tracks[track.full_name]
        self.store.memory.set_cache_duration(track.key, None)

    async def wait_committed(self, name: FullTrackName, timeout: float = 10.0) -> bool:
        t = self.tracks.get(name)
        return t is not None and await self.persistence.wait_committed(t, timeout)

    async def expire(self) -> int:
        return await self.persistence.expire()

    # -- upstream ---------------------------------------------------------------------------------

    def _sources(self, namespace: TrackNamespace, reach: Reach = Reach.ALL) -> list[Any]:
        found: list[Any] = []
        for e in self.namespaces.publishers_for(namespace):
            src = e.source
            if src is CACHE or getattr(src, "closed", False) or src in found:
                continue
            if (reach is Reach.OWN and e.upstream) or \
                    (reach is Reach.NO_SIBLINGS and src in self.siblings):
                continue
            found.append(src)
        return found

    def not_sibling(self, entry: PublisherEntry) -> bool:
        """What a sibling worker may learn from this one: not what it learned from a sibling."""
        return entry.source not in self.siblings

    async def handle_sibling_connection(self, conn: Connection) -> None:
        """The transport handler of the sibling listener (docs/workers.md)."""
        await self._serve_connection(conn, sibling=True)

    def add_sibling(self, session: MoqtSession, nsub: Any) -> None:
        """A session to a sibling worker and its namespace subscription: what it announces
        becomes routable there, until either ends."""
        self.siblings.add(session)
        session.spawn(self._follow_sibling(session, nsub), "sibling-namespaces")

    async def _follow_sibling(self, session: MoqtSession, nsub: Any) -> None:
        try:
            await self._follow_namespaces(nsub, session)
        finally:
            self.siblings.discard(session)

    async def _upstream_session(self) -> MoqtSession | None:
        if self.upstream is None:
            return None
        return await self.upstream.get()

    async def _all_sources(self, track: RelayTrack, reach: Reach = Reach.ALL
                           ) -> list[MoqtSession]:
        """Where to ask for ``track``: its live publishers and lower relays (as ``reach``
        allows), then the upstream relay (unless the request came from it)."""
        sources: list[MoqtSession] = list(self._sources(track.full_name.namespace, reach))
        if reach is Reach.OWN:
            return sources
        up = await self._upstream_session()
        if up is not None and up not in sources:
            sources.append(up)
        return sources

    def _nowhere(self, reach: Reach) -> RequestRejected:
        """The refusal when no source may be asked: TIMEOUT while an upstream that could
        know is unreachable, else DOES_NOT_EXIST."""
        err = self.unreachable_error() if reach is not Reach.OWN else None
        return err or RequestRejected(RequestErrorCode.DOES_NOT_EXIST, "no publisher")

    async def ensure_upstream(self, track: RelayTrack, *, reach: Reach = Reach.ALL
                              ) -> RequestRejected | None:
        """One upstream subscription per Track (§14.4): reuse or establish it, from the
        sources ``reach`` allows."""
        while track.establishing is not None:
            await asyncio.shield(track.establishing)
        if track.live:
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        track.establishing = fut
        last: RequestRejected | None = None
        try:
            sources = await self._all_sources(track, reach)
            if not sources:
                return self._nowhere(reach)
            cold = track.largest() is None
            # our own choices, explicit so the upstream's defaults cannot change how we decode
            params = Params(location_filter=LocationFilter.next_object(), forward=True,
                            group_order=GroupOrder.ASCENDING,
                            fill=Params(location_filter=LocationFilter.absolute_start(0, 0),
                                        group_order=GroupOrder.ASCENDING)
                            if cold else None)
            for src in sources:
                try:
                    sub = await asyncio.wait_for(
                        src.subscribe(track.full_name.namespace, track.full_name.name, params),
                        self.options.default_fill_timeout)
                except RequestRejected as e:
                    last = e
                    self.learned(track, e)
                    continue
                except (SessionFailure, TransportError, TimeoutError) as e:
                    last = self._unanswered("SUBSCRIBE", track, e)
                    continue
                self.learned(track, None)
                self.counters.upstream_subscriptions += 1
                track.attach_upstream(sub)
                src.spawn(track.ingest(sub), "ingest")
                return None
            return last or RequestRejected(RequestErrorCode.DOES_NOT_EXIST, "no publisher")
        finally:
            track.establishing = None
            fut.set_result(None)

    def learned(self, track: RelayTrack, e: RequestRejected | None) -> None:
        """A source's answer about ``track``: DOES_NOT_EXIST is remembered, anything it
        served forgets that."""
        if e is None:
            self._absent.pop(track.full_name, None)
        elif e.code == RequestErrorCode.DOES_NOT_EXIST and self.upstream is not None:
            # only used while an upstream is unreachable (in_outage): a relay without one
            # keeps no per-request memory of refusals
            self._absent[track.full_name] = True

    def in_outage(self, track: RelayTrack, err: RequestRejected) -> RequestRejected:
        """The refusal to give while the upstream is unreachable: DOES_NOT_EXIST for a
        Track the relay holds nothing of and a source said does not exist (what it learned
        still holds), else ``err`` (TIMEOUT: it may exist up there)."""
        if err.reason == UNREACHABLE and track.largest() is None and \
                track.full_name in self._absent:
            return RequestRejected(RequestErrorCode.DOES_NOT_EXIST,
                                   "does not exist (as learned before the upstream became "
                                   "unreachable)")
        return err

    @staticmethod
    def _unanswered(what: str, track: RelayTrack, e: Exception) -> RequestRejected:
        """A source that failed or did not answer in time: logged, and the refusal to give
        if no other source answers (the Track may exist there: TIMEOUT, not DOES_NOT_EXIST)."""
        log.warning("upstream %s for %r failed: %s", what, track, e or "no answer in time")
        return RequestRejected(RequestErrorCode.TIMEOUT, UNREACHABLE)

    def unreachable_error(self) -> RequestRejected | None:
        """The refusal of a request only the upstream relay could answer while it is
        unreachable: TIMEOUT, never DOES_NOT_EXIST (the Track may well exist up there)."""
        if self.upstream is None or not self.upstream.unreachable:
            return None
        return RequestRejected(RequestErrorCode.TIMEOUT, UNREACHABLE)

    async def fetch_upstream(self, track: RelayTrack, start: Location, end: Location, *,
                             reach: Reach = Reach.ALL) -> bool:
        """Upstream FETCH of [start, end] into the cache; concurrent identical misses share
        one request (§14.7, coalescing). ``reach``: see :meth:`ensure_upstream`."""
        key = (track.full_name, start, end, reach)
        pending = self._fetches.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._fetches[key] = fut
        ok = False
        try:
            ok = await self._do_fetch(track, start, end, reach)
        finally:
            del self._fetches[key]
            fut.set_result(ok)
        return ok

    async def _do_fetch(self, track: RelayTrack, start: Location, end: Location,
                        reach: Reach = Reach.ALL) -> bool:
        sources = await self._all_sources(track, reach)
        # Open-ended and whole-Group ends use the filters made for them (some peers reject
        # an explicit End Object of 2^64-1).
        if end.group == OBJECT_MAX and end.object == OBJECT_MAX:
            lf = LocationFilter.absolute_start(start.group, start.object)
        elif end.object == OBJECT_MAX:
            lf = LocationFilter.absolute_group_end(start.group, start.object, end.group)
        else:
            lf = LocationFilter.absolute_range(start, end)
        for src in sources:
            try:
                resp = await src.fetch(track.full_name.namespace, track.full_name.name,
                                       Params(location_filter=lf,
                                              group_order=GroupOrder.ASCENDING))
                self.counters.upstream_fetches += 1
                self.learned(track, None)
                if resp.end_location is not None and resp.end_location.object != OBJECT_MAX:
                    # End Location is at most the responder's Largest Object (§7.10) —
                    # unless it is {G, 2^64-1}, "all of Group G" (a convention some peers
                    # still answer with): no Object is there, so it says nothing of L
                    track.note_largest(resp.end_location)
                spans = MarkerSpans(start)
                async for ev in resp:
                    if isinstance(ev, ReceivedObject):
                        self.counters.upstream_fetched_objects += 1
                        spans.object(ev.location)
                        track.append_fetched(stored_object(ev))
                    elif isinstance(ev, RangeMarker):
                        spans.marker(ev)
                # FIN, no Range filters: what was skipped up to End Location does not exist
                # (§10 item 6), except the ranges upstream marked Unknown or Timed-Out: they
                # stay unknown here and are asked for again (§14.9). For "all of Group G",
                # End Location is the last Location the responder knows in G (§7.10); once
                # the Track has moved past G, G ends there.
                covered = resp.end_location
                if covered is not None:
                    largest = track.largest()
                    if lf.type == LocationFilterType.ABSOLUTE_START_GROUP_END and \
                            covered.group == end.group and largest is not None and \
                            largest.group > end.group:
                        covered = end
                    track.mark_absent(spans.absent(start, min(end, covered)))
                return True
            except (RequestRejected, StreamAborted, SessionFailure, TransportError) as e:
                if isinstance(e, RequestRejected):
                    self.learned(track, e)
                log.info("upstream FETCH for %r failed: %s", track, e)
        return False

    async def track_status_upstream(self, track: RelayTrack, reach: Reach = Reach.ALL
                                    ) -> RequestRejected | None:
        """TRACK_STATUS forwarded to the Track's publishers / upstream relay, bounded by the
        default FILL_TIMEOUT; what it learns (Largest Object, Track Properties) is kept.
        Returns the refusal to give when no source answered because of an outage."""
        sources = await self._all_sources(track, reach)
        # after the lookup: a dial to the upstream that just failed makes it unreachable
        err = self.unreachable_error() if reach is not Reach.OWN else None
        for src in sources:
            try:
                ok = await asyncio.wait_for(
                    src.track_status(track.full_name.namespace, track.full_name.name),
                    self.options.default_fill_timeout)
            except RequestRejected as e:
                log.info("upstream TRACK_STATUS for %r refused: %s", track, e)
                self.learned(track, e)
                continue
            except (TimeoutError, SessionFailure, TransportError) as e:
                err = self._unanswered("TRACK_STATUS", track, e)
                continue
            if ok.params.largest_object is None:
                continue
            track.note_largest(ok.params.largest_object)
            if ok.track_properties and not track.properties:
                track.set_properties(ok.track_properties)
            return None
        return err

    async def subscribe_namespace_upstream(self, prefix: TrackNamespace) -> None:
        """Aggregated SUBSCRIBE_NAMESPACE upstream; what it announces becomes routable there."""
        if prefix in self._upstream_ns or self.upstream is None:
            return
        up = await self._upstream_session()
        if up is None:
            return
        for existing in self._upstream_ns:
            if prefixes_overlap(existing, prefix) and len(existing) <= len(prefix):
                return  # an existing upstream prefix already covers it
        self._upstream_ns[prefix] = None
        try:
            nsub = await up.subscribe_namespace(prefix)
        except (RequestRejected, SessionFailure, TransportError) as e:
            log.info("upstream SUBSCRIBE_NAMESPACE failed: %s", e)
            self._upstream_ns.pop(prefix, None)
            return
        self._upstream_ns[prefix] = nsub
        up.spawn(self._follow_upstream_namespaces(prefix, nsub, up), "upstream-namespaces")

    async def _follow_upstream_namespaces(self, prefix: TrackNamespace, nsub: Any,
                                          up: MoqtSession) -> None:
        try:
            await self._follow_namespaces(nsub, up)
        finally:
            self._upstream_ns.pop(prefix, None)

    def follow_child(self, session: MoqtSession, prefix: TrackNamespace
                     ) -> Callable[[], None]:
        """A lower relay announced ``prefix`` (one PUBLISH_NAMESPACE per prefix, however
        many publications under it): ask it which namespaces it holds there
        (SUBSCRIBE_NAMESPACE down that session), so discovery anywhere in the tree finds
        them. They are this relay's own namespaces (announced further up, and requests
        for them routed down). Returns what stops following (the announcement ended)."""
        setup = session.peer_setup
        followed = self._children.setdefault(session, {})
        if setup is None or setup.moqt_implementation != RELAY_IMPLEMENTATION or \
                any(prefixes_overlap(p, prefix) for p in followed):
            return lambda: None
        task = session.spawn(self._follow_child(session, prefix), "child-namespaces")
        followed[prefix] = task

        def stop() -> None:
            if followed.get(prefix) is task:
                del followed[prefix]
                task.cancel()
        return stop

    async def _follow_child(self, session: MoqtSession, prefix: TrackNamespace) -> None:
        try:
            nsub = await asyncio.wait_for(session.subscribe_namespace(prefix),
                                          self.options.default_fill_timeout)
        except (RequestRejected, SessionFailure, TransportError, TimeoutError) as e:
            log.info("lower relay's namespaces under %s not followed: %s",
                     format_namespace(prefix), e or "no answer in time")
            return
        try:
            await self._follow_namespaces(nsub, session, upstream=False)
        finally:
            nsub.cancel()

    async def _follow_namespaces(self, nsub: Any, source: MoqtSession, *,
                                 upstream: bool = True) -> None:
        """What a namespace subscription to ``source`` announces is routable there, until
        withdrawn or the subscription ends. ``upstream``: learned from the upstream relay or
        a sibling worker (not this relay's own, see PublisherEntry)."""
        entries: dict[TrackNamespace, PublisherEntry] = {}
        try:
            async for ev in nsub:
                if ev.active:
                    e = PublisherEntry(ev.namespace, source, upstream=upstream)
                    entries[ev.namespace] = e
                    self.namespaces.add_publisher(e)
                else:
                    e2 = entries.pop(ev.namespace, None)
                    if e2 is not None:
                        self.namespaces.remove_publisher(e2)
        except SessionFailure:
            pass
        finally:
            for e in entries.values():
                if upstream and e.namespace not in self._kept_ns and \
                        self._holds(e.namespace):
                    # the source is gone, not the namespace: what this relay holds of it
                    # stays discoverable and served (as learned, like its Objects) until
                    # the registry forgets its last Track (sweep)
                    kept = self._kept_ns[e.namespace] = PublisherEntry(e.namespace, CACHE)
                    self.namespaces.add_publisher(kept)
                self.namespaces.remove_publisher(e)

    # -- shutdown ---------------------------------------------------------------------------------

    async def goaway_all(self) -> None:
        self.draining = True
        await asyncio.gather(*(s.goaway() for s in list(self.sessions)),
                             return_exceptions=True)

    async def close(self) -> None:
        await self.persistence.close(list(self.tracks.values()))
        for s in list(self.sessions):
            s.close(SessionErrorCode.NO_ERROR, "relay shutting down")
        if self.announcer is not None:
            await self.announcer.close()
        if self.upstream is not None:
            await self.upstream.close()


__all__ = ["Counters", "Relay", "RelayHandler", "RelayOptions"]
