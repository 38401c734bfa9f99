"""Pushing up (``upstream_push``, docs/relay.md "Trees"): a relay whose publishers PUBLISH a
Track also PUBLISHes it to its upstream relay, Object by Object as it arrives.

Off by default: announcing upward already makes every Track routable from the whole tree,
pulled on first demand. Pushing trades upstream bandwidth for two things: the copy above
outlives this relay (a lower relay on a spot host, a prefill node's sidecar), and the first
remote consumer does not wait for the pull's round trips through the tree. The push is one
more subscriber of the Track here (a Forwarder), so a slow upstream is bounded like any slow
subscriber (``max_backlog_bytes``: it ends as TOO_FAR_BEHIND, the Track stays served here).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from relay.logs import reason_of
from relay.moqt.params import Params
from relay.moqt.primitives import Location, format_full_track_name
from relay.session import LinkError, MoqtSession, RequestRejected
from relay.session.errors import SessionFailure

from .forwarder import Forwarder
from .scheduler import SessionScheduler

if TYPE_CHECKING:
    from .counters import Counters
    from .track import RelayTrack
    from .upstream import UpstreamLink

log = logging.getLogger("kvcs.relay")


class UpstreamPush:
    def __init__(self, link: UpstreamLink, counters: Counters, max_backlog: int,
                 answer_timeout: float) -> None:
        self.link = link
        self.counters = counters
        self.max_backlog = max_backlog  # each push's Forwarder's, as any subscriber's
        self.answer_timeout = answer_timeout  # for the upstream's answer to our PUBLISH
        self._schedulers: dict[MoqtSession, SessionScheduler] = {}

    def _scheduler(self, session: MoqtSession) -> SessionScheduler:
        for s in [s for s in self._schedulers if s.closed]:
            del self._schedulers[s]
        sched = self._schedulers.get(session)
        if sched is None:
            sched = self._schedulers[session] = SessionScheduler(session.spawn)
        return sched

    async def start(self, track: RelayTrack, properties: tuple[Any, ...]) -> None:
        """Push ``track`` up from its first Object. Called before the Track ingests
        anything from its publisher, so the push, registered as one more subscriber of the
        Track here, misses nothing; it is attached once the upstream accepted our PUBLISH
        (until then the Forwarder queues, bounded by its backlog)."""
        up = await self.link.get()
        if up is None:
            self.counters.upstream_pushes_failed += 1
            return
        fwd = Forwarder(Params(forward=True), self._scheduler(up), Location(0, 0), None,
                        max_backlog=self.max_backlog,
                        on_close=lambda f: track.forwarders.discard(f))
        fwd.counters = self.counters
        track.forwarders.add(fwd)
        up.spawn(self._publish(up, track, properties, fwd), "push-up")

    async def _publish(self, up: MoqtSession, track: RelayTrack, properties: tuple[Any, ...],
                       fwd: Forwarder) -> None:
        name = track.full_name
        try:
            served = await asyncio.wait_for(
                up.publish(name.namespace, name.name, properties=properties),
                self.answer_timeout)
        except (RequestRejected, SessionFailure, LinkError, TimeoutError) as e:
            fwd.close()
            self.counters.upstream_pushes_failed += 1
            log.warning("push of %s upstream refused or failed: %s; it is served here only",
                        format_full_track_name(*name), reason_of(e))
            return
        fwd.attach(served)
        self.counters.upstream_pushes += 1
        await fwd.wait_finished(served.cancelled)
