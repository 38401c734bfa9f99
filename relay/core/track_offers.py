"""SUBSCRIBE_TRACKS served (draft-22 "SUBSCRIBE_TRACKS", "Relays"; docs/relay.md, "Discovery"):
after REQUEST_OK the relay PUBLISHes to the subscriber, once per SUBSCRIBE_TRACKS, every Track
under the prefix it can serve, now and as they appear: Tracks with a live upstream (a
publisher's PUBLISH, or a subscription to a PUBLISH_NAMESPACE publisher or up the tree) and
ended Tracks it holds (memory or LMDB, also after a restart). Each PUBLISH is a subscription
of its own, served like a SUBSCRIBE with a Next Object filter: a Forwarder for the live part
(REQUEST_UPDATE, fills and FETCH as for any subscription), PUBLISH_DONE TRACK_ENDED at once for
an ended Track. What a SUBSCRIBE_TRACKS carries (FORWARD, GROUP_ORDER, Range filters,
INCLUDE_PROPERTIES) is each PUBLISH's initial setting; TRACK_PROPERTY_FILTER chooses the
Tracks. Not PUBLISHed: Tracks this session publishes itself, Tracks it SUBSCRIBEs to (a held
SUBSCRIBE proceeds instead), Tracks its tokens do not cover, Tracks a publisher left before
their end (nothing more can come, a SUBSCRIBE is refused too). Cancelling the SUBSCRIBE_TRACKS
stops further PUBLISHes; those made live on, each until its own end."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from relay.logs import reason_of
from relay.moqt.codes import ParameterType, PublishDoneCode, RequestErrorCode
from relay.moqt.params import Params
from relay.moqt.primitives import (
    FullTrackName,
    Location,
    format_full_track_name,
    namespace_matches_prefix,
    prefixes_overlap,
)
from relay.session import (
    IncomingSubscribeTracks,
    LinkError,
    MoqtSession,
    RequestRejected,
    SessionFailure,
)

from .auth import Role
from .forwarder import Forwarder
from .track import RelayTrack

if TYPE_CHECKING:
    from .announce import AnnouncedAuthority
    from .auth import Authorizer
    from .parts import RelayParts
    from .scheduler import SessionScheduler

log = logging.getLogger("kvcs.relay")


def track_properties_pass(filters: Any, track: RelayTrack) -> bool:
    """TRACK_PROPERTY_FILTER (§6.5) on a Track's Properties: same-SetID filters AND, SetID
    groups OR; a Track lacking the property (or with a non-integer value) does not pass."""
    props = {p.type: p.value for p in track.properties if isinstance(p.value, int)}
    groups: dict[int, bool] = {}
    for f in filters:
        if f.set_id is None or f.type != ParameterType.TRACK_PROPERTY_FILTER:
            continue
        v = props.get(f.property_type)
        groups[f.set_id] = groups.get(f.set_id, True) and v is not None and f.matches(v)
    return not groups or any(groups.values())


class OfferingHandler(Protocol):
    """What a SUBSCRIBE_TRACKS uses of its session's handler (handler.py's RelayHandler)."""

    relay: RelayParts
    subscribing: dict[FullTrackName, int]  # Tracks its SUBSCRIBEs are for: not offered
    track_offers: list[TrackOffers]  # the session's SUBSCRIBE_TRACKS, while they live

    @property
    def auth(self) -> Authorizer | AnnouncedAuthority: ...

    def scheduler(self, session: MoqtSession) -> SessionScheduler: ...

    def _serve_with(self, track: RelayTrack, served: Any, fwd: Forwarder) -> None: ...


class TrackOffers:
    """One SUBSCRIBE_TRACKS of one downstream session, while it lives."""

    def __init__(self, handler: OfferingHandler, req: IncomingSubscribeTracks,
                 tokens: list[bytes]) -> None:
        self.handler = handler
        self.relay = handler.relay
        self.req = req
        self.session: MoqtSession = req.session  # type: ignore[assignment]
        self.tokens = tokens
        self.offered: set[FullTrackName] = set()
        self._queue: asyncio.Queue[RelayTrack] = asyncio.Queue()

    # -- which Tracks ------------------------------------------------------------------------------

    def _candidates(self) -> Iterator[RelayTrack]:
        """Every Track under the prefix the relay knows: its registry, then LMDB (what a
        restart left there is loaded into the registry as FETCH would)."""
        relay, prefix = self.relay, self.req.prefix
        for ns, tracks in list(relay.registry.by_namespace.items()):
            if namespace_matches_prefix(ns, prefix):
                yield from list(tracks.values())
        durable = relay.registry.store.durable
        if durable is not None:
            for ns, name in durable.tracks():
                full = FullTrackName(tuple(ns), bytes(name))
                if namespace_matches_prefix(full.namespace, prefix) and \
                        full not in relay.registry.tracks:
                    yield relay.registry.track(full)

    def _offerable(self, track: RelayTrack) -> bool:
        name = track.full_name
        if name in self.offered or not namespace_matches_prefix(name.namespace, self.req.prefix):
            return False
        if name.namespace and name.namespace[0].startswith(b"."):
            return False  # reserved namespaces are never forwarded
        if name in self.handler.subscribing:
            return False
        if any(sub.session is self.session for sub in track.upstreams):
            return False  # "excluding tracks published by the subscriber"
        if not (track.live or track.store.known_final(track.key) is not None):
            return False
        if not track_properties_pass(self.req.params.range_filters, track):
            return False
        return self.handler.auth.allows(Role.SUBSCRIBE, name.namespace, self.tokens)

    def _available(self, track: RelayTrack) -> None:
        if namespace_matches_prefix(track.full_name.namespace, self.req.prefix):
            self._queue.put_nowait(track)

    async def _check_update(self, params: Params) -> None:
        """A REQUEST_UPDATE's new prefix must be allowed and overlap no other one (§7.5)."""
        prefix = params.track_namespace_prefix
        if prefix is None:
            return
        if not self.handler.auth.allows_prefix(Role.SUBSCRIBE, prefix, self.tokens):
            raise RequestRejected(RequestErrorCode.UNAUTHORIZED, "not authorized for that prefix")
        if any(prefixes_overlap(o.req.prefix, prefix) for o in self.handler.track_offers
               if o is not self):
            raise RequestRejected(RequestErrorCode.PREFIX_OVERLAP, "overlaps an earlier prefix")

    # -- serving ----------------------------------------------------------------------------------

    async def run(self) -> None:
        req = self.req
        req.on_update = self._check_update
        self.relay.registry.listeners.add(self._available)
        prefix = req.prefix
        try:
            await req.accept()
            for t in self._candidates():
                self._queue.put_nowait(t)
            while not req.cancelled.is_set():
                get = asyncio.ensure_future(self._queue.get())
                over = asyncio.ensure_future(req.cancelled.wait())
                changed = asyncio.ensure_future(req.changed.wait())
                try:
                    await asyncio.wait({get, over, changed},
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    over.cancel()
                    changed.cancel()
                    if not get.done():
                        get.cancel()
                if req.cancelled.is_set():
                    break
                if get.done() and not get.cancelled():
                    self._queue.put_nowait(get.result())
                req.changed.clear()
                if req.prefix != prefix:  # updated: what the new prefix covers, now
                    prefix = req.prefix
                    for t in self._candidates():
                        self._queue.put_nowait(t)
                while not self._queue.empty():
                    track = self._queue.get_nowait()
                    if self._offerable(track):
                        self.offered.add(track.full_name)
                        self.session.spawn(self._publish(track), "publish-track")
        finally:
            self.relay.registry.listeners.discard(self._available)

    async def _publish(self, track: RelayTrack) -> None:
        """PUBLISH ``track`` downstream and serve that subscription to its end. A subscriber
        that refuses it (REQUEST_ERROR, e.g. UNINTERESTED) ends this one PUBLISH only."""
        handler, relay, asked = self.handler, self.relay, self.req.params
        largest = track.largest()
        # L, the live start and the Forwarder's registration with no await between (§9.6)
        start = Location(0, 0) if largest is None else Location(largest.group,
                                                                largest.object + 1)
        forward = asked.forward is not False
        fwd = Forwarder(Params(forward=forward, range_filters=asked.range_filters),
                        handler.scheduler(self.session), start, None,
                        max_backlog=relay.options.max_backlog_bytes,
                        on_close=lambda f: track.forwarders.discard(f))
        fwd.counters = relay.counters
        track.forwarders.add(fwd)
        name = track.full_name
        props = () if asked.include_properties is False else tuple(track.properties)
        try:
            served = await asyncio.wait_for(
                self.session.publish(name.namespace, name.name,
                                     Params(forward=None if forward else False,
                                            group_order=asked.group_order,
                                            largest_object=largest), props),
                relay.options.default_fill_timeout)
        except RequestRejected as e:
            fwd.close()
            log.info("PUBLISH of %s (SUBSCRIBE_TRACKS) refused by the subscriber: %s",
                     format_full_track_name(*name), e)
            return
        except (SessionFailure, LinkError, TimeoutError) as e:
            fwd.close()
            log.info("PUBLISH of %s (SUBSCRIBE_TRACKS) not answered: %s",
                     format_full_track_name(*name), reason_of(e))
            return
        except BaseException:
            fwd.close()
            raise
        handler._serve_with(track, served, fwd)
        if not track.live:
            fwd.upstream_done(PublishDoneCode.TRACK_ENDED, "track ended")
        await fwd.wait_finished(served.cancelled)


__all__ = ["TrackOffers", "track_properties_pass"]
