"""SUBSCRIBE, both sides (§5.2, §7.1-§7.8, §8, §9).

``Subscription`` is the subscriber's side of a subscription: a SUBSCRIBE we sent
(``start_subscribe``) or a PUBLISH we accepted (publish.py). ``ServedSubscription`` is the
publisher's side: a SUBSCRIBE we accepted (``IncomingSubscribe.accept``) or a PUBLISH we sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from relay.moqt.codes import (
    GroupOrder,
    MessageType,
    PropertyType,
    PublishDoneCode,
    StreamResetCode,
)
from relay.moqt.dataplane.datagram import encode_datagram
from relay.moqt.dataplane.fetch import FetchStreamParser
from relay.moqt.dataplane.objects import ObjectDatagram, SubgroupHeader
from relay.moqt.kvp import Properties
from relay.moqt.messages import (
    PublishDone,
    PublishStateNotify,
    RequestErrorMessage,
    RequestOk,
    RequestUpdate,
    Subscribe,
    SubscribeOk,
)
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location, TrackNamespace
from relay.transport import StreamReset, TransportError

from .errors import RequestCancelled, RequestRejected, SessionClosed
from .event_queue import EventQueue, EventSource
from .events import Source, StreamEnded, StreamInfo, SubscriptionDone, SubscriptionEvent
from .request_stream import RequestStream
from .requests import IncomingTrackRequest, OutgoingTrackRequest, rejected, send_routed
from .writers import FetchWriter, SubgroupWriter, _StreamWriter

if TYPE_CHECKING:
    from .base import SessionBase

UpdateHook = Callable[[RequestUpdate], Awaitable[Params | None]]


# -- the subscriber ------------------------------------------------------------------------------


class Subscription(OutgoingTrackRequest, EventSource[SubscriptionEvent]):
    """The subscriber side of one subscription (SUBSCRIBE we sent, or PUBLISH we accepted).

    Iterate it for ``SubscriptionEvent``s; iteration ends after ``SubscriptionDone``. It
    raises ``SessionClosed`` if the session dies first.
    """

    def __init__(self, session: SessionBase, rs: RequestStream, request_id: int,
                 namespace: TrackNamespace, name: bytes, params: Params) -> None:
        super().__init__(session, rs, request_id, namespace, name, params)
        self.track_alias: int | None = None
        self.largest: Location | None = None
        self.established = asyncio.Event()
        self.done: PublishDone | None = None
        self._events = EventQueue(session.config.receive_queue)
        self._open_streams = 0
        self._streams_ended = 0
        self._stream_ended = asyncio.Event()
        # update()s waiting for their reply, in order (§5.1); None once no reply can come
        self._update_waiters: deque[asyncio.Future[RequestOk | RequestErrorMessage]] | None = \
            deque()
        self._update_room = asyncio.Event()  # a reply came: the peer's limit may allow another
        self._fill_request_ids: list[int] = []
        # a fill's own GROUP_ORDER (FILL_PARAMETERS) decides how its stream is decoded, by
        # the Request ID it carries (§9.4); the others use the subscription's
        self._fill_orders: dict[int, GroupOrder] = {}
        self._fill_order(request_id, params)

    def _fill_order(self, request_id: int, params: Params) -> None:
        if params.fill is not None and params.fill.group_order is not None:
            self._fill_orders[request_id] = GroupOrder(params.fill.group_order)

    # events ---------------------------------------------------------------------------------

    def stream_opened(self) -> None:
        self._open_streams += 1

    def stream_closed(self) -> None:
        self._streams_ended += 1
        self._stream_ended.set()

    def session_closed(self, code: int, reason: str) -> None:
        if not self.ended:
            self.ended = True
            self._events.put_nowait_end(SessionClosed(code, reason))
        self._end_updates(SessionClosed(code, reason))

    async def fetch_stream_started(self, parser: FetchStreamParser
                                   ) -> tuple[Source, list[Any]] | None:
        """Its fill stream (§9.4), decoded in the fill's effective Group Order: its own
        GROUP_ORDER (FILL_PARAMETERS), else the subscription's, which the SUBSCRIBE_OK's
        Track Properties may give: a fill that overtook it waits for it (as long as a
        subgroup stream would wait for its alias)."""
        if not self.established.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.established.wait(),
                                       self.session.config.alias_wait_timeout)
        if not self.established.is_set() or self.ended:
            return None
        assert parser.header is not None  # the stream was routed by its Request ID
        order = self._fill_orders.get(parser.header.request_id, self.group_order)
        return Source.FILL, parser.set_group_order(order)

    async def fetch_stream_ended(self, info: StreamInfo, fin: bool, reset_code: int | None
                                 ) -> None:
        await self.deliver(StreamEnded(info, fin, reset_code))

    def _end_updates(self, exc: BaseException) -> None:
        """No reply can come any more: waiting update()s fail with ``exc``."""
        waiters, self._update_waiters = self._update_waiters, None
        for fut in waiters or ():
            if not fut.done():
                fut.set_exception(exc)
        self._update_room.set()

    # control --------------------------------------------------------------------------------

    def _established(self, alias: int, params: Params, properties: Properties) -> None:
        self.track_alias = alias
        self.largest = params.largest_object
        self.track_properties = properties
        for p in properties:
            # DEFAULT_PUBLISHER_GROUP_ORDER applies unless the subscriber chose an order.
            if (p.type == PropertyType.DEFAULT_PUBLISHER_GROUP_ORDER and p.value in (1, 2)
                    and self.params.group_order is None):
                self.group_order = GroupOrder(p.value)
        self.session.alias_bound(alias)  # the state bound it when the reply arrived
        self.established.set()

    async def control_loop(self) -> None:
        """Read the request stream after the first reply: PUBLISH_DONE, update replies,
        PUBLISH_STATE_NOTIFY, GOAWAY, and the publisher's REQUEST_UPDATEs on a PUBLISH
        (§5.2; the state let through only what may come here)."""
        try:
            await self._control_loop()
        finally:
            self._end_updates(RequestCancelled(None, "subscription"))

    async def _control_loop(self) -> None:
        while True:
            try:
                msg = await self.rs.recv()
            except StreamReset as e:
                self._finish(None, f"request stream reset (0x{e.code:x})")
                return
            if msg is None:
                if self.done is None:
                    self._finish(None, "request stream ended without PUBLISH_DONE")
                return
            if isinstance(msg, PublishDone):
                self.done = msg
                self.session.spawn(self._linger(msg), "publish-done")
            elif isinstance(msg, RequestOk | RequestErrorMessage):
                if isinstance(msg, RequestOk) and msg.params.largest_object is not None:
                    self.largest = max(self.largest or msg.params.largest_object,
                                       msg.params.largest_object)
                if self._update_waiters:  # the state matched it to our oldest update
                    fut = self._update_waiters.popleft()
                    if not fut.done():
                        fut.set_result(msg)
                self._update_room.set()
            elif isinstance(msg, PublishStateNotify):
                if msg.params.largest_object is not None:
                    self.largest = msg.params.largest_object
            elif isinstance(msg, RequestUpdate):  # the publisher's own settings changed
                await self.rs.send(RequestOk(Params()))

    async def _linger(self, msg: PublishDone) -> None:
        # §7.7: keep state until every announced stream was seen, or a timer runs out.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.session.config.done_linger
        while self._streams_ended < min(msg.stream_count, 1 << 32) or \
                self._streams_ended < self._open_streams:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self._stream_ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stream_ended.wait(), remaining)
        await self._events.put(SubscriptionDone(msg.status_code, msg.stream_count, msg.reason))
        self._finish(msg, "")
        await self.rs.finish()

    def _finish(self, msg: PublishDone | None, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        if msg is None:
            self._events.put_nowait_end(RequestCancelled(None, f"subscription: {reason}"))
        else:
            self._events.put_nowait_end()
        self._unbind()

    def _unbind(self) -> None:
        self._end_updates(RequestCancelled(None, "subscription"))
        if self.track_alias is not None:
            self.session.unbind_alias(self.track_alias, self.request_id)
        self.session.unbind_request(self.request_id)
        for rid in self._fill_request_ids:
            self.session.unbind_request(rid)

    def cancel(self, code: int = StreamResetCode.CANCELLED) -> None:
        """Unsubscribe: STOP_SENDING + RESET_STREAM on the request stream (§5.1)."""
        self.rs.cancel(code)
        if not self.ended:
            self.ended = True
            self._events.put_nowait_end(discard=True)
        self._unbind()

    async def update(self, params: Params) -> RequestOk:
        """REQUEST_UPDATE on this subscription; raises RequestRejected on REQUEST_ERROR.
        With FILL_PARAMETERS, the fill stream carries this update's Request ID (§9.1)."""
        # §4.2: at most the peer's MAX_REQUEST_UPDATES unanswered on this stream
        while self._update_waiters is not None and not self.rs.state.update_room:
            self._update_room.clear()
            await self._update_room.wait()
        if self._update_waiters is None:
            raise RequestCancelled(None, "subscription")
        fut: asyncio.Future[RequestOk | RequestErrorMessage] = \
            asyncio.get_running_loop().create_future()
        self._update_waiters.append(fut)
        rid = self.session.next_request_id()
        if params.fill is not None:
            self._fill_request_ids.append(rid)
            self._fill_order(rid, params)
            self.session.bind_request(rid, self)
        await self.rs.send(RequestUpdate(rid, params))
        reply = await fut
        if isinstance(reply, RequestErrorMessage):
            raise rejected(reply)
        return reply


