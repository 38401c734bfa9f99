"""The responder/publisher side: answering the peer's SUBSCRIBE, FETCH, PUBLISH,
PUBLISH_NAMESPACE, SUBSCRIBE_NAMESPACE and TRACK_STATUS, and publishing with PUBLISH
(§5, §7, §8, §9, §10)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from relay.moqt.codes import (
    GroupOrder,
    MessageType,
    PublishDoneCode,
    RequestErrorCode,
    StreamResetCode,
)
from relay.moqt.dataplane.datagram import encode_datagram
from relay.moqt.dataplane.objects import ObjectDatagram, SubgroupHeader
from relay.moqt.kvp import KeyValuePair, Properties
from relay.moqt.messages import (
    FetchOk,
    Namespace,
    NamespaceDone,
    Publish,
    PublishDone,
    RequestErrorMessage,
    RequestOk,
    RequestUpdate,
    SubscribeOk,
)
from relay.moqt.messages.fetch import Fetch
from relay.moqt.messages.namespace import PublishNamespace, SubscribeNamespace
from relay.moqt.messages.subscribe import Subscribe
from relay.moqt.messages.track_status import TrackStatus
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location, TrackNamespace, namespace_suffix
from relay.transport import StreamReset, TransportError

from .errors import RequestCancelled, RequestRejected
from .request_stream import RequestStream
from .subscribe import Subscription, request_ok
from .writers import FetchWriter, SubgroupWriter, _StreamWriter

if TYPE_CHECKING:
    from .session import MoqtSession

UpdateHook = Callable[[RequestUpdate], Awaitable[Params | None]]


class _Incoming:
    """Common part of a request received from the peer."""

    TYPE: MessageType

    def __init__(self, session: MoqtSession, rs: RequestStream, msg: Any) -> None:
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
        self.session.handler.answered(self, int(code))
        with contextlib.suppress(TransportError):
            await self.rs.send(RequestErrorMessage(int(code), retry_interval, reason[:1024]),
                               fin=True)

    def _answer(self) -> None:
        if self.answered:
            raise RuntimeError(f"{self.TYPE.name} {self.request_id} was already answered")
        self.answered = True
        self.session.handler.answered(self, None)


class _TrackRequest(_Incoming):
    """A request naming one Track (SUBSCRIBE, FETCH, PUBLISH)."""

    @property
    def namespace(self) -> TrackNamespace:
        return self.msg.track_namespace

    @property
    def name(self) -> bytes:
        return self.msg.track_name

    @property
    def full_name(self) -> FullTrackName:
        return FullTrackName(self.msg.track_namespace, self.msg.track_name)


# -- the publisher side of one subscription --------------------------------------------------------


class ServedSubscription:
    """Our side of a subscription we publish (a SUBSCRIBE we accepted, or a PUBLISH we sent).

    Open one subgroup stream per (Group, Subgroup) with :meth:`open_subgroup`, the fill with
    :meth:`open_fill`, and end with :meth:`done` (PUBLISH_DONE after every data stream is
    closed, §7.7). ``cancelled`` is set when the subscriber cancels; every open data stream is
    then reset with CANCELLED (§8.1).
    """

    def __init__(self, session: MoqtSession, rs: RequestStream, request_id: int,
                 namespace: TrackNamespace, name: bytes, params: Params, track_alias: int,
                 requested_by: MessageType) -> None:
        self.session = session
        self.rs = rs
        self.request_id = request_id
        self.full_name = FullTrackName(namespace, name)
        self.params = params
        self.track_alias = track_alias
        self.requested_by = requested_by
        self.forward = params.forward is not False
        self.subscriber_priority = params.subscriber_priority if \
            params.subscriber_priority is not None else 128
        self.group_order = params.group_order or GroupOrder.ASCENDING
        self.cancelled = asyncio.Event()
        self.cancel_code: int | None = None
        self.on_update: UpdateHook | None = None
        self.stream_count = 0
        self._writers: set[_StreamWriter] = set()
        self._all_closed = asyncio.Event()
        self._all_closed.set()
        self._done = False

    @property
    def open_streams(self) -> int:
        return len(self._writers)

    def _track(self, w: _StreamWriter) -> None:
        self.stream_count += 1
        self._writers.add(w)
        self._all_closed.clear()

    def _untrack(self, w: _StreamWriter) -> None:
        self._writers.discard(w)
        if not self._writers:
            self._all_closed.set()

    async def open_subgroup(self, group: int, subgroup: int = 0, priority: int | None = 128, *,
                            first_object: bool = True, end_of_group: bool = False,
                            properties: bool = False) -> SubgroupWriter:
        """Open a subgroup stream and write its SUBGROUP_HEADER (§11.2)."""
        if self.cancelled.is_set():
            raise RequestCancelled(self.cancel_code, "subscription")
        stream = await self.session.conn.open_uni()
        header = SubgroupHeader(self.track_alias, group, subgroup, priority,
                                first_object=first_object, end_of_group=end_of_group,
                                has_properties=properties)
        w = SubgroupWriter(stream, header, self._untrack)
        self._track(w)
        await stream.write(w.header_bytes())
        return w

    def send_datagram(self, group: int, object_id: int, payload: bytes, *,
                      priority: int | None = 128, properties: bytes | None = None,
                      end_of_group: bool = False) -> bool:
        """One Object as an OBJECT_DATAGRAM (§11.8); False if it did not fit a packet (it is
        then dropped, as datagrams may be). KVCS never sends datagrams."""
        if self.cancelled.is_set() or not self.forward:
            return False
        data = encode_datagram(ObjectDatagram(self.track_alias, group, object_id, priority,
                                              payload, None, properties, end_of_group))
        return self.session.conn.send_datagram(data)

    async def open_fill(self, request_id: int | None = None,
                        group_order: GroupOrder | None = None) -> FetchWriter:
        """Open the fill fetch stream of this subscription (§9.4): FETCH_HEADER carries the
        Request ID of the SUBSCRIBE (default) or of the REQUEST_UPDATE that asked for it."""
        if self.cancelled.is_set():
            raise RequestCancelled(self.cancel_code, "subscription")
        stream = await self.session.conn.open_uni()
        rid = self.request_id if request_id is None else request_id
        w = FetchWriter(stream, rid, group_order or self.group_order, self._untrack)
        self._track(w)
        await stream.write(w.header_bytes())
        return w

    async def done(self, status: int = PublishDoneCode.TRACK_ENDED, reason: str = "",
                   timeout: float = 30.0) -> None:
        """PUBLISH_DONE once every data stream is closed, then FIN (§7.7). Streams still open
        after ``timeout`` are reset."""
        if self._done:
            return
        self._done = True
        try:
            await asyncio.wait_for(self._all_closed.wait(), timeout)
        except TimeoutError:
            for w in list(self._writers):
                w.reset(StreamResetCode.INTERNAL_ERROR)
        if self.cancelled.is_set():
            return
        with contextlib.suppress(TransportError):
            await self.rs.send(PublishDone(int(status), self.stream_count, reason[:1024]),
                               fin=True)

    def _on_cancel(self, code: int | None) -> None:
        if self.cancelled.is_set():
            return
        self.cancel_code = code
        self.cancelled.set()
        for w in list(self._writers):
            w.reset(StreamResetCode.CANCELLED)

    async def control_loop(self) -> None:
        """REQUEST_UPDATEs from the subscriber (GOAWAY aside, nothing else gets past the
        state); its reset or STOP_SENDING is a cancel, its FIN is not (§5.1)."""
        try:
            while (msg := await self.rs.recv()) is not None:
                if isinstance(msg, RequestUpdate):
                    await self._apply_update(msg)
        except StreamReset as e:
            self._on_cancel(e.code)

    async def _apply_update(self, msg: RequestUpdate) -> None:
        p = msg.params
        if p.forward is not None:
            self.forward = p.forward
        if p.subscriber_priority is not None:
            self.subscriber_priority = p.subscriber_priority
        reply_params: Params | None = Params()
        if self.on_update is not None:
            try:
                reply_params = await self.on_update(msg)
            except RequestRejected as e:
                await self.rs.send(RequestErrorMessage(e.code, 0, e.reason))
                return
        await self.rs.send(RequestOk(reply_params or Params()))


# -- SUBSCRIBE -------------------------------------------------------------------------------------


class IncomingSubscribe(_TrackRequest):
    TYPE = MessageType.SUBSCRIBE
    msg: Subscribe


    async def accept(self, largest: Location | None, *, expires: int | None = None,
                     properties: Properties = (), track_alias: int | None = None
                     ) -> ServedSubscription:
        """SUBSCRIBE_OK with LARGEST_OBJECT = ``largest`` (the L the filters were evaluated
        against, §9.6)."""
        self._answer()
        alias = self.session.next_track_alias() if track_alias is None else track_alias
        served = ServedSubscription(self.session, self.rs, self.request_id, self.namespace,
                                    self.name, self.params, alias, MessageType.SUBSCRIBE)
        await self.rs.send(SubscribeOk(alias, Params(largest_object=largest, expires=expires),
                                       properties))
        self.session.spawn(served.control_loop(), "served-subscription")
        return served


# -- FETCH ---------------------------------------------------------------------------------------


class IncomingFetch(_TrackRequest):
    TYPE = MessageType.FETCH
    msg: Fetch

    def __init__(self, session: MoqtSession, rs: RequestStream, msg: Fetch) -> None:
        super().__init__(session, rs, msg)
        self.cancelled = asyncio.Event()
        self.writer: FetchWriter | None = None


    @property
    def group_order(self) -> GroupOrder:
        return self.params.group_order or GroupOrder.ASCENDING

    async def accept(self, end_of_track: bool, end_location: Location,
                     properties: Properties = ()) -> FetchWriter:
        """FETCH_OK, then the fetch stream with its FETCH_HEADER (§10). Write the Objects to
        the returned writer and ``finish()`` it; the request stream is FINed after that."""
        self._answer()
        await self.rs.send(FetchOk(end_of_track, end_location, Params(), properties))
        stream = await self.session.conn.open_uni()
        w = FetchWriter(stream, self.request_id, self.group_order, self._writer_closed)
        self.writer = w
        await stream.write(w.header_bytes())
        self.session.spawn(self._watch(), "served-fetch")
        return w

    def _writer_closed(self, w: _StreamWriter) -> None:
        # §5.2: the responder FINs the request stream once the fetch stream is finished.
        self.session.spawn(self.rs.finish(), "fetch-request-fin")

    async def _watch(self) -> None:
        try:
            while (msg := await self.rs.recv()) is not None:
                if isinstance(msg, RequestUpdate):
                    await self.rs.send(RequestOk(Params()))
        except StreamReset:
            self.cancelled.set()
            if self.writer is not None:
                self.writer.reset(StreamResetCode.CANCELLED)


# -- PUBLISH (received: we become the subscriber) ------------------------------------------


class IncomingPublish(_TrackRequest):
    TYPE = MessageType.PUBLISH
    msg: Publish

    def __init__(self, session: MoqtSession, rs: RequestStream, msg: Publish) -> None:
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
            self.session.spawn(sub.update(Params(forward=True)), "publish-forward")
        return sub

    async def reject(self, code: int, reason: str = "", retry_interval: int = 0) -> None:
        await super().reject(code, reason, retry_interval)
        self.subscription.cancel(StreamResetCode.CANCELLED)


async def start_publish(session: MoqtSession, namespace: TrackNamespace, name: bytes,
                        params: Params, properties: tuple[KeyValuePair, ...]
                        ) -> ServedSubscription:
    alias = session.next_track_alias()
    rs, _, rid = await request_ok(
        session, lambda rid: Publish(rid, namespace, name, alias, params, properties))
    served = ServedSubscription(session, rs, rid, namespace, name, params, alias,
                                MessageType.PUBLISH)
    session.spawn(served.control_loop(), "published-track")
    return served


# -- namespaces ----------------------------------------------------------------------------------


class IncomingPublishNamespace(_Incoming):
    TYPE = MessageType.PUBLISH_NAMESPACE
    msg: PublishNamespace

    def __init__(self, session: MoqtSession, rs: RequestStream, msg: PublishNamespace) -> None:
        super().__init__(session, rs, msg)
        self.withdrawn = asyncio.Event()

    @property
    def namespace(self) -> TrackNamespace:
        return self.msg.track_namespace

    async def accept(self) -> None:
        """REQUEST_OK; ``withdrawn`` is set when the request stream ends in either direction
        (FIN, RESET_STREAM or STOP_SENDING, §18 rule 4) or the session closes."""
        self._answer()
        await self.rs.send(RequestOk(Params()))
        self.session.spawn(self._watch(), "published-namespace")

    async def _watch(self) -> None:
        try:
            while (msg := await self.rs.recv()) is not None:
                if isinstance(msg, RequestUpdate):
                    await self.rs.send(RequestOk(Params()))
        except (StreamReset, TransportError):
            pass
        finally:
            self.withdrawn.set()

    def withdraw(self) -> None:
        """Withdraw from our side (cancel the stream)."""
        self.rs.cancel(StreamResetCode.CANCELLED)
        self.withdrawn.set()


class IncomingSubscribeNamespace(_Incoming):
    TYPE = MessageType.SUBSCRIBE_NAMESPACE
    msg: SubscribeNamespace

    def __init__(self, session: MoqtSession, rs: RequestStream, msg: SubscribeNamespace
                 ) -> None:
        super().__init__(session, rs, msg)
        self.cancelled = asyncio.Event()
        self._announced: set[TrackNamespace] = set()

    @property
    def prefix(self) -> TrackNamespace:
        return self.msg.track_namespace

    async def accept(self) -> None:
        """REQUEST_OK; then call :meth:`announce` / :meth:`withdraw` (§7.13)."""
        self._answer()
        await self.rs.send(RequestOk(Params()))
        self.session.spawn(self._watch(), "namespace-subscription")

    async def announce(self, namespace: TrackNamespace) -> None:
        """NAMESPACE for a full ``namespace`` under the prefix (sent once per namespace)."""
        if namespace in self._announced or self.cancelled.is_set():
            return
        self._announced.add(namespace)
        await self._send(Namespace(namespace_suffix(namespace, self.prefix)))

    async def withdraw(self, namespace: TrackNamespace) -> None:
        """NAMESPACE_DONE for a namespace announced before."""
        if namespace not in self._announced or self.cancelled.is_set():
            return
        self._announced.discard(namespace)
        await self._send(NamespaceDone(namespace_suffix(namespace, self.prefix)))

    async def _send(self, msg: Namespace | NamespaceDone) -> None:
        try:
            await self.rs.send(msg)
        except TransportError:
            self.cancelled.set()

    async def _watch(self) -> None:
        # requester FIN: it sends no more updates; keep announcing
        try:
            while (msg := await self.rs.recv()) is not None:
                if isinstance(msg, RequestUpdate):
                    await self.rs.send(RequestOk(Params()))
        except (StreamReset, TransportError):
            self.cancelled.set()


class IncomingTrackStatus(_Incoming):
    TYPE = MessageType.TRACK_STATUS
    msg: TrackStatus

    @property
    def full_name(self) -> FullTrackName:
        return FullTrackName(self.msg.track_namespace, self.msg.track_name)

    async def reply(self, largest: Location | None, properties: Properties = (),
                    expires: int | None = None) -> None:
        """TRACK_STATUS_OK (a REQUEST_OK with LARGEST_OBJECT and Track Properties), FIN."""
        self._answer()
        await self.rs.send(RequestOk(Params(largest_object=largest, expires=expires),
                                     properties), fin=True)


__all__ = [
    "IncomingFetch",
    "IncomingPublish",
    "IncomingPublishNamespace",
    "IncomingSubscribe",
    "IncomingSubscribeNamespace",
    "IncomingTrackStatus",
    "ServedSubscription",
    "start_publish",
]

