"""Answering one downstream session's requests on behalf of the Relay: PUBLISH_NAMESPACE,
PUBLISH, SUBSCRIBE_NAMESPACE, SUBSCRIBE (with fills), REQUEST_UPDATE, FETCH, TRACK_STATUS
(§14.4–§14.8, kvcs-draft 5.1–5.3)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, cast

from relay.moqt.codes import (
    GroupOrder,
    LocationFilterType,
    ObjectStatus,
    PropertyType,
    PublishDoneCode,
    RequestErrorCode,
    SessionErrorCode,
)
from relay.moqt.errors import RequestError
from relay.moqt.location_filter import (
    LocationFilter,
    resolve_fetch_range,
    resolve_subscription_range,
)
from relay.moqt.params import Params, check_filter_ranges
from relay.moqt.primitives import (
    FullTrackName,
    Location,
    TrackNamespace,
    format_full_track_name,
    format_namespace,
    prefixes_overlap,
)
from relay.moqt.range_filter import ObjectFilter, override_filters
from relay.session import (
    IncomingFetch,
    IncomingPublish,
    IncomingPublishNamespace,
    IncomingSubscribe,
    IncomingSubscribeNamespace,
    IncomingSubscribeTracks,
    IncomingTrackStatus,
    LinkError,
    MoqtSession,
    RequestRejected,
    ServedSubscription,
    SessionHandler,
)
from relay.session.base import SessionBase
from relay.session.errors import SessionFailure
from relay.session.requests import IncomingRequest, IncomingTrackRequest
from storage.interface import OBJECT_MAX

from . import cache, loops
from .announce import AnnouncedAuthority
from .auth import Authorizer, Role, token_values
from .forwarder import Forwarder
from .namespaces import CACHE, NamespaceListener, PublisherEntry, Reach, not_from, own_source
from .scheduler import DEFAULT_SUBSCRIBER_PRIORITY, ScheduledWriter, SessionScheduler
from .siblings import SELF_LINK, sibling_instance
from .track import RelayTrack
from .track_offers import TrackOffers
from .upstream import UNREACHABLE
from .upstream_namespaces import UPSTREAM_ANSWER_WAIT

if TYPE_CHECKING:
    from .parts import RelayParts

log = logging.getLogger("kvcs.relay")



def _moqt_session(req: IncomingRequest | ServedSubscription) -> MoqtSession:
    """The MOQT session of a request the relay serves (the session layer types it by its
    base class: every session the relay accepts is a MoqtSession)."""
    return cast(MoqtSession, req.session)


def _tokens(session: MoqtSession | None, params: Params) -> list[bytes]:
    tokens = token_values(params.authorization_tokens)
    if session is not None and session.peer_setup is not None:
        tokens += token_values(session.peer_setup.authorization_tokens)
    return tokens


# Peers known to close their session on a namespace field that is not UTF-8 (moq-rs 0.5.1:
# "invalid string"), by their MOQT_IMPLEMENTATION. KVCS namespace fields are raw octets, which
# MOQT allows: such a peer is told of text namespaces only, so one client's binary namespace
# cannot break every session of another implementation (docs/relay.md, moq-rs).
TEXT_ONLY_IMPLEMENTATIONS = ("moq-lite",)


def _text_only(session: MoqtSession) -> bool:
    return session.peer_implementation.startswith(TEXT_ONLY_IMPLEMENTATIONS)


def _is_text(namespace: TrackNamespace) -> bool:
    try:
        for f in namespace:
            bytes(f).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _group_order(track: RelayTrack, *chosen: GroupOrder | None) -> GroupOrder:
    """A fill's effective Group Order (§9.4): the first one chosen, else the Track's
    DEFAULT_PUBLISHER_GROUP_ORDER property, else Ascending — what the subscriber decodes with."""
    for order in chosen:
        if order is not None:
            return order
    for p in track.properties:
        if p.type == PropertyType.DEFAULT_PUBLISHER_GROUP_ORDER and \
                p.value in GroupOrder._value2member_map_:
            return GroupOrder(p.value)
    return GroupOrder.ASCENDING


def _fill_filter(params: Params) -> LocationFilter | None:
    """The Location filter of a request's fill (§9.2: its own, else the subscription's;
    None: no fill asked, or the whole Track)."""
    if params.fill is None:
        return None
    lf = params.fill.location_filter
    if lf is None:
        lf = params.location_filter
    return None if lf is None or lf.type == LocationFilterType.NONE else lf


def _props(track: RelayTrack, params: Params) -> tuple[Any, ...]:
    """The Track's Properties as received upstream, unless INCLUDE_PROPERTIES is 0 (§12)."""
    return () if params.include_properties is False else tuple(track.properties)


