"""The relay: composition of the namespace table, the Track registry, the store, upstream
links and authorization, answering every downstream request (§14, kvcs-draft 5.1–5.3)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets
import time
from collections.abc import Callable

from relay.logs import reason_of
from relay.moqt.codes import (
    SessionErrorCode,
)
from relay.moqt.kvp import kvps_from_bytes
from relay.moqt.primitives import FullTrackName, TrackNamespace
from relay.options import RelayOptions
from relay.session import (
    Connection,
    LinkError,
    MoqtSession,
    SessionConfig,
)
from relay.session.errors import SessionFailure
from storage.tiered import TieredStore

from . import loops
from .announce import UpwardAnnouncer
from .auth import Authorizer
from .counters import Counters
from .handler import RelayHandler
from .namespaces import NamespaceTable, PublisherEntry, Reach
from .persistence import Persistence
from .push import UpstreamPush
from .rendezvous import Rendezvous
from .routing import Routing
from .track import RelayTrack
from .upstream import UpstreamLink

log = logging.getLogger("kvcs.relay")



# The relay evaluates every Range filter on every path, so it advertises more Ranges than the
# session layer's client default (docs/relay.md, "Range filters").
RELAY_MAX_FILTER_RANGES = 16
# seconds between two looks at whether a pushed Track is committed yet, when nothing changes
LISTED_RECHECK = 5.0


def relay_session_config(options: RelayOptions) -> SessionConfig:
    """What every session of the relay advertises (SETUP) and tolerates: ``options.session``,
    else the session layer's own defaults but for MAX_FILTER_RANGES."""
    if options.session is not None:
        return options.session  # type: ignore[no-any-return]
    return SessionConfig(max_filter_ranges=RELAY_MAX_FILTER_RANGES)


