"""The requester/receiver side: SUBSCRIBE, FETCH, SUBSCRIBE_NAMESPACE, PUBLISH_NAMESPACE,
TRACK_STATUS sent by us, and the data streams that answer them (§5, §7, §9, §10, §11)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from relay.moqt.codes import GroupOrder, ObjectStatus, StreamResetCode
from relay.moqt.dataplane.fetch import FetchStreamParser
from relay.moqt.dataplane.objects import EndOfRange, FetchObject, SubgroupHeader
from relay.moqt.dataplane.subgroup import SubgroupStreamParser
from relay.moqt.errors import SessionError, protocol_violation
from relay.moqt.kvp import Properties
from relay.moqt.messages import (
    Fetch,
    FetchOk,
    Namespace,
    NamespaceDone,
    PublishDone,
    PublishNamespace,
    PublishStateNotify,
    RequestErrorMessage,
    RequestMessage,
    RequestOk,
    RequestUpdate,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    TrackStatus,
)
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location, TrackNamespace
from relay.transport import RecvStream, StreamReset, TransportError

from .errors import RequestCancelled, RequestRejected, SessionClosed, StreamAborted
from .events import (
    FetchEvent,
    NamespaceEvent,
    RangeMarker,
    ReceivedObject,
    Source,
    StreamEnded,
    StreamInfo,
    SubscriptionDone,
    SubscriptionEvent,
)
from .request_stream import RequestStream

if TYPE_CHECKING:
    from .session import MoqtSession

E = TypeVar("E")
_END = object()  # queue sentinel: iteration ends


class _EventQueue:
    """A bounded queue of events, then an end: a marker or a terminal error.

    ``put`` waits while ``maxsize`` events are queued (that is what stops a stream reader
    and so withholds QUIC credit from the sender). The end is kept apart from the bound, so
    ending never drops a queued event: readers get every event, then the end. Only
    ``end(discard=True)`` (the consumer cancelled) drops what is queued.
    """

    def __init__(self, maxsize: int) -> None:
        self._items: deque[Any] = deque()
        self._max = maxsize
        self._end: Any = None
        self._changed = asyncio.Event()
        self.finished = False

    async def put(self, item: Any) -> None:
        while not self.finished and len(self._items) >= self._max:
            self._changed.clear()
            await self._changed.wait()
        if not self.finished:
            self._items.append(item)
            self._changed.set()

    def put_nowait_end(self, item: Any = _END, *, discard: bool = False) -> None:
        if self.finished:
            return
        self.finished = True
        self._end = item
        if discard:
            self._items.clear()
        self._changed.set()

    async def get(self) -> Any:
        while not self._items:
            if self.finished:
                if self._end is _END:
                    raise StopAsyncIteration
                raise self._end
            self._changed.clear()
            await self._changed.wait()
        item = self._items.popleft()
        self._changed.set()  # room for a waiting put
        return item


class _EventSource(Generic[E]):
    """An async iterator over one request's events (see ``_EventQueue``)."""

    _events: _EventQueue

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> E:
        return await self._events.get()  # type: ignore[no-any-return]

    async def deliver(self, event: E) -> None:
        await self._events.put(event)


def _rejected(msg: RequestErrorMessage) -> RequestRejected:
    return RequestRejected(msg.error_code, msg.reason, msg.retry_interval, msg.redirect)


async def _first_reply(session: MoqtSession, rs: RequestStream, what: str) -> Any:
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


async def request_ok(session: MoqtSession, make: Callable[[int], RequestMessage], *,
                     fin: bool = False) -> tuple[RequestStream, RequestOk, int]:
    """Send a request answered by REQUEST_OK (PUBLISH, PUBLISH_NAMESPACE,
    SUBSCRIBE_NAMESPACE, TRACK_STATUS) on a new request stream; raise on REQUEST_ERROR."""
    rs = await session.open_request()
    msg = make(session.next_request_id())
    await rs.send(msg, fin=fin)
    reply = await _first_reply(session, rs, msg.TYPE.name)
    if isinstance(reply, RequestErrorMessage):
        await rs.finish()
        await rs.release()
        raise _rejected(reply)
    return rs, reply, msg.request_id


# -- SUBSCRIBE ----------------------------------------------------------------------------------


