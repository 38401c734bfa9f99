"""What every request has in common, on both sides of it (§5): a request of the peer is
answered with ``accept(...)`` or ``reject(...)``; one of ours is sent, then its first reply
is awaited."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from relay.moqt.codes import GroupOrder, MessageType, RequestErrorCode
from relay.moqt.errors import SessionError
from relay.moqt.kvp import Properties
from relay.moqt.messages import RequestErrorMessage, RequestMessage, RequestOk
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, TrackNamespace
from relay.transport import StreamReset, TransportError

from .errors import RequestCancelled, RequestRejected, SessionClosed
from .request_stream import RequestStream

if TYPE_CHECKING:
    from .base import DataRoute, SessionBase


# -- the peer's requests --------------------------------------------------------------------------


class IncomingRequest:
    """Common part of a request received from the peer."""

    TYPE: MessageType

    def __init__(self, session: SessionBase, rs: RequestStream, msg: Any) -> None:
        self.session = session
        self.rs = rs
        self.msg = msg
        self.request_id: int = msg.request_id
        self.params: Params = msg.params
        self.answered = False

    async def run(self, handler: Callable[[Any], Awaitable[None]]) -> None:
        try:
            await handler(self)
        finally:
            if not self.answered and not self.session.closed:
                await self.reject(RequestErrorCode.INTERNAL_ERROR, "request not answered")

    async def reject(self, code: int, reason: str = "", retry_interval: int = 0) -> None:
        """REQUEST_ERROR then FIN (§5.1)."""
        if self.answered:
            return
        self.answered = True
        self.session.answered(self, int(code))
        with contextlib.suppress(TransportError):
            await self.rs.send(RequestErrorMessage(int(code), retry_interval, reason[:1024]),
                               fin=True)

    def _answer(self) -> None:
        if self.answered:
            raise RuntimeError(f"{self.TYPE.name} {self.request_id} was already answered")
        self.answered = True
        self.session.answered(self, None)


class IncomingTrackRequest(IncomingRequest):
    """A request naming one Track (SUBSCRIBE, FETCH, PUBLISH, TRACK_STATUS)."""

    @property
    def namespace(self) -> TrackNamespace:
        return self.msg.track_namespace  # type: ignore[no-any-return]

    @property
    def name(self) -> bytes:
        return self.msg.track_name  # type: ignore[no-any-return]

    @property
    def full_name(self) -> FullTrackName:
        return FullTrackName(self.msg.track_namespace, self.msg.track_name)


# -- ours ------------------------------------------------------------------------------------------


class OutgoingTrackRequest:
    """Common part of our request for one Track that then delivers Objects (SUBSCRIBE,
    FETCH, a PUBLISH we accepted)."""

    def __init__(self, session: SessionBase, rs: RequestStream, request_id: int,
                 namespace: TrackNamespace, name: bytes, params: Params) -> None:
        self.session = session
        self.rs = rs
        self.request_id = request_id
        self.full_name = FullTrackName(namespace, name)
        self.params = params
        self.group_order = params.group_order or GroupOrder.ASCENDING
        self.track_properties: Properties = ()
        self.ended = False



def rejected(msg: RequestErrorMessage) -> RequestRejected:
    return RequestRejected(msg.error_code, msg.reason, msg.retry_interval, msg.redirect)


async def first_reply(session: SessionBase, rs: RequestStream, what: str) -> Any:
    """The response to our request, as the state accepted it for the request's type. This
    runs in the caller's task, not under the session's guard: a broken rule closes the
    session here."""
    try:
        reply = await rs.recv()
    except StreamReset as e:
        raise RequestCancelled(e.code, what) from None
    except TransportError as e:
        raise session._closed_error(e) from None
    except SessionError as e:
        session.close(e.code, e.reason)
        raise SessionClosed(e.code, e.reason) from None
    if reply is None:
        raise RequestCancelled(None, what)
    return reply


def abandon(rs: RequestStream) -> None:
    """Our request is given up before its reply (the caller's timeout, its task cancelled,
    the stream failed): cancel its stream both ways (§5.1), or the peer would go on serving
    it, and holding the stream and its credit, for the rest of the session."""
    with contextlib.suppress(TransportError):
        rs.cancel()


async def request_ok(session: SessionBase, make: Callable[[int], RequestMessage], *,
                     fin: bool = False) -> tuple[RequestStream, RequestOk, int]:
    """Send a request answered by REQUEST_OK (PUBLISH, PUBLISH_NAMESPACE,
    SUBSCRIBE_NAMESPACE, TRACK_STATUS) on a new request stream; raise on REQUEST_ERROR."""
    rs = await session.open_request()
    msg = make(session.next_request_id())
    try:
        await rs.send(msg, fin=fin)
        reply = await first_reply(session, rs, msg.TYPE.name)
    except BaseException:
        abandon(rs)
        raise
    if isinstance(reply, RequestErrorMessage):
        await rs.finish()
        await rs.release()
        raise rejected(reply)
    return rs, reply, msg.request_id


async def send_routed(session: SessionBase, rs: RequestStream, msg: RequestMessage,
                      target: DataRoute) -> Any:
    """Send SUBSCRIBE or FETCH and return the first reply; data streams carrying its Request
    ID (or, for a subscription, its Track Alias) reach ``target`` even before that reply. A
    failed request drops the route; REQUEST_ERROR becomes RequestRejected."""
    rid = msg.request_id
    session.bind_request(rid, target)
    try:
        await rs.send(msg)
        reply = await first_reply(session, rs, msg.TYPE.name)
    except BaseException:
        session.unbind_request(rid)
        abandon(rs)
        raise
    if isinstance(reply, RequestErrorMessage):
        session.unbind_request(rid)
        target.ended = True
        await rs.finish()
        await rs.release()
        raise rejected(reply)
    return reply
