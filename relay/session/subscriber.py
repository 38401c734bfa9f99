"""The requester/receiver side: SUBSCRIBE, FETCH, SUBSCRIBE_NAMESPACE, PUBLISH_NAMESPACE,
TRACK_STATUS sent by us, and the data streams that answer them (§5, §7, §9, §10, §11)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from relay.moqt.codes import (
    GroupOrder,
    LocationFilterType,
    MessageType,
    ObjectStatus,
    StreamResetCode,
)
from relay.moqt.control import InvalidRequest
from relay.moqt.dataplane.fetch import FetchStreamParser
from relay.moqt.dataplane.objects import EndOfRange, FetchHeader, FetchObject, SubgroupHeader
from relay.moqt.dataplane.subgroup import SubgroupStreamParser
from relay.moqt.errors import SessionError, protocol_violation
from relay.moqt.kvp import Properties
from relay.moqt.messages import (
    Fetch,
    FetchOk,
    GoAway,
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
    check_fetch_ok,
    check_goaway,
    check_redirect,
    check_request_ok,
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


def _rejected(session: MoqtSession, msg: RequestErrorMessage, namespace_request: bool
              ) -> RequestRejected:
    check_redirect(msg, sender_is_client=not session.is_client,
                   namespace_request=namespace_request)
    return RequestRejected(msg.error_code, msg.reason, msg.retry_interval, msg.redirect)


async def _first_reply(session: MoqtSession, rs: RequestStream, what: str) -> Any:
    try:
        reply = await rs.recv()
    except StreamReset as e:
        raise RequestCancelled(e.code, what) from None
    except TransportError as e:
        raise session._closed_error(e) from None
    if reply is None:
        raise RequestCancelled(None, what)
    if isinstance(reply, InvalidRequest):
        raise protocol_violation(f"invalid reply to {what}")
    return reply


async def request_ok(session: MoqtSession, make: Callable[[int], RequestMessage], *,
                     namespace_request: bool = False, fin: bool = False
                     ) -> tuple[RequestStream, RequestOk, int]:
    """Send a request answered by REQUEST_OK (PUBLISH, PUBLISH_NAMESPACE,
    SUBSCRIBE_NAMESPACE, TRACK_STATUS) on a new request stream; raise on REQUEST_ERROR."""
    rs = await session.open_request()
    msg = make(session.next_request_id())
    what = msg.TYPE.name
    await rs.send(msg, fin=fin)
    reply = await _first_reply(session, rs, what)
    if isinstance(reply, RequestErrorMessage):
        await rs.finish()
        await rs.release()
        raise _rejected(session, reply, namespace_request)
    if not isinstance(reply, RequestOk):
        raise protocol_violation(f"{type(reply).__name__} in reply to {what}")
    check_request_ok(reply, msg.TYPE)
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
        self._update_replies: asyncio.Queue[RequestOk | RequestErrorMessage] = asyncio.Queue()
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

    # control --------------------------------------------------------------------------------

    def _established(self, alias: int, params: Params, properties: Properties) -> None:
        self.track_alias = alias
        self.largest = params.largest_object
        self.track_properties = properties
        for p in properties:
            # DEFAULT_PUBLISHER_GROUP_ORDER applies unless the subscriber chose an order.
            if p.type == 0x22 and p.value in (1, 2) and self.params.group_order is None:
                self.group_order = GroupOrder(p.value)
        self.session.bind_alias(alias, self)
        self.established.set()
        for parser in self._fill_parsers:
            if parser.group_order is None:
                parser.set_group_order(self.group_order)

    async def control_loop(self) -> None:
        """Read the request stream after the first reply: PUBLISH_DONE, update replies,
        PUBLISH_STATE_NOTIFY, GOAWAY (§5.2)."""
        goaway_seen = False
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
                if self.done is not None:
                    raise protocol_violation("a second PUBLISH_DONE")
                self.done = msg
                self.session.spawn(self._linger(msg), "publish-done")
            elif isinstance(msg, RequestOk | RequestErrorMessage):
                if isinstance(msg, RequestOk):
                    check_request_ok(msg, MessageType.REQUEST_UPDATE)
                    if msg.params.largest_object is not None:
                        self.largest = max(self.largest or msg.params.largest_object,
                                           msg.params.largest_object)
                self._update_replies.put_nowait(msg)
            elif isinstance(msg, PublishStateNotify):
                if msg.params.largest_object is not None:
                    self.largest = msg.params.largest_object
            elif isinstance(msg, GoAway):
                if goaway_seen:
                    raise protocol_violation("a second GOAWAY on a request stream")
                goaway_seen = True
                check_goaway(msg, sender_is_client=not self.session.is_client)
            else:
                raise protocol_violation(f"{type(msg).__name__} on a subscription stream")

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
        rid = self.session.next_request_id()
        if params.fill is not None:
            self._fill_request_ids.append(rid)
            self.session.bind_request(rid, self)
        await self.rs.send(RequestUpdate(rid, params))
        reply = await self._update_replies.get()
        if isinstance(reply, RequestErrorMessage):
            raise _rejected(self.session, reply, False)
        return reply


async def _send_routed(session: MoqtSession, rs: RequestStream, msg: RequestMessage,
                       target: Subscription | FetchResponse, *, route: bool) -> Any:
    """Send SUBSCRIBE or FETCH and return the first reply; with ``route``, data streams
    carrying its Request ID reach ``route`` even before that reply. A failed request drops
    the route; REQUEST_ERROR becomes RequestRejected."""
    rid = msg.request_id
    if route:
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
        raise _rejected(session, reply, False)
    return reply


async def start_subscribe(session: MoqtSession, namespace: TrackNamespace, name: bytes,
                          params: Params) -> Subscription:
    rs = await session.open_request()
    rid = session.next_request_id()
    sub = Subscription(session, rs, rid, namespace, name, params)
    # the fill stream may overtake SUBSCRIBE_OK
    reply = await _send_routed(session, rs, Subscribe(rid, namespace, name, params), sub,
                               route=params.fill is not None)
    try:
        if not isinstance(reply, SubscribeOk):
            raise protocol_violation(f"{type(reply).__name__} in reply to SUBSCRIBE")
        sub._established(reply.track_alias, reply.params, reply.track_properties)
    except SessionError as e:
        # The publisher broke a session rule (e.g. DUPLICATE_TRACK_ALIAS): this runs in the
        # caller's task, not under the session's guard, so close the session here.
        session.close(e.code, e.reason)
        raise SessionClosed(e.code, e.reason) from None
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
    reply = await _send_routed(session, rs, Fetch(rid, namespace, name, params), resp,
                               route=True)
    if not isinstance(reply, FetchOk):
        raise protocol_violation(f"{type(reply).__name__} in reply to FETCH")
    lf = params.location_filter
    if lf is not None and lf.type in _ABSOLUTE:
        check_fetch_ok(reply, Location(lf.start_group, lf.start_object))
    resp.end_of_track = reply.end_of_track
    resp.end_location = reply.end_location
    resp.track_properties = reply.track_properties
    return resp


_ABSOLUTE = (LocationFilterType.ABSOLUTE_START, LocationFilterType.ABSOLUTE_START_GROUP_END,
             LocationFilterType.ABSOLUTE_RANGE)


# -- data streams ---------------------------------------------------------------------------------


async def read_subgroup_stream(session: MoqtSession, recv: RecvStream, first: bytes) -> None:
    parser = SubgroupStreamParser()
    items = parser.feed(first)
    chunk = b""
    while parser.header is None:
        chunk = await _read_or_none(recv)
        if chunk is None:
            return
        if not chunk:
            parser.end_of_stream()
            raise protocol_violation("subgroup stream ended inside its header")
        items += parser.feed(chunk)
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


async def read_fetch_stream(session: MoqtSession, recv: RecvStream, first: bytes) -> None:
    parser = FetchStreamParser(None)
    items: list[Any] = parser.feed(first)
    while parser.header is None:
        chunk = await _read_or_none(recv)
        if chunk is None:
            return  # reset before the header (§18 rule 3)
        if not chunk:
            parser.end_of_stream()
            raise protocol_violation("fetch stream ended inside its header")
        items += parser.feed(chunk)
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
                elif not isinstance(item, FetchHeader):
                    raise protocol_violation("unexpected item on a fetch stream")
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
            while True:
                msg = await self.rs.recv()
                if msg is None:
                    break
                if not isinstance(msg, RequestOk | RequestErrorMessage | GoAway):
                    raise protocol_violation(f"{type(msg).__name__} on PUBLISH_NAMESPACE")
        except StreamReset:
            pass
        self.withdrawn.set()

    def withdraw(self) -> None:
        self.rs.cancel(StreamResetCode.CANCELLED)
        self.withdrawn.set()


async def start_publish_namespace(session: MoqtSession, namespace: TrackNamespace,
                                  params: Params) -> PublishedNamespace:
    rs, _, _ = await request_ok(session, lambda rid: PublishNamespace(rid, namespace, params),
                             namespace_request=True)
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
                elif isinstance(msg, NamespaceDone):
                    ns = self.prefix + msg.suffix
                    if ns not in self.active:
                        raise protocol_violation("NAMESPACE_DONE before NAMESPACE")
                    self.active.discard(ns)
                    await self._events.put(NamespaceEvent(msg.suffix, ns, False))
                elif not isinstance(msg, RequestOk | RequestErrorMessage | GoAway):
                    raise protocol_violation(f"{type(msg).__name__} on SUBSCRIBE_NAMESPACE")
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
    rs, _, _ = await request_ok(session, lambda rid: SubscribeNamespace(rid, prefix, params),
                             namespace_request=True)
    handle = NamespaceSubscription(session, rs, prefix)
    session.spawn(handle._loop(), "subscribe-namespace")
    return handle


async def track_status(session: MoqtSession, namespace: TrackNamespace, name: bytes,
                       params: Params) -> RequestOk:
    rs, reply, _ = await request_ok(session, lambda rid: TrackStatus(rid, namespace, name, params),
                                 fin=True)
    await rs.release()  # TRACK_STATUS_OK ends the request (§7.11)
    return reply