class Subscription(_EventSource[SubscriptionEvent]):
    """The subscriber side of one subscription (SUBSCRIBE we sent, or PUBLISH we accepted).

    Iterate it for ``SubscriptionEvent``s; iteration ends after ``SubscriptionDone``. It
    raises ``SessionClosed`` if the session dies first.
    """

    def __init__(self, session: MoqtSession, rs: RequestStream, request_id: int,
                 namespace: TrackNamespace, name: bytes, params: Params) -> None:
        self.session = session
        self.rs = rs
        self.request_id = request_id
        self.full_name = FullTrackName(namespace, name)
        self.params = params
        self.track_alias: int | None = None
        self.largest: Location | None = None
        self.track_properties: Properties = ()
        self.group_order = params.group_order or GroupOrder.ASCENDING
        self.established = asyncio.Event()
        self.ended = False
        self.done: PublishDone | None = None
        self._events = _EventQueue(session.config.receive_queue)
        self._open_streams = 0
        self._streams_ended = 0
        self._stream_ended = asyncio.Event()
        self._fill_parsers: list[FetchStreamParser] = []
        # update()s waiting for their reply, in order (§5.1); None once no reply can come
        self._update_waiters: deque[asyncio.Future[RequestOk | RequestErrorMessage]] | None = \
            deque()
        self._update_room = asyncio.Event()  # a reply came: the peer's limit may allow another
        self._fill_request_ids: list[int] = []

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
            if p.type == 0x22 and p.value in (1, 2) and self.params.group_order is None:
                self.group_order = GroupOrder(p.value)
        self.session.alias_bound(alias)  # the state bound it when the reply arrived
        self.established.set()
        for parser in self._fill_parsers:
            if parser.group_order is None:
                parser.set_group_order(self.group_order)

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
            self.session.unbind_alias(self.track_alias, self)
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
            self.session.bind_request(rid, self)
        await self.rs.send(RequestUpdate(rid, params))
        reply = await fut
        if isinstance(reply, RequestErrorMessage):
            raise _rejected(reply)
        return reply


async def _send_routed(session: MoqtSession, rs: RequestStream, msg: RequestMessage,
                       target: Subscription | FetchResponse) -> Any:
    """Send SUBSCRIBE or FETCH and return the first reply; data streams carrying its Request
    ID (or, for a subscription, its Track Alias) reach ``target`` even before that reply. A
    failed request drops the route; REQUEST_ERROR becomes RequestRejected."""
    rid = msg.request_id
    session.bind_request(rid, target)
    try:
        await rs.send(msg)
        reply = await _first_reply(session, rs, msg.TYPE.name)
    except BaseException:
        session.unbind_request(rid)
        raise
    if isinstance(reply, RequestErrorMessage):
        session.unbind_request(rid)
        target.ended = True
        await rs.finish()
        await rs.release()
        raise _rejected(reply)
    return reply


async def start_subscribe(session: MoqtSession, namespace: TrackNamespace, name: bytes,
                          params: Params) -> Subscription:
    rs = await session.open_request()
    rid = session.next_request_id()
    sub = Subscription(session, rs, rid, namespace, name, params)
    # the fill stream may overtake SUBSCRIBE_OK
    reply: SubscribeOk = await _send_routed(session, rs, Subscribe(rid, namespace, name, params),
                                            sub)
    sub._established(reply.track_alias, reply.params, reply.track_properties)
    session.spawn(sub.control_loop(), "subscription")
    return sub


# -- FETCH --------------------------------------------------------------------------------------