class Relay:
    def __init__(self, store: TieredStore, *, options: RelayOptions | None = None,
                 authorizer: Authorizer | None = None, upstream: UpstreamLink | None = None,
                 clock: Callable[[], float] = time.time, announce_fields: int = 1,
                 upstream_token: bytes | None = None) -> None:
        self.store = store
        options = options or RelayOptions()
        self.options = dataclasses.replace(options, session=relay_session_config(options))
        self.auth = authorizer or Authorizer()
        self.namespaces = NamespaceTable()
        self.tracks: dict[FullTrackName, RelayTrack] = {}
        # the same Tracks by namespace: what the relay holds of a namespace is looked up
        # without a scan (a session with 10,000 learned namespaces ends at once)
        self.tracks_by_namespace: dict[TrackNamespace, dict[FullTrackName, RelayTrack]] = {}
        self.sessions: set[MoqtSession] = set()
        self.counters = Counters()
        self.upstream = upstream
        self.siblings: set[MoqtSession] = set()  # sessions to sibling workers and peers
        self.sibling_sessions: set[MoqtSession] = set()  # and theirs to this relay
        # tells this relay's own sibling links apart from its peers' (relay/core/siblings.py)
        self.instance = secrets.token_hex(8)
        self._created = 0
        self.sweep_every = 1024  # new Tracks between two sweeps of the registry
        self.draining = False
        self._connections = 0  # connections admitted, SETUP pending or done
        self.announcer: UpwardAnnouncer | None = None
        self.push: UpstreamPush | None = None
        self._listing: set[asyncio.Task[None]] = set()  # list_until_committed
        # who this relay is in loop probes (docs/relay.md, "Cycles"); start_relay names it
        # after its port once it listens, a supervisor's workers share their relay's
        self.relay_id = loops.new_relay_id(0)
        if upstream is not None:
            # requests the upstream relay routes down to us are answered from our own sources
            upstream.handler_factory = lambda: RelayHandler(self, reach=Reach.OWN)
            # and no session is used before a probe showed it does not lead back here
            upstream.verify = functools.partial(loops.verify, self, upstream)
            self.announcer = UpwardAnnouncer(self, upstream, announce_fields, upstream_token)
            if self.options.upstream_push:
                self.push = UpstreamPush(self)
        self.persistence = Persistence(store, self.namespaces, self.counters, clock)
        self.routing = Routing(self)
        # SUBSCRIBEs waiting for a publisher (RENDEZVOUS_TIMEOUT), woken by new sources
        self.rendezvous = Rendezvous()
        self.namespaces.on_add = self.rendezvous.appeared
        # told of every Track that gains a live upstream (SUBSCRIBE_TRACKS, track_offers.py)
        self.track_listeners: set[Callable[[RelayTrack], None]] = set()

    def list_until_committed(self, track: RelayTrack, entry: PublisherEntry) -> None:
        """``entry`` listed the namespace of a Track pushed here with PUBLISH, whose push has
        ended: it stays until LMDB holds the Track (the namespace is then listed for LMDB's
        sake, with no gap between), or until the Track can never be committed (it did not
        end with End of Track, its publisher failed, the registry forgot it). A first
        commit attempt can come before the last Group is whole; the namespace must not be
        withdrawn in between (the relay above would forget it and route nothing there)."""
        task = asyncio.ensure_future(self._listed(track, entry))
        self._listing.add(task)
        task.add_done_callback(self._listing.discard)

    async def _listed(self, track: RelayTrack, entry: PublisherEntry) -> None:
        try:
            while not track.committed and self.tracks.get(track.full_name) is track and \
                    track.store.known_final(track.key) is not None and \
                    not self.store.memory.is_aborted(track.key):
                await track.wait_change(LISTED_RECHECK)
        finally:
            self.namespaces.remove_publisher(entry)

    def links(self) -> list[tuple[str, MoqtSession]]:
        """Every session of the relay by the kind of link it is: ``upstream`` (to the
        upstream relay), ``sibling`` (to and from sibling workers and peer relays),
        ``lower_relay`` (a relay of the tree below this one) and ``client``."""
        found: list[tuple[str, MoqtSession]] = []
        if self.upstream is not None:
            found += [("upstream", s) for s in self.upstream.sessions()]
        found += [("sibling", s) for s in (*self.siblings, *self.sibling_sessions)
                  if not s.closed]
        found += [("lower_relay" if self.routing.is_tree_relay(s) else "client", s)
                  for s in self.sessions]
        return found

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
        except (SessionFailure, LinkError) as e:
            log.info("session setup failed: %s", reason_of(e))
            return
        handler.attach(session)
        # a sibling's session (a worker's, or a peer relay's: its SETUP said so) is the relay
        # talking to itself: not a client session in the metrics, and not sent GOAWAY (the
        # sibling drains on its own)
        sibling = handler.sibling
        if not sibling:
            self.sessions.add(session)
            self.counters.session_accepted(conn.transport)
        else:
            self.sibling_sessions.add(session)
        log.info("session open: %s %s%s", conn.transport, conn.remote_address,
                 " (sibling)" if sibling else "")
        try:
            code, reason = await session.wait_closed()
            if not sibling:
                self.counters.session_closed(conn.transport, code)
            # a close without a reason phrase ends the line at its code (no dangling blank)
            log.info("session closed: code 0x%x%s", code, f" {reason}" if reason else "")
        finally:
            self.sessions.discard(session)
            self.sibling_sessions.discard(session)
            self.routing.session_closed(session)
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
            self.tracks_by_namespace.setdefault(name.namespace, {})[name] = t
            t.counters = self.counters
            t.on_available = self._track_available
            stored = self.store.track_properties(t.key)
            if stored:  # a Track held in LMDB keeps its Track Properties across restarts
                t.set_properties(kvps_from_bytes(stored))
        return t

    def _track_available(self, track: RelayTrack) -> None:
        self.rendezvous.appeared(track.full_name.namespace)
        for listener in list(self.track_listeners):
            listener(track)

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
        self.routing.sweep_kept()
        return dropped

    def forget_if_idle(self, track: RelayTrack) -> None:
        """Drop the registry entry of a Track the relay knows nothing about (a refused
        SUBSCRIBE or FETCH for a name nobody publishes), so such requests cannot grow it."""
        if track.establishing is None and not track.upstreams and not track.forwarders and \
                track.largest() is None and self.tracks.get(track.full_name) is track:
            self._forget(track)

    def _forget(self, track: RelayTrack) -> None:
        name = track.full_name
        del self.tracks[name]
        same = self.tracks_by_namespace[name.namespace]
        del same[name]
        if not same:
            del self.tracks_by_namespace[name.namespace]
        self.store.memory.set_cache_duration(track.key, None)

    async def wait_committed(self, name: FullTrackName, timeout: float = 10.0) -> bool:
        t = self.tracks.get(name)
        return t is not None and await self.persistence.wait_committed(t, timeout)

    async def handle_sibling_connection(self, conn: Connection) -> None:
        """The transport handler of the sibling listener (docs/workers.md)."""
        await self._serve_connection(conn, sibling=True)

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
        if self.routing.upstream_namespaces is not None:
            self.routing.upstream_namespaces.close()
        for task in list(self._listing):
            task.cancel()
        if self.upstream is not None:
            await self.upstream.close()


__all__ = ["Counters", "Relay", "RelayHandler", "RelayOptions"]
