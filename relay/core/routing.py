"""Where a request the relay cannot answer from its cache goes: its own publishers and lower
relays (as the request's `Reach` allows), then the upstream relay; one upstream subscription
per Track (§14.4), coalesced FETCH misses (§14.7), TRACK_STATUS, namespace subscriptions up
(upstream_namespaces.py), down to lower relays and to sibling workers (what they announce is
learned in learned.py), and what it learned of a Track's absence (served during an upstream
outage).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache

from relay.logs import reason_of
from relay.moqt.codes import GroupOrder, LocationFilterType, RequestErrorCode
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import (
    FullTrackName,
    Location,
    TrackNamespace,
    format_namespace,
    prefixes_overlap,
)
from relay.session import (
    FetchResponse,
    LinkError,
    MoqtSession,
    RangeMarker,
    ReceivedObject,
    RequestRejected,
    StreamAborted,
)
from relay.session.errors import SessionFailure
from storage.interface import OBJECT_MAX

from .announce import RETRY_FIRST, RETRY_MAX
from .cache import stored_object
from .namespaces import CACHE, PublisherEntry, Reach
from .spans import MarkerSpans
from .track import RelayTrack
from .upstream import UNREACHABLE
from .upstream_namespaces import UpstreamNamespaces

if TYPE_CHECKING:
    from relay.options import RelayOptions

    from .counters import Counters
    from .learned import LearnedNamespaces
    from .namespaces import NamespaceTable
    from .upstream import UpstreamLink

log = logging.getLogger("kvcs.relay")

# What a lower relay says in SETUP (MOQT_IMPLEMENTATION): the relay it announces to then asks
# it which namespaces it holds under each prefix it announced (SUBSCRIBE_NAMESPACE down).
RELAY_IMPLEMENTATION = "kvcs-relay/0.1 tree"

ABSENT_TRACKS = 4096  # Track names remembered as answered DOES_NOT_EXIST upstream


def upstream_fill(wanted: LocationFilter | None) -> LocationFilter:
    """Where a cold relay's upstream fill starts: where the downstream fill that made it
    subscribe starts (§14.5 step 5: that range or a wider one), open-ended since upstream
    clips it to its L, which is the relay's L too. A subscriber that fills only the current
    Group (Relative Start 1: moq-rs, the KVCS manifest) then waits for that Group alone,
    not behind the whole history; {0,0} when nobody asked for a fill. Later subscribers
    FETCH what lies before it."""
    if wanted is not None and wanted.type == LocationFilterType.RELATIVE_START:
        return LocationFilter.relative_start(wanted.start_group)
    if wanted is not None and wanted.is_absolute:
        return LocationFilter.absolute_start(wanted.start_group, wanted.start_object)
    return LocationFilter.absolute_start(0, 0)

# The MOQT_IMPLEMENTATION of every session this code makes (relays of a tree, sibling
# workers and peers, our publishers and consumers).
KVCS_IMPLEMENTATIONS = ("kvcs-relay/",)


def runs_this_code(session: MoqtSession) -> bool:
    """The peer says in SETUP it runs this code: it may be sent what only this code answers
    (FILL_TIMEOUT on an upstream FETCH: moq-rs 0.5.1 refuses a FETCH with one, REQUEST_ERROR
    NOT_SUPPORTED "FILL_TIMEOUT not supported"; a loop probe)."""
    return session.peer_implementation.startswith(KVCS_IMPLEMENTATIONS)


def _fill_timeout(src: MoqtSession, budget: float) -> int | None:
    return int(budget * 1000) if runs_this_code(src) else None


def is_tree_relay(session: MoqtSession) -> bool:
    """A lower relay of this tree (it says so in SETUP): what it announces is learned
    namespace by namespace (``Routing.follow_child``), not routed by its prefix."""
    return session.peer_implementation == RELAY_IMPLEMENTATION


class Routing:
    def __init__(self, namespaces: NamespaceTable, learned: LearnedNamespaces,
                 counters: Counters, options: RelayOptions,
                 upstream: UpstreamLink | None) -> None:
        self.namespaces = namespaces
        self.learned_namespaces = learned
        self.counters = counters
        self.options = options
        self.upstream = upstream
        self.siblings: set[MoqtSession] = set()  # sessions to sibling workers and peers
        self._fetches: dict[tuple[FullTrackName, Location, Location, Reach],
                            asyncio.Future[bool]] = {}
        # SUBSCRIBE_NAMESPACE upstream, held while local listeners need them
        self.upstream_namespaces: UpstreamNamespaces | None = \
            UpstreamNamespaces(learned, upstream) if upstream is not None else None
        # lower relays' sessions and the prefixes followed on each (SUBSCRIBE_NAMESPACE down)
        self._children: dict[MoqtSession, dict[TrackNamespace, Any]] = {}
        # Tracks a source answered DOES_NOT_EXIST for (bounded): what the relay learned of a
        # Track's absence is served like what it learned of its Objects, also while the
        # upstream is unreachable (a consumer then moves on instead of seeing an outage)
        self._absent: LRUCache[FullTrackName, bool] = LRUCache(maxsize=ABSENT_TRACKS)

    def session_closed(self, session: MoqtSession) -> None:
        self._children.pop(session, None)

    def sources(self, namespace: TrackNamespace, reach: Reach = Reach.ALL) -> list[Any]:
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

    def add_sibling(self, session: MoqtSession, nsub: Any) -> None:
        """A session to a sibling worker and its namespace subscription: what it announces
        becomes routable there, until either ends."""
        self.siblings.add(session)
        session.spawn(self._follow_sibling(session, nsub), "sibling-namespaces")

    async def _follow_sibling(self, session: MoqtSession, nsub: Any) -> None:
        try:
            await self.learned_namespaces.follow(nsub, session)
        finally:
            self.siblings.discard(session)

    async def _upstream_session(self) -> MoqtSession | None:
        """Where a request goes up: a session of the link with a stream left for it."""
        if self.upstream is None:
            return None
        return await self.upstream.for_request()

    async def _all_sources(self, track: RelayTrack, reach: Reach = Reach.ALL
                           ) -> list[MoqtSession]:
        """Where to ask for ``track``: its live publishers and lower relays (as ``reach``
        allows), then the upstream relay (unless the request came from it)."""
        sources: list[MoqtSession] = list(self.sources(track.full_name.namespace, reach))
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

    async def ensure_upstream(self, track: RelayTrack, *, reach: Reach = Reach.ALL,
                              fill: LocationFilter | None = None) -> RequestRejected | None:
        """One upstream subscription per Track (§14.4): reuse or establish it, from the
        sources ``reach`` allows. ``fill``: the Location filter of the downstream fill that
        asks, which a cold relay's own fill starts from (``upstream_fill``)."""
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
                            fill=Params(location_filter=upstream_fill(fill),
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
                except (SessionFailure, LinkError, TimeoutError) as e:
                    last = self._unanswered("SUBSCRIBE", track, e)
                    continue
                self.learned(track, None, src)
                self.counters.upstream_subscriptions += 1
                track.attach_upstream(sub)
                src.spawn(track.ingest(sub), "ingest")
                return None
            return last or RequestRejected(RequestErrorCode.DOES_NOT_EXIST, "no publisher")
        finally:
            track.establishing = None
            fut.set_result(None)

    def learned(self, track: RelayTrack, e: RequestRejected | None,
                source: MoqtSession | None = None) -> None:
        """A source's answer about ``track``: DOES_NOT_EXIST is remembered, anything it
        served forgets that. Served by the upstream relay or a sibling worker: the Track's
        namespace stays discoverable here while the relay holds Objects of it (kept, as
        learned), whether or not anyone here still follows the upstream's namespaces."""
        if e is None:
            self._absent.pop(track.full_name, None)
            up = self.upstream
            if source is not None and (source in self.siblings or
                                       (up is not None and up.owns(source))):
                self.learned_namespaces.keep(track.full_name.namespace)
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
        log.warning("upstream %s for %r failed: %s", what, track, reason_of(e))
        return RequestRejected(RequestErrorCode.TIMEOUT, UNREACHABLE)

    def unreachable_error(self) -> RequestRejected | None:
        """The refusal of a request only the upstream relay could answer while it is
        unreachable: TIMEOUT, never DOES_NOT_EXIST (the Track may well exist up there)."""
        if self.upstream is None or not self.upstream.unreachable:
            return None
        return RequestRejected(RequestErrorCode.TIMEOUT, UNREACHABLE)

    async def fetch_upstream(self, track: RelayTrack, start: Location, end: Location,
                             budget: float, *, reach: Reach = Reach.ALL) -> bool:
        """Upstream FETCH of [start, end] into the cache; concurrent identical misses share
        one request (§14.7, coalescing). ``budget``: seconds left of the downstream
        request's FILL_TIMEOUT, passed on as the upstream FETCH's own (§14.7; to our own
        peers only, see ``runs_this_code``), so every hop of a tree spends the
        consumer's budget, not its default. ``reach``: see :meth:`ensure_upstream`."""
        key = (track.full_name, start, end, reach)
        pending = self._fetches.get(key)
        if pending is None:
            fut: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
            self._fetches[key] = fut
            # cut short (the caller's budget ran out, or it went away): what lies there is
            # unknown to those sharing it, as when a source fails, never "absent"
            ok: bool | None = None
            try:
                ok = await self._do_fetch(track, start, end, budget, reach)
            finally:
                del self._fetches[key]
                fut.set_result(ok)
        else:
            ok = await asyncio.shield(pending)
        if ok is None:
            # a source took the FETCH and failed (its fetch stream reset, its session gone):
            # what lies there is unknown, as if unanswered in time (TIMEOUT, not absent)
            raise TimeoutError("every source that took the upstream FETCH failed")
        return ok

    def fetch_in_flight(self, track: RelayTrack, at: Location, *, reach: Reach = Reach.ALL
                        ) -> asyncio.Future[bool | None] | None:
        """The upstream FETCH on its way for ``track`` whose range holds ``at``, if any: its
        Objects are cached as they arrive (``_do_fetch``). Only one asked with the same
        ``reach``: a sibling's or the upstream relay's request waiting for a client's FETCH
        that went to that sibling or up could wait for itself (until FILL_TIMEOUT)."""
        for (name, start, end, r), fut in self._fetches.items():
            if name == track.full_name and r is reach and start <= at <= end \
                    and not fut.done():
                return fut
        return None

    async def _do_fetch(self, track: RelayTrack, start: Location, end: Location,
                        budget: float, reach: Reach = Reach.ALL) -> bool | None:
        """True: a source answered the range; False: none has it (refused, or no source);
        None: a source failed while answering and none answered.

        The upstream fetch stream is read here, and only here, as fast as the cache takes
        its Objects: receive credit for it follows what this relay has cached, whoever
        waits downstream. Whatever ends this early (the budget ran out, the request that
        asked went away) ends the upstream FETCH too: a fetch stream left unread would hold
        its unread bytes against the session's receive window until the session ends, and
        on aioquic, whose connection window counts every stream, a few such streams stall
        every other stream of the upstream link (docs/relay.md, "Trees")."""
        failed = False
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
            resp: FetchResponse | None = None
            try:
                resp = await src.fetch(track.full_name.namespace, track.full_name.name,
                                       Params(location_filter=lf,
                                              group_order=GroupOrder.ASCENDING,
                                              fill_timeout=_fill_timeout(src, budget)))
                self.counters.upstream_fetches += 1
                self.learned(track, None, src)
                if resp.end_location is not None and resp.end_location.object != OBJECT_MAX:
                    # End Location is at most the responder's Largest Object (§7.10) —
                    # unless it is {G, 2^64-1}, "all of Group G" (a convention some peers
                    # still answer with): no Object is there, so it says nothing of L
                    track.note_largest(resp.end_location)
                spans = MarkerSpans(start)
                async for ev in resp:
                    if isinstance(ev, ReceivedObject):
                        self.counters.upstream_fetched_objects += 1
                        skipped = spans.gap_before(ev.location)
                        spans.object(ev.location)
                        track.append_fetched(stored_object(ev))
                        if skipped:  # known now, so a FETCH served meanwhile goes past it
                            track.mark_absent(skipped)
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
            except (RequestRejected, StreamAborted, SessionFailure, LinkError) as e:
                if isinstance(e, RequestRejected):
                    self.learned(track, e)
                else:
                    failed = True
                log.info("upstream FETCH for %r failed: %s", track, reason_of(e))
            finally:
                if resp is not None and not resp.ended:
                    resp.cancel()  # stopped reading before its end: end it (see above)
        return None if failed else False

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
            except (TimeoutError, SessionFailure, LinkError) as e:
                err = self._unanswered("TRACK_STATUS", track, e)
                continue
            if ok.params.largest_object is None:
                continue
            track.note_largest(ok.params.largest_object)
            if ok.track_properties and not track.properties:
                track.set_properties(ok.track_properties)
            return None
        return err

    is_tree_relay = staticmethod(is_tree_relay)

    def follow_child(self, session: MoqtSession, prefix: TrackNamespace,
                     admit: Callable[[TrackNamespace], bool]) -> Callable[[], None]:
        """A lower relay announced ``prefix`` (one PUBLISH_NAMESPACE, however many
        publications and scopes under it): ask it which namespaces it holds there
        (SUBSCRIBE_NAMESPACE down that session, one stream for all of them), so discovery
        anywhere in the tree finds them. Those ``admit`` lets in (what its token may
        publish) are this relay's own namespaces (announced further up, and requests for
        them routed down). Returns what stops following (the announcement ended)."""
        followed = self._children.setdefault(session, {})
        if any(prefixes_overlap(p, prefix) for p in followed):
            return lambda: None
        task = session.spawn(self._follow_child(session, prefix, admit), "child-namespaces")
        followed[prefix] = task

        def stop() -> None:
            if followed.get(prefix) is task:
                del followed[prefix]
                task.cancel()
        return stop

    async def _follow_child(self, session: MoqtSession, prefix: TrackNamespace,
                            admit: Callable[[TrackNamespace], bool]) -> None:
        """Followed for as long as the announcement lives: a subscription that could not be
        made (no answer in time, no stream credit yet) or that the lower relay ended is
        asked again after a pause (doubling, capped), never given up."""
        pause = RETRY_FIRST
        while not session.closed:
            try:
                nsub = await asyncio.wait_for(session.subscribe_namespace(prefix),
                                              self.options.default_fill_timeout)
            except (RequestRejected, SessionFailure, LinkError, TimeoutError) as e:
                log.info("lower relay's namespaces under %s not followed yet: %s",
                         format_namespace(prefix), reason_of(e))
            else:
                pause = RETRY_FIRST
                try:
                    await self.learned_namespaces.follow(nsub, session, upstream=False, admit=admit)
                finally:
                    nsub.cancel()
            if session.closed:
                return
            await asyncio.sleep(pause)  # a back-off timer: nothing to wait on
            pause = min(pause * 2, RETRY_MAX)


__all__ = ["Routing"]
