"""One MOQT session on one transport Connection (§1.3–§1.5, §4, §5).

The session owns the control streams, dispatches incoming streams (request streams to the
handler, subgroup streams by Track Alias, fetch and fill streams by Request ID), allocates and
checks Request IDs, and closes itself with the profile's code when the peer breaks a rule: a
``SessionError`` raised anywhere under it closes the session with that error's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from relay.moqt.codes import (
    PADDING_STREAM_TYPE,
    GroupOrder,
    MessageType,
    ObjectStatus,
    ParameterType,
    RequestErrorCode,
    SessionErrorCode,
    StreamResetCode,
)
from relay.moqt.control import ControlStreamParser, InvalidRequest, encode_message
from relay.moqt.dataplane.datagram import decode_datagram
from relay.moqt.dataplane.fetch import FETCH_HEADER_TYPE
from relay.moqt.dataplane.subgroup import is_subgroup_type
from relay.moqt.errors import SessionError, protocol_violation
from relay.moqt.messages import (
    Fetch,
    GoAway,
    Publish,
    PublishNamespace,
    RequestErrorMessage,
    Setup,
    Subscribe,
    SubscribeNamespace,
    SubscribeTracks,
    TrackStatus,
)
from relay.moqt.messages.setup import check_goaway, check_setup
from relay.moqt.params import Params, check_filter_ranges
from relay.moqt.primitives import TrackNamespace
from relay.moqt.vi64 import decode_vi64
from relay.transport import (
    Connection,
    ConnectionClosed,
    IncomingStream,
    RecvStream,
    SendStream,
    StreamReset,
    TransportError,
)

from .config import SessionConfig
from .errors import SessionClosed
from .events import ReceivedObject, Source, StreamInfo
from .handler import SessionHandler
from .publisher import (
    IncomingFetch,
    IncomingPublish,
    IncomingPublishNamespace,
    IncomingSubscribe,
    IncomingSubscribeNamespace,
    IncomingTrackStatus,
    ServedSubscription,
    start_publish,
)
from .request_stream import RequestStream
from .subscriber import (
    FetchResponse,
    NamespaceSubscription,
    PublishedNamespace,
    Subscription,
    start_fetch,
    start_publish_namespace,
    start_subscribe,
    start_subscribe_namespace,
    track_status,
)

if TYPE_CHECKING:
    from relay.moqt.messages.base import Message

log = logging.getLogger("kvcs.session")

_DATAGRAM = StreamInfo(-1, Source.DATAGRAM)
# Request IDs received out of order that are remembered at most (beyond: see
# check_peer_request_id); far more than the request streams a peer may have open at once.
REQUEST_ID_WINDOW = 4096
_REQUEST_TYPES = (Subscribe, Publish, Fetch, TrackStatus, PublishNamespace, SubscribeNamespace,
                  SubscribeTracks)


class MoqtSession:
    """A MOQT session: SETUP done, requests in both directions.

    Create with :meth:`start` (both roles); the handler answers the peer's requests.
    Outgoing requests: :meth:`subscribe`, :meth:`fetch`, :meth:`publish`,
    :meth:`publish_namespace`, :meth:`subscribe_namespace`, :meth:`track_status`.
    """

    def __init__(self, conn: Connection, config: SessionConfig | None = None,
                 handler: SessionHandler | None = None) -> None:
        self.conn = conn
        self.config = config or SessionConfig()
        self.handler = handler or SessionHandler()
        self.is_client = conn.is_client
        self.peer_setup: Setup | None = None
        self._next_request_id = 0 if self.is_client else 1
        self._peer_request_ids: set[int] = set()  # used, above _peer_floor
        self._peer_floor = 1 if self.is_client else 0  # the peer's lowest unused ID
        self._next_alias = 1
        self._control: SendStream | None = None
        self._setup_received = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = asyncio.Event()
        self._close_info: tuple[int, str] | None = None
        self.goaway_received: GoAway | None = None
        self._goaway_sent = False
        self._peer_control_seen = False
        # Receive-side routing of data streams.
        self.alias_routes: dict[int, Subscription] = {}
        self._alias_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self.fetch_routes: dict[int, FetchResponse | Subscription] = {}
        self._route_waiters: dict[int, list[asyncio.Future[None]]] = {}

    # -- life cycle ----------------------------------------------------------------------------

    @classmethod
    async def start(cls, conn: Connection, config: SessionConfig | None = None,
                    handler: SessionHandler | None = None) -> MoqtSession:
        """Open the control stream, send SETUP and wait for the peer's (§1.5)."""
        session = cls(conn, config, handler)
        await session._start()
        return session

    async def _start(self) -> None:
        self.spawn(self._accept_loop(), "accept")
        self.spawn(self._datagram_loop(), "datagrams")
        self.spawn(self._watch_connection(), "watch")
        try:
            self._control = await self.conn.open_uni()
            await self._control.write(encode_message(self._our_setup()))
        except TransportError as e:
            raise self._closed_error(e) from None
        try:
            await asyncio.wait_for(self._wait_setup(), self.config.setup_timeout)
        except TimeoutError:
            self.close(SessionErrorCode.CONTROL_MESSAGE_TIMEOUT, "no SETUP from the peer")
            raise SessionClosed(SessionErrorCode.CONTROL_MESSAGE_TIMEOUT, "no SETUP") from None

    async def _wait_setup(self) -> None:
        setup = asyncio.ensure_future(self._setup_received.wait())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({setup, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            setup.cancel()
            closed.cancel()
        if not self._setup_received.is_set():
            code, reason = self._close_info or (SessionErrorCode.INTERNAL_ERROR, "")
            raise SessionClosed(code, reason)

    def _our_setup(self) -> Setup:
        c = self.config
        native_client = self.is_client and self.conn.transport == "quic"
        return Setup(
            path=c.path if native_client else None,
            authority=c.authority if native_client else None,
            authorization_tokens=c.authorization_tokens if self.is_client else (),
            max_filter_ranges=c.max_filter_ranges,
            moqt_implementation=c.implementation,
            max_request_updates=c.max_request_updates,
        )

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def close_info(self) -> tuple[int, str] | None:
        return self._close_info

    @property
    def peer_max_filter_ranges(self) -> int:
        s = self.peer_setup
        return (s.max_filter_ranges or 0) if s is not None else 0

    def close(self, code: int = SessionErrorCode.NO_ERROR, reason: str = "") -> None:
        """Close the session with a Session Termination code (§4.5)."""
        if self._close_info is None:
            self._close_info = (int(code), reason)
            if code != SessionErrorCode.NO_ERROR:
                log.info("closing session %r: code 0x%x %s", self.conn, int(code), reason)
        self.conn.close(int(code), reason)
        self._finish_close()

    def _finish_close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for t in list(self._tasks):
            if t is not asyncio.current_task():
                t.cancel()
        for waiters in (*self._alias_waiters.values(), *self._route_waiters.values()):
            for w in waiters:
                if not w.done():
                    w.cancel()
        code, reason = self._close_info or (SessionErrorCode.INTERNAL_ERROR, "")
        self.handler.session_closed(self, code, reason)
        for sub in list(self.alias_routes.values()):
            sub.session_closed(code, reason)
        for route in list(self.fetch_routes.values()):
            route.session_closed(code, reason)

    async def wait_closed(self) -> tuple[int, str]:
        await self._closed.wait()
        assert self._close_info is not None
        return self._close_info

    async def aclose(self, code: int = SessionErrorCode.NO_ERROR, reason: str = "",
                     drain: float = 2.0) -> None:
        """Close; an orderly close (NO_ERROR) first lets what was written reach the peer
        (bounded by ``drain`` seconds), so a publisher that ends right after writing loses
        nothing."""
        if code == SessionErrorCode.NO_ERROR and not self.closed and drain > 0:
            await self.conn.drain(drain)
        self.close(code, reason)
        await self.conn.aclose(int(code), reason)

    async def _watch_connection(self) -> None:
        code, reason = await self.conn.wait_closed()
        if self._close_info is None:
            self._close_info = (code, reason)
        self._finish_close()

    def _closed_error(self, e: BaseException) -> SessionClosed:
        if isinstance(e, ConnectionClosed):
            return SessionClosed(e.code, e.reason)
        code, reason = self._close_info or (SessionErrorCode.INTERNAL_ERROR, str(e))
        return SessionClosed(code, reason)

    async def goaway(self, new_session_uri: str = "", timeout_ms: int = 0) -> None:
        """Send GOAWAY on the control stream (at most once, §4.3)."""
        if self._goaway_sent or self._control is None or self.closed:
            return
        self._goaway_sent = True
        with contextlib.suppress(TransportError):
            await self._control.write(encode_message(GoAway(new_session_uri, timeout_ms)))

    @property
    def going_away(self) -> bool:
        return self._goaway_sent or self.goaway_received is not None

    # -- tasks ---------------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> asyncio.Task[Any]:
        """Run ``coro`` under the session: its SessionError closes the session with its code;
        transport errors of a closing session are quiet; anything else is INTERNAL_ERROR."""
        task = asyncio.ensure_future(self._guard(coro, name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # A task cancelled before its first step never starts ``coro``: close it quietly.
        task.add_done_callback(lambda _: coro.close())
        return task

    async def _guard(self, coro: Coroutine[Any, Any, Any], name: str) -> Any:
        try:
            return await coro
        except SessionError as e:
            self.close(e.code, e.reason)
        except (asyncio.CancelledError, ConnectionClosed, SessionClosed):
            pass
        except TransportError as e:
            if not self.closed:
                log.debug("transport error in %s: %s", name, e)
        except Exception:
            log.exception("internal error in session task %s", name)
            self.close(SessionErrorCode.INTERNAL_ERROR, f"internal error in {name}")
        return None

    # -- incoming streams ----------------------------------------------------------------------

    async def _accept_loop(self) -> None:
        async for incoming in self.conn:
            if incoming.is_bidirectional:
                self.spawn(self._serve_request(incoming), "request")
            else:
                self.spawn(self._dispatch_uni(incoming.recv), "uni")

    async def _datagram_loop(self) -> None:
        """OBJECT_DATAGRAMs (§11.8): routed by Track Alias; unknown aliases are dropped."""
        while True:
            data = await self.conn.receive_datagram()
            d = decode_datagram(data)
            if d is None:
                continue  # padding
            sub = self.alias_routes.get(d.track_alias)
            if sub is None or sub.ended:
                continue
            prio = d.publisher_priority if d.publisher_priority is not None else 128
            await sub.deliver(ReceivedObject(
                d.group_id, 0, d.object_id, prio, d.status or ObjectStatus.NORMAL,
                d.properties, d.payload, _DATAGRAM))

    async def _dispatch_uni(self, recv: RecvStream) -> None:
        buf = b""
        while True:
            try:
                chunk = await recv.read()
            except StreamReset:
                return  # reset before its type was known (§18 rule 3): nothing to do
            if not chunk:
                if buf:
                    raise protocol_violation("unidirectional stream ended inside its type")
                return
            buf += chunk
            try:
                stream_type, _ = decode_vi64(buf, 0)
                break
            except IndexError:
                continue
        if stream_type == MessageType.SETUP:
            await self._read_control(recv, buf)
        elif stream_type == FETCH_HEADER_TYPE:
            from .subscriber import read_fetch_stream

            await read_fetch_stream(self, recv, buf)
        elif stream_type < 0x80 and is_subgroup_type(stream_type):
            from .subscriber import read_subgroup_stream

            await read_subgroup_stream(self, recv, buf)
        elif stream_type == PADDING_STREAM_TYPE:
            recv.stop_sending(StreamResetCode.CANCELLED)
        else:
            raise protocol_violation(f"unknown unidirectional stream type {stream_type:#x}")

    async def _read_control(self, recv: RecvStream, first: bytes) -> None:
        if self._peer_control_seen:
            raise protocol_violation("a second control stream")
        self._peer_control_seen = True
        parser = ControlStreamParser()
        chunk = first
        while True:
            if not chunk:
                parser.end_of_stream()
                raise protocol_violation("the control stream was closed")
            for msg in parser.feed(chunk):
                self._on_control_message(msg)
            try:
                chunk = await recv.read()
            except StreamReset:
                raise protocol_violation("the control stream was reset") from None

    def _on_control_message(self, msg: Message | InvalidRequest) -> None:
        if self.peer_setup is None:
            if not isinstance(msg, Setup):
                raise protocol_violation("the control stream must start with SETUP")
            check_setup(msg, sender_is_client=not self.is_client,
                        webtransport=self.conn.transport == "webtransport")
            self.peer_setup = msg
            self._setup_received.set()
            return
        if isinstance(msg, GoAway):
            if self.goaway_received is not None:
                raise protocol_violation("a second GOAWAY on the control stream")
            check_goaway(msg, sender_is_client=not self.is_client)
            self.goaway_received = msg
            self.handler.goaway(self, msg)
            return
        name = type(msg).__name__
        raise protocol_violation(f"{name} is not allowed on the control stream")

    # -- request IDs ---------------------------------------------------------------------------

    def next_request_id(self) -> int:
        rid = self._next_request_id
        self._next_request_id += 2
        return rid

    def check_peer_request_id(self, rid: int) -> None:
        """Wrong parity or reuse closes the session with INVALID_REQUEST_ID (§4.4)."""
        peer_parity = 1 if self.is_client else 0
        if rid % 2 != peer_parity:
            raise SessionError(SessionErrorCode.INVALID_REQUEST_ID,
                               f"Request ID {rid} has the wrong parity")
        if rid < self._peer_floor or rid in self._peer_request_ids:
            raise SessionError(SessionErrorCode.INVALID_REQUEST_ID, f"Request ID {rid} reused")
        self._peer_request_ids.add(rid)
        # Bounded bookkeeping: IDs are used in order (each endpoint increments by 2, §4.4),
        # so every ID below the floor is used and only the out-of-order ones above it are
        # remembered. A peer skipping IDs cannot grow the set past the window: the floor
        # then moves up and a skipped ID arriving later counts as reused.
        if len(self._peer_request_ids) > REQUEST_ID_WINDOW:
            self._peer_floor = min(self._peer_request_ids)
        while self._peer_floor in self._peer_request_ids:
            self._peer_request_ids.discard(self._peer_floor)
            self._peer_floor += 2

    def next_track_alias(self) -> int:
        alias = self._next_alias
        self._next_alias += 1
        return alias

    # -- serving the peer's requests -------------------------------------------------------------

    async def _serve_request(self, incoming: IncomingStream) -> None:
        assert incoming.send is not None
        rs = RequestStream(self, incoming.send, incoming.recv)
        try:
            await self._serve_request_on(rs)
        finally:
            if rs.send_finished:  # answered and over: forget the stream
                await rs.release()

    async def _serve_request_on(self, rs: RequestStream) -> None:
        try:
            msg = await rs.recv()
        except StreamReset:
            return
        if msg is None:
            raise protocol_violation("request stream closed before its request")
        if isinstance(msg, InvalidRequest):
            if msg.request_id is not None:
                self.check_peer_request_id(msg.request_id)
            err = msg.error
            await rs.send(RequestErrorMessage(err.code, 0, err.reason[:1024]), fin=True)
            return
        if not isinstance(msg, _REQUEST_TYPES):
            raise protocol_violation(f"{type(msg).__name__} cannot open a request stream")
        self.check_peer_request_id(msg.request_id)
        # §1.5 step 3: requests that overtook the peer's SETUP wait for it.
        if not self._setup_received.is_set():
            await self._wait_setup()
        if self.going_away:
            await rs.send(RequestErrorMessage(RequestErrorCode.GOING_AWAY, 0, "going away"),
                          fin=True)
            return
        params = getattr(msg, "params", None)
        if isinstance(params, Params) and params.present() & _RANGE_TYPES:
            try:
                check_filter_ranges(params, self.config.max_filter_ranges)
            except Exception as e:  # RequestError: INVALID_FILTER
                code = getattr(e, "code", RequestErrorCode.INVALID_FILTER)
                await rs.send(RequestErrorMessage(code, 0, str(e)[:200]), fin=True)
                return
        await self._dispatch_request(rs, msg)

    async def _dispatch_request(self, rs: RequestStream, msg: Message) -> None:
        h = self.handler
        if isinstance(msg, Subscribe):
            await IncomingSubscribe(self, rs, msg).run(h.subscribe)
        elif isinstance(msg, Fetch):
            await IncomingFetch(self, rs, msg).run(h.fetch)
        elif isinstance(msg, Publish):
            await IncomingPublish(self, rs, msg).run(h.publish)
        elif isinstance(msg, PublishNamespace):
            await IncomingPublishNamespace(self, rs, msg).run(h.publish_namespace)
        elif isinstance(msg, SubscribeNamespace):
            await IncomingSubscribeNamespace(self, rs, msg).run(h.subscribe_namespace)
        elif isinstance(msg, TrackStatus):
            await IncomingTrackStatus(self, rs, msg).run(h.track_status)
        else:  # SUBSCRIBE_TRACKS: tolerated, not served (§7.15)
            await rs.send(RequestErrorMessage(RequestErrorCode.NOT_SUPPORTED, 0,
                                              "SUBSCRIBE_TRACKS is not supported"), fin=True)

    # -- routing of data streams (used by subscriber.py) ---------------------------------------

    async def route_for_alias(self, alias: int) -> Subscription | None:
        sub = self.alias_routes.get(alias)
        if sub is not None:
            return sub
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._alias_waiters.setdefault(alias, []).append(fut)
        try:
            await asyncio.wait_for(fut, self.config.alias_wait_timeout)
        except TimeoutError:
            return None
        finally:
            waiters = self._alias_waiters.get(alias)
            if waiters is not None and fut in waiters:
                waiters.remove(fut)
        return self.alias_routes.get(alias)

    def bind_alias(self, alias: int, sub: Subscription) -> None:
        current = self.alias_routes.get(alias)
        if current is not None and current is not sub and not current.ended and \
                current.full_name != sub.full_name:
            raise SessionError(SessionErrorCode.DUPLICATE_TRACK_ALIAS,
                               f"Track Alias {alias} is bound to another Track")
        self.alias_routes[alias] = sub
        for w in self._alias_waiters.pop(alias, []):
            if not w.done():
                w.set_result(None)

    def unbind_alias(self, alias: int, sub: Subscription) -> None:
        if self.alias_routes.get(alias) is sub:
            del self.alias_routes[alias]

    async def route_for_request(self, rid: int) -> FetchResponse | Subscription | None:
        route = self.fetch_routes.get(rid)
        if route is not None or not self._is_our_pending(rid):
            return route
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._route_waiters.setdefault(rid, []).append(fut)
        try:
            await asyncio.wait_for(fut, self.config.alias_wait_timeout)
        except TimeoutError:
            return None
        return self.fetch_routes.get(rid)

    def _is_our_pending(self, rid: int) -> bool:
        ours = rid % 2 == (0 if self.is_client else 1)
        return ours and rid < self._next_request_id

    def bind_request(self, rid: int, route: FetchResponse | Subscription) -> None:
        self.fetch_routes[rid] = route
        for w in self._route_waiters.pop(rid, []):
            if not w.done():
                w.set_result(None)

    def unbind_request(self, rid: int) -> None:
        self.fetch_routes.pop(rid, None)

    # -- outgoing requests ---------------------------------------------------------------------

    async def open_request(self) -> RequestStream:
        if self.closed:
            code, reason = self._close_info or (SessionErrorCode.INTERNAL_ERROR, "")
            raise SessionClosed(code, reason)
        try:
            send, recv = await self.conn.open_bi()
        except TransportError as e:
            raise self._closed_error(e) from None
        return RequestStream(self, send, recv)

    async def subscribe(self, namespace: TrackNamespace, name: bytes,
                        params: Params | None = None) -> Subscription:
        """SUBSCRIBE; returns once SUBSCRIBE_OK arrived (raises RequestRejected)."""
        return await start_subscribe(self, namespace, name, params or Params())

    async def fetch(self, namespace: TrackNamespace, name: bytes,
                    params: Params | None = None) -> FetchResponse:
        """FETCH; returns once FETCH_OK arrived (raises RequestRejected)."""
        return await start_fetch(self, namespace, name, params or Params())

    async def publish(self, namespace: TrackNamespace, name: bytes,
                      params: Params | None = None, properties: tuple[Any, ...] = ()
                      ) -> ServedSubscription:
        """PUBLISH a Track; returns the publisher side once REQUEST_OK arrived."""
        return await start_publish(self, namespace, name, params or Params(), properties)

    async def publish_namespace(self, namespace: TrackNamespace, params: Params | None = None
                                ) -> PublishedNamespace:
        return await start_publish_namespace(self, namespace, params or Params())

    async def subscribe_namespace(self, prefix: TrackNamespace, params: Params | None = None
                                  ) -> NamespaceSubscription:
        return await start_subscribe_namespace(self, prefix, params or Params())

    async def track_status(self, namespace: TrackNamespace, name: bytes,
                           params: Params | None = None) -> Any:
        return await track_status(self, namespace, name, params or Params())

    def default_group_order(self, params: Params) -> GroupOrder:
        return params.group_order or GroupOrder.ASCENDING


_RANGE_TYPES = frozenset({ParameterType.SUBGROUP_FILTER, ParameterType.OBJECTID_FILTER,
                          ParameterType.PRIORITY_FILTER, ParameterType.OBJECT_PROPERTY_FILTER,
                          ParameterType.TRACK_PROPERTY_FILTER, ParameterType.FILL_PARAMETERS})
