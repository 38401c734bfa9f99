"""The relay: composition of the namespace table, the Track registry, the store, upstream
links and authorization, answering every downstream request (§14, kvcs-draft 5.1–5.3)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from relay.logs import reason_of
from relay.moqt.codes import (
    SessionErrorCode,
)
from relay.moqt.primitives import FullTrackName
from relay.options import RelayOptions
from relay.session import (
    Connection,
    LinkError,
    MoqtSession,
    SessionConfig,
)
from relay.session.errors import SessionFailure
from storage.tiered import TieredStore

from .announce import UpwardAnnouncer
from .auth import Authorizer
from .counters import Counters
from .handler import RelayHandler
from .learned import LearnedNamespaces
from .loops import LoopProbe
from .namespaces import NamespaceTable, Reach
from .parts import RelayParts
from .persistence import Persistence
from .push import UpstreamPush
from .registry import TrackRegistry
from .rendezvous import Rendezvous
from .routing import Routing, is_tree_relay
from .upstream import UpstreamLink

log = logging.getLogger("kvcs.relay")



# The relay evaluates every Range filter on every path, so it advertises more Ranges than the
# session layer's client default (docs/relay.md, "Range filters").
RELAY_MAX_FILTER_RANGES = 16


def relay_session_config(options: RelayOptions) -> SessionConfig:
    """What every session of the relay advertises (SETUP) and tolerates: ``options.session``,
    else the session layer's own defaults but for MAX_FILTER_RANGES."""
    if options.session is not None:
        return options.session  # type: ignore[no-any-return]
    return SessionConfig(max_filter_ranges=RELAY_MAX_FILTER_RANGES)


class Relay:
    """The wiring: builds the core's parts, hands each the others it needs, and keeps them
    as attributes (what relay/service.py, the admin API, the metrics and tests reach)."""

    def __init__(self, store: TieredStore, *, options: RelayOptions | None = None,
                 authorizer: Authorizer | None = None, upstream: UpstreamLink | None = None,
                 clock: Callable[[], float] = time.time, announce_fields: int = 1,
                 upstream_token: bytes | None = None) -> None:
        self.store = store
        options = options or RelayOptions()
        self.options = options = dataclasses.replace(options,
                                                     session=relay_session_config(options))
        self.auth = auth = authorizer or Authorizer()
        self.namespaces = namespaces = NamespaceTable()
        self.sessions: set[MoqtSession] = set()
        self.counters = counters = Counters()
        self.upstream = upstream
        self.sibling_sessions: set[MoqtSession] = set()  # sibling workers' and peers' to us
        # tells this relay's own sibling links apart from its peers' (relay/core/siblings.py)
        self.instance = secrets.token_hex(8)
        self.draining = False
        self._connections = 0  # connections admitted, SETUP pending or done
        self.persistence = Persistence(store, namespaces, counters, clock,
                                       commit_delay=options.lmdb_commit_delay / 1000)
        # SUBSCRIBEs waiting for a publisher (RENDEZVOUS_TIMEOUT), woken by new sources
        self.rendezvous = Rendezvous()
        namespaces.on_add = self.rendezvous.appeared
        self.registry = registry = TrackRegistry(store, self.persistence.commit, counters,
                                                 namespaces, self.rendezvous.appeared)
        registry.ingest_hold_bytes = options.ingest_hold_bytes
        self.learned = LearnedNamespaces(namespaces, registry)
        registry.on_sweep = self.learned.sweep_kept
        self.routing = Routing(namespaces, self.learned, counters, options, upstream)
        # who this relay is in loop probes (docs/relay.md, "Cycles")
        self.loops = LoopProbe(counters, upstream)
        self.announcer: UpwardAnnouncer | None = None
        self.push: UpstreamPush | None = None
        if upstream is not None:
            self.announcer = UpwardAnnouncer(namespaces, auth, counters, upstream,
                                             announce_fields, upstream_token,
                                             options.default_fill_timeout)
            if options.upstream_push:
                self.push = UpstreamPush(upstream, counters, options.max_backlog_bytes,
                                         options.default_fill_timeout)
        self.parts = RelayParts(options, auth, counters, namespaces, registry, self.routing,
                                self.rendezvous, self.loops, self.instance, self.announcer,
                                self.push)
        if upstream is not None:
            # requests the upstream relay routes down to us are answered from our own sources
            upstream.handler_factory = lambda: RelayHandler(self.parts, reach=Reach.OWN)
            # and no session is used before a probe showed it does not lead back here
            upstream.verify = self.loops.verify
        # the registry's, under the names the service, the admin API and tests use
        self.tracks = registry.tracks
        self.tracks_by_namespace = registry.by_namespace
        self.track_listeners = registry.listeners
        self.siblings = self.routing.siblings  # sessions to sibling workers and peers
        self.track = registry.track
        self.sweep = registry.sweep
        self.forget_if_idle = registry.forget_if_idle
        self.list_until_committed = registry.list_until_committed

    @property
    def relay_id(self) -> str:
        """Who this relay is in loop probes: start_relay names it after its port once it
        listens, a supervisor's workers share their relay's."""
        return self.loops.relay_id

    @relay_id.setter
    def relay_id(self, value: str) -> None:
        self.loops.relay_id = value

    @property
    def sweep_every(self) -> int:
        return self.registry.sweep_every

    @sweep_every.setter
    def sweep_every(self, value: int) -> None:
        self.registry.sweep_every = value

    def add_sibling(self, session: MoqtSession, nsub: Any) -> None:
        """A link to a sibling is up (siblings.py's SiblingLinks hands it here)."""
        self.routing.add_sibling(session, nsub)

    def links(self) -> list[tuple[str, MoqtSession]]:
        """Every session of the relay by the kind of link it is: ``upstream`` (to the
        upstream relay), ``sibling`` (to and from sibling workers and peer relays),
        ``lower_relay`` (a relay of the tree below this one) and ``client``."""
        found: list[tuple[str, MoqtSession]] = []
        if self.upstream is not None:
            found += [("upstream", s) for s in self.upstream.sessions()]
        found += [("sibling", s) for s in (*self.siblings, *self.sibling_sessions)
                  if not s.closed]
        found += [("lower_relay" if is_tree_relay(s) else "client", s)
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
        handler = RelayHandler(self.parts, reach=Reach.NO_SIBLINGS if sibling else Reach.ALL)
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
        self.registry.close()
        if self.upstream is not None:
            await self.upstream.close()


__all__ = ["Counters", "Relay", "RelayHandler", "RelayOptions"]
