"""SUBSCRIBE_TRACKS, both sides (§7.15; draft-22 "SUBSCRIBE_TRACKS"): a subscriber asks for a
PUBLISH per Track under a namespace prefix, now and later. ``TrackSubscription`` is ours (the
PUBLISHes arrive as the peer's requests, at ``SessionHandler.publish``);
``IncomingSubscribeTracks`` is the peer's (answer it, then PUBLISH with ``session.publish``).

The request stream carries only the REQUEST_OK, the subscriber's REQUEST_UPDATEs (FORWARD,
Range filters and TRACK_NAMESPACE_PREFIX for the PUBLISHes still to come) and their replies;
cancelling it stops further PUBLISHes, never the subscriptions already made (each has its own
request stream)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from relay.moqt.codes import MessageType, StreamResetCode
from relay.moqt.messages import (
    RequestErrorMessage,
    RequestOk,
    RequestUpdate,
    SubscribeTracks,
)
from relay.moqt.params import Params
from relay.moqt.primitives import TrackNamespace
from relay.moqt.range_filter import override_filters
from relay.transport import StreamReset, TransportError

from .errors import RequestCancelled, RequestRejected
from .request_stream import RequestStream
from .requests import IncomingRequest, rejected, request_ok

if TYPE_CHECKING:
    from .base import SessionBase

TracksUpdateHook = Callable[[Params], Awaitable[None]]


def updated(params: Params, update: Params) -> Params:
    """The SUBSCRIBE_TRACKS parameters after a REQUEST_UPDATE (§7.5: omitted ones keep their
    values; a zero-length Range filter removes that filter)."""
    return Params(
        authorization_tokens=update.authorization_tokens or params.authorization_tokens,
        forward=params.forward if update.forward is None else update.forward,
        group_order=params.group_order,
        range_filters=override_filters(params.range_filters, update.range_filters),
        include_properties=params.include_properties,
        track_namespace_prefix=update.track_namespace_prefix)


class IncomingSubscribeTracks(IncomingRequest):
    TYPE = MessageType.SUBSCRIBE_TRACKS
    msg: SubscribeTracks

    def __init__(self, session: SessionBase, rs: RequestStream, msg: SubscribeTracks) -> None:
        super().__init__(session, rs, msg)
        self.prefix: TrackNamespace = msg.track_namespace
        self.cancelled = asyncio.Event()
        self.changed = asyncio.Event()  # an update was applied (cleared by the reader)
        # called with the parameters as updated, before REQUEST_OK; may raise RequestRejected
        self.on_update: TracksUpdateHook | None = None

    async def accept(self) -> None:
        """REQUEST_OK; then PUBLISH each matching Track until ``cancelled`` is set."""
        self._answer()
        await self.rs.send(RequestOk(Params()))
        self.session.spawn(self._watch(), "track-subscription")

    async def _watch(self) -> None:
        # requester FIN: it sends no more updates; the PUBLISHes go on
        try:
            while (msg := await self.rs.recv()) is not None:
                if isinstance(msg, RequestUpdate):
                    await self._apply(msg)
        except (StreamReset, TransportError):
            self.cancelled.set()

    async def _apply(self, msg: RequestUpdate) -> None:
        params = updated(self.params, msg.params)
        try:
            if self.on_update is not None:
                await self.on_update(params)
        except RequestRejected as e:
            # §7.5: a failed update of a namespace request closes its request stream
            await self.rs.send(RequestErrorMessage(e.code, 0, e.reason[:1024]), fin=True)
            self.cancelled.set()
            return
        self.params = params
        if msg.params.track_namespace_prefix is not None:
            self.prefix = msg.params.track_namespace_prefix
        self.changed.set()
        await self.rs.send(RequestOk(Params()))


class TrackSubscription:
    """A SUBSCRIBE_TRACKS we sent and the peer accepted: its PUBLISHes reach our handler;
    ``update`` changes what the next ones carry, ``cancel`` stops them."""

    def __init__(self, session: SessionBase, rs: RequestStream, prefix: TrackNamespace) -> None:
        self.session = session
        self.rs = rs
        self.prefix = prefix
        self.ended = asyncio.Event()
        self._waiters: deque[asyncio.Future[RequestOk | RequestErrorMessage]] = deque()

    async def _watch(self) -> None:
        try:
            while (msg := await self.rs.recv()) is not None:
                if isinstance(msg, RequestOk | RequestErrorMessage) and self._waiters:
                    fut = self._waiters.popleft()
                    if not fut.done():
                        fut.set_result(msg)
        except StreamReset:
            pass
        finally:
            self.ended.set()
            for fut in self._waiters:
                if not fut.done():
                    fut.set_exception(RequestCancelled(None, "SUBSCRIBE_TRACKS"))
            self._waiters.clear()

    async def update(self, params: Params) -> RequestOk:
        """REQUEST_UPDATE (FORWARD, Range filters, TRACK_NAMESPACE_PREFIX); raises
        RequestRejected on REQUEST_ERROR (the peer then ends the request, §7.5)."""
        if self.ended.is_set():
            raise RequestCancelled(None, "SUBSCRIBE_TRACKS")
        fut: asyncio.Future[RequestOk | RequestErrorMessage] = \
            asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        await self.rs.send(RequestUpdate(self.session.next_request_id(), params))
        reply = await fut
        if isinstance(reply, RequestErrorMessage):
            raise rejected(reply)
        if params.track_namespace_prefix is not None:
            self.prefix = params.track_namespace_prefix
        return reply

    def cancel(self) -> None:
        with contextlib.suppress(TransportError):
            self.rs.cancel(StreamResetCode.CANCELLED)
        self.ended.set()


async def start_subscribe_tracks(session: SessionBase, prefix: TrackNamespace,
                                 params: Params) -> TrackSubscription:
    rs, _, _ = await request_ok(session, lambda rid: SubscribeTracks(rid, prefix, params))
    handle = TrackSubscription(session, rs, prefix)
    session.spawn(handle._watch(), "subscribe-tracks")
    return handle