class RelayHandler(SessionHandler):
    """Answers one downstream session's requests on behalf of the Relay."""

    def __init__(self, relay: RelayParts, *, reach: Reach = Reach.ALL) -> None:
        self.relay = relay  # the relay's parts its requests reach (parts.py)
        # where the session's requests may be sent on (see Reach): a sibling worker's
        # (docs/workers.md) never back to a sibling, so a request never travels between
        # workers twice; the upstream relay's (docs/relay.md, "Trees") only down, to this
        # relay's own sources. Both hear only of this relay's own namespaces.
        self.reach = reach
        self.session: MoqtSession | None = None
        self._scheduler: SessionScheduler | None = None
        # Tracks this session's SUBSCRIBEs are for, while they run (held ones included)
        self.subscribing: dict[FullTrackName, int] = {}
        self.track_offers: list[TrackOffers] = []  # its SUBSCRIBE_TRACKS, while they live

    @property
    def sibling(self) -> bool:
        return self.reach is Reach.NO_SIBLINGS

    def _fetch_upstream(self, track: RelayTrack, start: Location, end: Location,
                        budget: float) -> Awaitable[bool]:
        return self.relay.routing.fetch_upstream(track, start, end, budget, reach=self.reach)

    def attach(self, session: MoqtSession) -> None:
        self.session = session

    def setup_received(self, session: SessionBase) -> None:
        """A peer relay's link (SETUP says so, relay/core/siblings.py) is a sibling's: its
        requests are served from this relay's own sources only, from the first one on. One
        from this relay itself (its own URL among its peers) is closed."""
        instance = sibling_instance(cast(MoqtSession, session).peer_setup)
        if instance is None or self.reach is not Reach.ALL:
            return
        self.reach = Reach.NO_SIBLINGS
        if instance == self.relay.instance:
            session.close(SessionErrorCode.NO_ERROR, SELF_LINK)

    def answered(self, req: Any, code: int | None) -> None:
        if self.sibling or (isinstance(req, IncomingTrackStatus) and
                            loops.is_probe(req.namespace)):
            return  # the relay's own traffic (with its siblings, loop probes): no request
        self.relay.counters.answered(req.TYPE.name, code)

    def scheduler(self, session: MoqtSession) -> SessionScheduler:
        if self._scheduler is None:
            self._scheduler = SessionScheduler(session.spawn)
        return self._scheduler

    async def _refuse(self, req: IncomingTrackRequest, code: int, reason: str) -> None:
        """REQUEST_ERROR; a refusal because the upstream relay is unreachable is counted
        (upstream_unreachable) and logged, so an outage is visible, not a missing Track."""
        if reason == UNREACHABLE:
            self.relay.counters.upstream_unreachable += 1
            log.warning("%s %s refused: upstream relay unreachable", req.TYPE.name,
                        format_full_track_name(*req.full_name))
        await req.reject(code, reason)

    @property
    def auth(self) -> Authorizer | AnnouncedAuthority:
        """Who may ask what here: tokens, or for the upstream relay what we announced."""
        if self.reach is Reach.OWN:
            return AnnouncedAuthority(self.relay.announcer)
        return self.relay.auth

    def _allowed(self, req: IncomingRequest, role: Role, namespace: TrackNamespace) -> bool:
        ok = self.auth.allows(role, namespace, _tokens(_moqt_session(req), req.params))
        if not ok:
            self.relay.counters.auth_failures += 1
        return ok

    # -- publishers -------------------------------------------------------------------------------

    async def _downward(self, req: IncomingRequest) -> bool:
        """Publishing toward us from our upstream relay is refused: a tree announces up
        only, so routes never loop."""
        if self.reach is not Reach.OWN:
            return False
        await req.reject(RequestErrorCode.NOT_SUPPORTED, "relays announce upward only")
        return True

    async def publish_namespace(self, req: IncomingPublishNamespace) -> None:
        if await self._downward(req):
            return
        session = _moqt_session(req)
        routing = self.relay.routing
        tree = self.reach is Reach.ALL and routing.is_tree_relay(session)
        tokens = _tokens(session, req.params)
        auth = self.auth
        # A lower relay announces one wide prefix for everything it holds (one request
        # stream, however many scopes): it may if its token may publish anywhere under it,
        # and each namespace it then lists is admitted by that token (docs/relay.md, "Trees")
        allowed = auth.allows_prefix(Role.PUBLISH, req.namespace, tokens) if tree else \
            auth.allows(Role.PUBLISH, req.namespace, tokens)
        if not allowed:
            self.relay.counters.auth_failures += 1
            await req.reject(RequestErrorCode.UNAUTHORIZED, "not authorized to publish there")
            return
        await req.accept()
        if tree:
            refused: set[TrackNamespace] = set()  # counted once, however often listed

            def admit(ns: TrackNamespace) -> bool:
                ok = auth.allows(Role.PUBLISH, ns, tokens)
                if not ok and ns not in refused:
                    refused.add(ns)
                    self.relay.counters.auth_failures += 1
                    log.info("lower relay's namespace %s not admitted: its token may not "
                             "publish there", format_namespace(ns))
                return ok
            # learned namespace by namespace, routed by them only: a wide prefix routes
            # nothing by itself, or every request for an unknown Track would go down to
            # every lower relay
            stop = routing.follow_child(session, req.namespace, admit)
            try:
                await req.withdrawn.wait()
            finally:
                stop()
            return
        entry = PublisherEntry(req.namespace, session)
        self.relay.namespaces.add_publisher(entry)
        try:
            await req.withdrawn.wait()
        finally:
            self.relay.namespaces.remove_publisher(entry)

    async def publish(self, req: IncomingPublish) -> None:
        if await self._downward(req):
            return
        if not self._allowed(req, Role.PUBLISH, req.namespace):
            await req.reject(RequestErrorCode.UNAUTHORIZED, "not authorized to publish there")
            return
        relay = self.relay
        track = relay.registry.track(req.full_name)
        sub = await req.accept()
        if relay.push is not None and self.reach is Reach.ALL:
            # before the Track ingests anything: the push misses no Object
            await relay.push.start(track, tuple(sub.track_properties or ()))
        # the namespace of a pushed Track is this relay's own while it is pushed: listed to
        # listeners (so announced upward and learned by the relay above), though requests
        # are never routed to a PUBLISH session by its namespace
        entry = PublisherEntry(req.namespace, CACHE)
        relay.namespaces.add_publisher(entry)
        try:
            await track.ingest(sub)
        finally:
            relay.registry.list_until_committed(track, entry)

    # -- discovery --------------------------------------------------------------------------------

    async def subscribe_namespace(self, req: IncomingSubscribeNamespace) -> None:
        session = _moqt_session(req)
        tokens = _tokens(session, req.params)
        auth = self.auth
        if not auth.allows_prefix(Role.SUBSCRIBE, req.prefix, tokens):
            self.relay.counters.auth_failures += 1
            await req.reject(RequestErrorCode.UNAUTHORIZED, "not authorized for that prefix")
            return
        table = self.relay.namespaces
        if any(prefixes_overlap(x.prefix, req.prefix) and not x.over()
               for x in table.listeners_of(session)):
            await req.reject(RequestErrorCode.PREFIX_OVERLAP, "overlaps an earlier prefix")
            return
        queue: asyncio.Queue[tuple[TrackNamespace, bool]] = asyncio.Queue()
        relay = self.relay
        # a sibling worker hears of what this worker has but from siblings, the upstream
        # relay of what this relay has as its own, a client of everything but its own
        # announcements (a lower relay is not told back what it announced)
        shows = {Reach.NO_SIBLINGS: relay.routing.not_sibling, Reach.OWN: own_source}.get(
            self.reach, not_from(session))
        text_only = _text_only(session)
        listener = NamespaceListener(
            req.prefix, lambda ns, active: queue.put_nowait((ns, active)),
            lambda ns: auth.allows(Role.SUBSCRIBE, ns, tokens) and
            (not text_only or _is_text(ns)), session, shows, over=req.cancelled.is_set)
        for ns in table.add_listener(listener):
            queue.put_nowait((ns, True))
        interest = None
        try:
            upstream = relay.routing.upstream_namespaces
            if self.reach is Reach.ALL and upstream is not None:
                # the upstream relay is asked too, for as long as this request lives; its
                # answer is awaited (bounded) only while the link is not known to be down
                interest = upstream.acquire(req.prefix)
                if not upstream.link.unreachable:
                    await interest.answered(UPSTREAM_ANSWER_WAIT)
            await req.accept()
            # what is known now goes out with REQUEST_OK, in the same transmit: a relay
            # below answers its own listener once what came with our REQUEST_OK is in
            while not queue.empty() and not req.cancelled.is_set():
                ns, active = queue.get_nowait()
                await (req.announce(ns) if active else req.withdraw(ns))
            while not req.cancelled.is_set():
                get = asyncio.ensure_future(queue.get())
                cancelled = asyncio.ensure_future(req.cancelled.wait())
                try:
                    done, _ = await asyncio.wait({get, cancelled},
                                                 return_when=asyncio.FIRST_COMPLETED)
                finally:  # also when this handler is cancelled with its session
                    cancelled.cancel()
                    if not get.done():
                        get.cancel()
                if get not in done:
                    break
                ns, active = get.result()
                await (req.announce(ns) if active else req.withdraw(ns))
        finally:
            table.remove_listener(listener)
            if interest is not None:
                interest.release()

    async def subscribe_tracks(self, req: IncomingSubscribeTracks) -> None:
        """A PUBLISH per Track under the prefix, now and later (track_offers.py)."""
        tokens = _tokens(_moqt_session(req), req.params)
        if not self.auth.allows_prefix(Role.SUBSCRIBE, req.prefix, tokens):
            self.relay.counters.auth_failures += 1
            await req.reject(RequestErrorCode.UNAUTHORIZED, "not authorized for that prefix")
            return
        # SUBSCRIBE_TRACKS prefixes overlap among themselves only, not with
        # SUBSCRIBE_NAMESPACE's (draft-22 SUBSCRIBE_TRACKS)
        if any(prefixes_overlap(o.req.prefix, req.prefix) and not o.req.cancelled.is_set()
               for o in self.track_offers):
            await req.reject(RequestErrorCode.PREFIX_OVERLAP, "overlaps an earlier prefix")
            return
        offers = TrackOffers(self, req, tokens)
        self.track_offers.append(offers)
        try:
            await offers.run()
        finally:
            self.track_offers.remove(offers)

    # -- subscriptions ----------------------------------------------------------------------------

    async def subscribe(self, req: IncomingSubscribe) -> None:
        if not self._allowed(req, Role.SUBSCRIBE, req.namespace):
            await req.reject(RequestErrorCode.UNAUTHORIZED, "not authorized for that scope")
            return
        if req.namespace and req.namespace[0].startswith(b"."):
            await req.reject(RequestErrorCode.DOES_NOT_EXIST, "reserved namespace")
            return
        name = req.full_name
        # a Track this session subscribes to (or waits for) is not also PUBLISHed to it by
        # its SUBSCRIBE_TRACKS (draft-22 §Relays: the held SUBSCRIBE proceeds instead)
        self.subscribing[name] = self.subscribing.get(name, 0) + 1
        try:
            await self._subscribe(req)
        finally:
            left = self.subscribing[name] - 1
            if left:
                self.subscribing[name] = left
            else:
                del self.subscribing[name]

    async def _subscribe(self, req: IncomingSubscribe) -> None:
        relay = self.relay
        track = relay.registry.track(req.full_name)
        params = req.params
        err = await relay.routing.ensure_upstream(track, reach=self.reach,
                                                  fill=_fill_filter(params))
        hold = self._rendezvous_window(params)
        if err is not None and err.code == RequestErrorCode.DOES_NOT_EXIST and hold > 0 and \
                track.store.known_final(track.key) is None:
            held = await self._rendezvous(req, track, hold)
            if held is None:
                return  # the subscriber cancelled while held: nothing to answer
            track, err = held
        ended = err is not None and track.store.known_final(track.key) is not None
        if err is not None and not ended:
            err = relay.routing.in_outage(track, err)
            relay.registry.forget_if_idle(track)
            await self._refuse(req, err.code, err.reason)
            return
        session = _moqt_session(req)
        # L, the live start and the Forwarder's registration happen with no await between
        # them, so no Object above L can be missed or sent twice (§9.6).
        largest = track.largest()
        live = resolve_subscription_range(params.location_filter, largest)
        fwd = Forwarder(params, self.scheduler(session), live.start, live.end,
                        max_backlog=relay.options.max_backlog_bytes,
                        on_close=lambda f: track.forwarders.discard(f))
        track.forwarders.add(fwd)
        fill = params.fill
        fill_wanted = fill is not None and largest is not None and fwd.forward
        if fill_wanted:
            fwd.hold()  # no PUBLISH_DONE before the fill stream exists
        try:
            served = await req.accept(largest, properties=_props(track, params))
        except BaseException:
            fwd.close()
            raise
        self._serve_with(track, served, fwd)
        fwd.counters = relay.counters
        if fill_wanted:
            assert largest is not None
            try:
                fill_end = await self._serve_fill(track, served, params, largest,
                                                  fwd.subscriber_priority)
                if fill_end == largest and fwd.start == Location(largest.group,
                                                                 largest.object + 1):
                    self._group_end_after_fill(track, fwd, largest)
            finally:
                fwd.release()
        if not track.live:
            # The upstream ended while we answered, or the Track had ended before: a relay
            # holding an ended Track answers from cache and ends the subscription at once
            # rather than refusing it (see docs/relay.md).
            fwd.upstream_done(PublishDoneCode.TRACK_ENDED, "track ended")
        await fwd.wait_finished(served.cancelled)

    def _rendezvous_window(self, params: Params) -> float:
        """Seconds a SUBSCRIBE may be held for a publisher: its RENDEZVOUS_TIMEOUT, capped
        by ``max_rendezvous_timeout`` (§6.3: a relay may use a shorter one); 0: answer at
        once."""
        asked = params.rendezvous_timeout or 0
        return min(asked, self.relay.options.max_rendezvous_timeout) / 1000

    async def _rendezvous(self, req: IncomingSubscribe, track: RelayTrack, hold: float
                          ) -> tuple[RelayTrack, RequestRejected | None] | None:
        """Hold a SUBSCRIBE for a Track with no publisher until one appears here or up the
        tree (rendezvous.py), at most ``hold`` seconds: the Track and what its sources then
        answered (TIMEOUT when none appeared), or None if the subscriber cancelled meanwhile."""
        relay = self.relay
        name = req.full_name
        loop = asyncio.get_running_loop()
        deadline = loop.time() + hold
        upstream = relay.routing.upstream_namespaces if self.reach is Reach.ALL else None
        # the upstream relay's namespaces under the Track's are heard while it is held
        interest = upstream.acquire(name.namespace) if upstream is not None else None
        cancelled = asyncio.ensure_future(req.rs.wait_reset())
        try:
            with relay.rendezvous.waiting(name.namespace) as woken:
                while (remaining := deadline - loop.time()) > 0:
                    woke = asyncio.ensure_future(woken.wait())
                    try:
                        done, _ = await asyncio.wait({woke, cancelled}, timeout=remaining,
                                                     return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        woke.cancel()
                    if cancelled in done:
                        relay.registry.forget_if_idle(track)
                        return None
                    if woke not in done:
                        break
                    woken.clear()
                    track = relay.registry.track(name)  # the registry may have swept it meanwhile
                    err = await relay.routing.ensure_upstream(track, reach=self.reach,
                                                              fill=_fill_filter(req.params))
                    if err is None or err.code != RequestErrorCode.DOES_NOT_EXIST:
                        return track, err
        finally:
            cancelled.cancel()
            if interest is not None:
                interest.release()
        log.info("SUBSCRIBE %s: no publisher within its RENDEZVOUS_TIMEOUT (%.0f ms)",
                 format_full_track_name(*name), hold * 1000)
        return track, RequestRejected(RequestErrorCode.TIMEOUT,
                                      "no publisher within RENDEZVOUS_TIMEOUT")

    def _serve_with(self, track: RelayTrack, served: ServedSubscription,
                    fwd: Forwarder) -> None:
        """``fwd`` forwards to ``served`` (a SUBSCRIBE answered, or a PUBLISH accepted);
        its REQUEST_UPDATEs change what is forwarded, and a failed one ends it (§7.5)."""
        fwd.attach(served)
        served.on_update = lambda msg: self._on_update(track, served, fwd, msg)
        served.on_update_failed = lambda e: fwd.end_subscription(PublishDoneCode.UPDATE_FAILED,
                                                                  e.reason)

    async def _on_update(self, track: RelayTrack, served: ServedSubscription, fwd: Forwarder,
                         msg: Any) -> Params:
        """REQUEST_UPDATE on a downstream subscription (§7.5): Forward and priority changes
        apply to the Forwarder; a new Location filter moves its window; FILL_PARAMETERS opens
        a fill carrying the update's Request ID (§9.1)."""
        p: Params = msg.params
        largest = track.largest()
        if p.range_filters or p.fill is not None:
            # MAX_FILTER_RANGES counts the subscription's Ranges after the update, plus the
            # fill's (§6.4, §6.5)
            after = override_filters(fwd.range_filters, p.range_filters)
            try:
                check_filter_ranges(Params(range_filters=after, fill=p.fill),
                                    self.relay.options.session.max_filter_ranges)
            except RequestError as e:
                raise RequestRejected(e.code, e.reason) from None
            fwd.update_filters(p.range_filters)
        # Forward and Subscriber Priority: the subscription applied them already, the
        # Forwarder reads them from it
        if p.location_filter is not None:
            lf = None if p.location_filter.type == LocationFilterType.NONE else p.location_filter
            live = resolve_subscription_range(lf, largest)
            fwd.start, fwd.end = live.start, live.end
        if p.fill is not None and largest is not None and served.forward:
            merged = Params(location_filter=p.location_filter or served.params.location_filter,
                            group_order=served.params.group_order, fill=p.fill,
                            range_filters=fwd.range_filters)
            await self._serve_fill(track, served, merged, largest, fwd.subscriber_priority,
                                   msg.request_id)
        return Params(largest_object=largest)

    @staticmethod
    def _group_end_after_fill(track: RelayTrack, fwd: Forwarder, largest: Location) -> None:
        """L is an End of Group the fill covered and the live part starts right after:
        say on the live path that the Group is over (see Forwarder.announce_group_end)."""
        with track.store.reader() as r:
            eog = next(cache.read(r, track.key, largest, largest), None)
        if eog is not None and eog.status == ObjectStatus.END_OF_GROUP and not eog.datagram:
            fwd.announce_group_end(eog.group, eog.subgroup, eog.priority)

    async def _serve_fill(self, track: RelayTrack, served: ServedSubscription, params: Params,
                          largest: Location, priority: int, request_id: int | None = None
                          ) -> Location | None:
        """Open the fill fetch stream now; walk and write it in a task of the session, in
        the session's priority order (the fill's Subscriber Priority, else the
        subscription's, §9.4). Returns the fill's end, None if no fill stream was opened."""
        fill = params.fill
        assert fill is not None
        rng = resolve_fetch_range(_fill_filter(params), largest)
        if rng is None or rng.is_empty or rng.end is None:
            return None
        order = _group_order(track, fill.group_order, params.group_order)
        # the fill's own Range filters replace the subscription's of the same type (§6.4)
        flt = ObjectFilter.of(override_filters(params.range_filters, fill.range_filters))
        timeout = fill.fill_timeout / 1000 if fill.fill_timeout is not None \
            else self.relay.options.default_fill_timeout
        try:
            stream = await served.open_fill(request_id, group_order=order)
        except (LinkError, SessionFailure):
            return None
        session = _moqt_session(served)
        writer = ScheduledWriter(stream, self.scheduler(session),
                                 fill.subscriber_priority if fill.subscriber_priority is not None
                                 else priority)
        session.spawn(
            self._write_fill(track, writer, rng.start, rng.end, order, flt, timeout),
            "fill")
        return rng.end

    async def _write_fill(self, track: RelayTrack, writer: Any, start: Location,
                          end: Location, order: GroupOrder, flt: ObjectFilter | None,
                          timeout: float) -> None:
        lease = track.store.pin(track.key, start.group, end.group)
        loop = asyncio.get_running_loop()
        started = loop.time()
        served = self.relay.counters.fill
        try:
            with served.in_flight.one():
                stats = await track.serve_range(writer, start, end, order, flt, timeout,
                                                self._fetch_upstream,
                                                self.relay.options.in_flight_wait)
                if not stats.reset:
                    await writer.finish()
                served.done(stats, loop.time() - started)
        except LinkError:
            pass
        finally:
            lease.release()

    # -- FETCH ------------------------------------------------------------------------------------

    async def fetch(self, req: IncomingFetch) -> None:
        relay = self.relay
        if not self._allowed(req, Role.SUBSCRIBE, req.namespace):
            await req.reject(RequestErrorCode.UNAUTHORIZED, "not authorized for that scope")
            return
        track = relay.registry.track(req.full_name)
        params = req.params
        lf = params.location_filter
        if lf is not None and lf.type == LocationFilterType.NONE:
            lf = None
        largest = track.largest()
        timeout = params.fill_timeout / 1000 if params.fill_timeout is not None \
            else relay.options.default_fill_timeout
        # FILL_TIMEOUT bounds all the upstream effort of this FETCH, before FETCH_OK and after
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        unanswered = answered = False
        start, end = self._requested_bounds(lf)
        if largest is None or (start > largest and not track.live and
                               track.store.known_final(track.key) is None):
            # Nothing cached, or the request starts past what this relay has seen of a
            # Track it does not follow live (an earlier FETCH taught it a Largest Object
            # that is only a lower bound): learn the Track from its sources (pull-through),
            # within the request's FILL_TIMEOUT: a dead upstream must not hold the answer.
            try:
                answered = await self._pull_through(_moqt_session(req), track, start, end,
                                                    timeout)
                if answered:
                    largest = track.largest()
            except TimeoutError:
                unanswered = True
        if largest is None and answered and end.group != OBJECT_MAX:
            # A source accepted the range (FETCH_OK: its Largest Object is at least the
            # start) but delivered nothing of it: unknown there, so reported unknown here
            # (End of Unknown Range), not as a Track that does not exist
            largest = end
        if largest is None:
            relay.registry.forget_if_idle(track)
            err = relay.routing.unreachable_error() if self.reach is not Reach.OWN else None
            if unanswered or err is not None:
                err = relay.routing.in_outage(
                    track, RequestRejected(RequestErrorCode.TIMEOUT, UNREACHABLE))
                await self._refuse(req, err.code, err.reason)
                return
            refusal = RequestRejected(RequestErrorCode.DOES_NOT_EXIST
                                      if not relay.routing.sources(req.namespace, self.reach) else
                                      RequestErrorCode.INVALID_RANGE, "nothing published")
            relay.routing.learned(track, refusal)  # asked and answered: absent, as far as we know
            await req.reject(refusal.code, refusal.reason)
            return
        rng = resolve_fetch_range(lf, largest)
        if rng is None or rng.is_empty or rng.end is None:
            if unanswered:  # what lies past our Largest Object is not known: not INVALID_RANGE
                await self._refuse(req, RequestErrorCode.TIMEOUT, UNREACHABLE)
                return
            await req.reject(RequestErrorCode.INVALID_RANGE, "start is past the Largest Object")
            return
        end = rng.end
        if lf is not None and lf.type == LocationFilterType.ABSOLUTE_START_GROUP_END and \
                end.group == lf.end_group:
            end = await self._group_end_location(track, rng.start, end,
                                                 max(0.0, deadline - loop.time()))
        final = track.store.known_final(track.key)
        end_of_track = final is not None and final <= end and \
            end >= largest
        started = asyncio.get_running_loop().time()
        writer = ScheduledWriter(await req.accept(end_of_track, end, _props(track, params)),
                                 self.scheduler(_moqt_session(req)),
                                 params.subscriber_priority
                                 if params.subscriber_priority is not None
                                 else DEFAULT_SUBSCRIBER_PRIORITY)
        lease = track.store.pin(track.key, rng.start.group, end.group)
        served = relay.counters.fetch
        try:
            with served.in_flight.one():
                stats = await track.serve_range(writer, rng.start, end, req.group_order,
                                                ObjectFilter.of(params.range_filters),
                                                max(0.0, deadline - loop.time()),
                                                self._fetch_upstream,
                                                relay.options.in_flight_wait,
                                                functools.partial(relay.routing.fetch_in_flight,
                                                                  reach=self.reach))
                if not stats.reset:
                    await writer.finish()
                served.done(stats, loop.time() - started)
        except LinkError:
            pass
        finally:
            lease.release()

    async def _pull_through(self, session: MoqtSession, track: RelayTrack, start: Location,
                            end: Location, timeout: float) -> bool:
        """Ask the Track's sources for [start, end] (pull-through) and return as soon as one
        has answered: the Track's Largest Object here has moved (its FETCH_OK's End Location,
        or its first Object cached). The rest of that upstream FETCH runs on under the
        session, bounded by ``timeout``, and its Objects are served as they arrive
        (``serve_range`` waits for it, and for no other upstream FETCH): relays forward
        Objects as they arrive, through FETCH too, so a consumer at the edge of a tree has
        the first layer of a long Track before its last one has crossed every hop. True or
        False as ``_fetch_upstream``; TimeoutError if no source answered in time."""

        async def pull() -> bool | None:
            try:
                return await asyncio.wait_for(
                    self._fetch_upstream(track, start, end, timeout), timeout)
            except TimeoutError:
                return None  # unanswered in time (or every source that took it failed)

        before = track.largest()  # None, or a Largest Object the request starts past
        job = session.spawn(pull(), "pull-through")
        while not job.done():
            now = track.largest()
            if now is not None and (before is None or now > before):
                return True
            await track.wait_change_or(job, None)
        answered = job.result()
        if answered is None:
            raise TimeoutError
        return answered

    async def _group_end_location(self, track: RelayTrack, start: Location, end: Location,
                                  timeout: float) -> Location:
        """End Location of a FETCH for "all of Group G" (§7.10): the last Location known
        in G — its End of Group, else the last Object held of it — never {G, 2^64-1},
        which is no Object's Location (a lower relay would take it for the Largest
        Object; moq-rs refuses it). Knowing nothing of G, ask upstream first (within the
        FETCH's FILL_TIMEOUT); still nothing: the whole Group, reported unknown."""
        g = end.group
        for attempt in range(2):
            g_end = track.store.group_end(track.key, g)
            if g_end is not None:
                return max(Location(g, min(end.object, g_end)), start)
            if end.object != OBJECT_MAX:
                return end  # clipped to the Largest Object, inside G
            last = track.last_held(g)
            if last is not None and last >= start:
                return last
            if attempt == 0:
                try:
                    await asyncio.wait_for(self._fetch_upstream(track, start, end, timeout),
                                           timeout)
                except TimeoutError:
                    break
        return end

    @staticmethod
    def _requested_bounds(lf: LocationFilter | None) -> tuple[Location, Location]:
        big = OBJECT_MAX
        if lf is None or not lf.is_absolute:
            return Location(0, 0), Location(big, big)
        start = Location(lf.start_group, lf.start_object)
        if lf.type == LocationFilterType.ABSOLUTE_RANGE:
            return start, Location(lf.end_group, lf.end_object)
        if lf.type == LocationFilterType.ABSOLUTE_START_GROUP_END:
            return start, Location(lf.end_group, big)
        return start, Location(big, big)

    # -- TRACK_STATUS -----------------------------------------------------------------------------

    async def track_status(self, req: IncomingTrackStatus) -> None:
        if loops.is_probe(req.namespace):
            await self.relay.loops.answer(req, _moqt_session(req), self.reach)
            return
        if not self._allowed(req, Role.SUBSCRIBE, req.full_name.namespace):
            await req.reject(RequestErrorCode.UNAUTHORIZED, "not authorized for that scope")
            return
        relay = self.relay
        # the registry entry loads a Track held only in LMDB (after a restart) with its
        # Track Properties; a Track the relay knows nothing of is asked upstream (§14 table)
        track = relay.registry.track(req.full_name)
        err = None
        if track.largest() is None:
            err = await relay.routing.track_status_upstream(track, reach=self.reach)
        largest = track.largest()
        if largest is None:
            relay.registry.forget_if_idle(track)
            if err is not None:
                err = relay.routing.in_outage(track, err)
                await self._refuse(req, err.code, err.reason)
                return
            await req.reject(RequestErrorCode.DOES_NOT_EXIST, "no such track")
            return
        await req.reply(largest, _props(track, req.params))


__all__ = ["RelayHandler"]