class FetchResponse(_EventSource[FetchEvent]):
    """The requester side of a FETCH: FETCH_OK's fields, then the fetch stream's Objects."""

    def __init__(self, session: MoqtSession, rs: RequestStream, request_id: int,
                 namespace: TrackNamespace, name: bytes, params: Params) -> None:
        self.session = session
        self.rs = rs
        self.request_id = request_id
        self.full_name = FullTrackName(namespace, name)
        self.params = params
        self.group_order = params.group_order or GroupOrder.ASCENDING
        self.end_of_track = False
        self.end_location: Location | None = None
        self.track_properties: Properties = ()
        self._events = _EventQueue(session.config.receive_queue)
        self.ended = False

    def stream_opened(self) -> None:
        pass

    def stream_closed(self) -> None:
        pass

    def fetch_stream_ended(self, fin: bool, reset_code: int | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.session.unbind_request(self.request_id)
        self._events.put_nowait_end(_END if fin else StreamAborted(reset_code or 0))
        self.session.spawn(self._close_request(), "fetch-fin")

    async def _close_request(self) -> None:
        """The response is complete: FIN the request stream and forget it (§7.10)."""
        await self.rs.finish()
        await self.rs.release()

    def session_closed(self, code: int, reason: str) -> None:
        if not self.ended:
            self.ended = True
            self._events.put_nowait_end(SessionClosed(code, reason))

    def cancel(self, code: int = StreamResetCode.CANCELLED) -> None:
        """STOP_SENDING the request stream (§10 item 9); late data is dropped."""
        self.rs.cancel(code)
        if not self.ended:
            self.ended = True
            self._events.put_nowait_end(discard=True)
        self.session.unbind_request(self.request_id)

    async def collect(self) -> list[FetchEvent]:
        return [e async for e in self]


async def start_fetch(session: MoqtSession, namespace: TrackNamespace, name: bytes,
                      params: Params) -> FetchResponse:
    rs = await session.open_request()
    rid = session.next_request_id()
    resp = FetchResponse(session, rs, rid, namespace, name, params)
    # data may come before FETCH_OK (§10 item 4)
    reply: FetchOk = await _send_routed(session, rs, Fetch(rid, namespace, name, params), resp)
    resp.end_of_track = reply.end_of_track
    resp.end_location = reply.end_location
    resp.track_properties = reply.track_properties
    return resp



# -- data streams ---------------------------------------------------------------------------------


async def read_subgroup_stream(session: MoqtSession, recv: RecvStream,
                               parser: SubgroupStreamParser, items: list[Any]) -> None:
    """A subgroup stream (§11.2): routed by its Track Alias to a subscription."""
    while parser.header is None:
        chunk = await _read_or_none(recv)
        if chunk is None:
            return
        items += parser.feed(chunk, not chunk)
        if not chunk and parser.header is None:
            raise protocol_violation("subgroup stream ended inside its header")
    header: SubgroupHeader = parser.header
    sub = await session.route_for_alias(header.track_alias)
    if sub is None or sub.ended:
        recv.stop_sending(StreamResetCode.CANCELLED)
        return
    info = StreamInfo(recv.stream_id, Source.SUBGROUP, header)
    sub.stream_opened()
    last: int | None = None
    prio = header.publisher_priority
    if prio is None:
        prio = _default_priority(sub.track_properties)
    try:
        while True:
            for item in items:
                if isinstance(item, SubgroupHeader):
                    continue
                last = item.object_id
                subgroup = parser.subgroup_id if parser.subgroup_id is not None else 0
                await sub.deliver(ReceivedObject(
                    header.group_id, subgroup, item.object_id, prio, item.status,
                    item.properties, item.payload, info))
            chunk = await recv.read()
            if not chunk:
                parser.end_of_stream()
                await sub.deliver(StreamEnded(info, True, None, last))
                return
            items = parser.feed(chunk)
    except StreamReset as e:
        await sub.deliver(StreamEnded(info, False, e.code, last))
    finally:
        sub.stream_closed()


def _default_priority(props: Properties) -> int:
    for p in props:
        if p.type == 0x0E and isinstance(p.value, int):
            return p.value
    return 128


async def _read_or_none(recv: RecvStream) -> bytes | None:
    try:
        return await recv.read()
    except StreamReset:
        return None


async def read_fetch_stream(session: MoqtSession, recv: RecvStream, parser: FetchStreamParser,
                            items: list[Any]) -> None:
    """A fetch or fill fetch stream (§11.6): routed by the Request ID in its header."""
    while parser.header is None:
        chunk = await _read_or_none(recv)
        if chunk is None:
            return  # reset before the header (§18 rule 3)
        items += parser.feed(chunk, not chunk)
        if not chunk and parser.header is None:
            raise protocol_violation("fetch stream ended inside its header")
    rid = parser.header.request_id
    route = await session.route_for_request(rid)
    if route is None or route.ended:
        recv.stop_sending(StreamResetCode.CANCELLED)
        return
    is_fill = isinstance(route, Subscription)
    info = StreamInfo(recv.stream_id, Source.FILL if is_fill else Source.FETCH)
    if is_fill:
        sub: Subscription = route  # type: ignore[assignment]
        if sub.established.is_set():
            items += parser.set_group_order(sub.group_order)
        else:
            sub._fill_parsers.append(parser)  # held until SUBSCRIBE_OK (§9.4)
    else:
        items += parser.set_group_order(route.group_order)
    route.stream_opened()
    fin = False
    reset: int | None = None
    try:
        while True:
            for item in items:
                if isinstance(item, FetchObject):
                    await route.deliver(ReceivedObject(
                        item.group_id, item.subgroup_id or 0, item.object_id,
                        item.publisher_priority, ObjectStatus.NORMAL, item.properties,
                        item.payload, info))
                elif isinstance(item, EndOfRange):
                    await route.deliver(RangeMarker(item.type, item.location, info))
            chunk = await recv.read()
            if not chunk:
                items = parser.end_of_stream()
                if items:
                    continue
                fin = True
                return
            items = parser.feed(chunk)
    except StreamReset as e:
        reset = e.code
    finally:
        route.stream_closed()
        if is_fill:
            if fin or reset is not None:
                await route.deliver(StreamEnded(info, fin, reset))
        elif fin or reset is not None:
            route.fetch_stream_ended(fin, reset)  # type: ignore[union-attr]


# -- namespaces -----------------------------------------------------------------------------------


class PublishedNamespace:
    """A PUBLISH_NAMESPACE we sent and the peer accepted; withdraw by cancelling (§7.12)."""

    def __init__(self, session: MoqtSession, rs: RequestStream, namespace: TrackNamespace
                 ) -> None:
        self.session = session
        self.rs = rs
        self.namespace = namespace
        self.withdrawn = asyncio.Event()

    async def _watch(self) -> None:
        try:
            while await self.rs.recv() is not None:
                pass  # GOAWAY: the state checked it; nothing else may come (§5.2)
        except StreamReset:
            pass
        self.withdrawn.set()

    def withdraw(self) -> None:
        self.rs.cancel(StreamResetCode.CANCELLED)
        self.withdrawn.set()


async def start_publish_namespace(session: MoqtSession, namespace: TrackNamespace,
                                  params: Params) -> PublishedNamespace:
    rs, _, _ = await request_ok(session, lambda rid: PublishNamespace(rid, namespace, params))
    handle = PublishedNamespace(session, rs, namespace)
    session.spawn(handle._watch(), "publish-namespace")
    return handle


class NamespaceSubscription(_EventSource[NamespaceEvent]):
    """A SUBSCRIBE_NAMESPACE we sent: iterate for ``NamespaceEvent``s (§7.13)."""

    def __init__(self, session: MoqtSession, rs: RequestStream, prefix: TrackNamespace) -> None:
        self.session = session
        self.rs = rs
        self.prefix = prefix
        self.active: set[TrackNamespace] = set()
        self._events = _EventQueue(1 << 16)


    async def _loop(self) -> None:
        try:
            while True:
                msg = await self.rs.recv()
                if msg is None:
                    break
                if isinstance(msg, Namespace):
                    ns = self.prefix + msg.suffix
                    self.active.add(ns)
                    await self._events.put(NamespaceEvent(msg.suffix, ns, True))
                elif isinstance(msg, NamespaceDone):  # announced before: the state checked
                    ns = self.prefix + msg.suffix
                    self.active.discard(ns)
                    await self._events.put(NamespaceEvent(msg.suffix, ns, False))
        except StreamReset:
            pass
        # §7.13: a reset or FIN of the response direction means every namespace is done.
        for ns in sorted(self.active):
            await self._events.put(NamespaceEvent(ns[len(self.prefix):], ns, False))
        self.active.clear()
        self._events.put_nowait_end()

    def session_closed(self, code: int, reason: str) -> None:
        self._events.put_nowait_end(SessionClosed(code, reason))

    def cancel(self) -> None:
        self.rs.cancel(StreamResetCode.CANCELLED)
        self._events.put_nowait_end(discard=True)


async def start_subscribe_namespace(session: MoqtSession, prefix: TrackNamespace,
                                    params: Params) -> NamespaceSubscription:
    rs, _, _ = await request_ok(session, lambda rid: SubscribeNamespace(rid, prefix, params))
    handle = NamespaceSubscription(session, rs, prefix)
    session.spawn(handle._loop(), "subscribe-namespace")
    return handle


async def track_status(session: MoqtSession, namespace: TrackNamespace, name: bytes,
                       params: Params) -> RequestOk:
    rs, reply, _ = await request_ok(session, lambda rid: TrackStatus(rid, namespace, name, params),
                                 fin=True)
    await rs.release()  # TRACK_STATUS_OK ends the request (§7.11)
    return reply