async def start_subscribe(session: SessionBase, namespace: TrackNamespace, name: bytes,
                          params: Params) -> Subscription:
    rs = await session.open_request()
    rid = session.next_request_id()
    sub = Subscription(session, rs, rid, namespace, name, params)
    # the fill stream may overtake SUBSCRIBE_OK
    msg = Subscribe(rid, namespace, name, params)
    reply: SubscribeOk = await send_routed(session, rs, msg, sub)
    sub._established(reply.track_alias, reply.params, reply.track_properties)
    session.spawn(sub.control_loop(), "subscription")
    return sub


# -- the publisher -------------------------------------------------------------------------------


class ServedSubscription:
    """Our side of a subscription we publish (a SUBSCRIBE we accepted, or a PUBLISH we sent).

    Open one subgroup stream per (Group, Subgroup) with :meth:`open_subgroup`, the fill with
    :meth:`open_fill`, and end with :meth:`done` (PUBLISH_DONE after every data stream is
    closed, §7.7). ``cancelled`` is set when the subscriber cancels; every open data stream is
    then reset with CANCELLED (§8.1).
    """

    def __init__(self, session: SessionBase, rs: RequestStream, request_id: int,
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
        # called after the REQUEST_ERROR of a failed REQUEST_UPDATE: the publisher then ends
        # the subscription with PUBLISH_DONE UPDATE_FAILED (§7.5)
        self.on_update_failed: Callable[[RequestRejected], None] | None = None
        self.stream_count = 0
        self._writers: set[_StreamWriter] = set()
        self._all_closed = asyncio.Event()
        self._all_closed.set()
        self._done = False

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
                if self.on_update_failed is not None:
                    self.on_update_failed(e)
                return
        await self.rs.send(RequestOk(reply_params or Params()))


class IncomingSubscribe(IncomingTrackRequest):
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
