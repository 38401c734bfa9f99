"""PUBLISH, both sides (§7.6, §8.1): ``start_publish`` publishes a Track to the peer (we
are the publisher: a ``ServedSubscription``); ``IncomingPublish`` is the peer publishing to us
(accepting it makes us the subscriber: a ``Subscription``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from relay.moqt.codes import MessageType, StreamResetCode
from relay.moqt.kvp import KeyValuePair
from relay.moqt.messages import Publish, RequestOk
from relay.moqt.params import Params
from relay.moqt.primitives import TrackNamespace, format_full_track_name

from .errors import RequestCancelled, RequestRejected, SessionClosed
from .request_stream import RequestStream
from .requests import IncomingTrackRequest, request_ok
from .subscribe import ServedSubscription, Subscription

if TYPE_CHECKING:
    from .base import SessionBase

log = logging.getLogger("kvcs.session")


class IncomingPublish(IncomingTrackRequest):
    TYPE = MessageType.PUBLISH
    msg: Publish

    def __init__(self, session: SessionBase, rs: RequestStream, msg: Publish) -> None:
        super().__init__(session, rs, msg)
        # Objects may arrive before we answer (Forward 1, §7.6): route them already.
        self.subscription = Subscription(session, rs, msg.request_id, msg.track_namespace,
                                         msg.track_name, msg.params)
        session.bind_request(msg.request_id, self.subscription)
        self.subscription._established(msg.track_alias, msg.params, msg.track_properties)

    async def accept(self, params: Params | None = None) -> Subscription:
        """REQUEST_OK ("PUBLISH_OK"); if the PUBLISH had Forward 0, ask for Forward 1."""
        self._answer()
        await self.rs.send(RequestOk(params or Params()))
        sub = self.subscription
        self.session.spawn(sub.control_loop(), "accepted-publish")
        if self.params.forward is False:
            self.session.spawn(_ask_forward(sub), "publish-forward")
        return sub

    async def reject(self, code: int, reason: str = "", retry_interval: int = 0) -> None:
        await super().reject(code, reason, retry_interval)
        self.subscription.cancel(StreamResetCode.CANCELLED)


async def _ask_forward(sub: Subscription) -> None:
    """REQUEST_UPDATE Forward 1 on a PUBLISH offered with Forward 0 (§7.6). A publisher that
    refuses it (REQUEST_ERROR) or drops the request ends that request only, never the
    session and its other Tracks: the subscription stays as the publisher left it (Forward
    0), for the publisher to end (§7.5: PUBLISH_DONE UPDATE_FAILED) or to serve anyway, as
    some do once their PUBLISH is accepted; the Track stays known and discoverable."""
    try:
        await sub.update(Params(forward=True))
    except (RequestRejected, RequestCancelled) as e:
        if not sub.ended:
            log.warning("PUBLISH of %s: the publisher refused Forward 1 (%s); the subscription "
                        "stays at Forward 0, the session goes on",
                        format_full_track_name(*sub.full_name), e)
    except SessionClosed:
        pass


async def start_publish(session: SessionBase, namespace: TrackNamespace, name: bytes,
                        params: Params, properties: tuple[KeyValuePair, ...]
                        ) -> ServedSubscription:
    alias = session.next_track_alias()
    rs, _, rid = await request_ok(
        session, lambda rid: Publish(rid, namespace, name, alias, params, properties))
    served = ServedSubscription(session, rs, rid, namespace, name, params, alias,
                                MessageType.PUBLISH)
    session.spawn(served.control_loop(), "published-track")
    return served
