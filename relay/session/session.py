"""One MOQT session on one transport Connection (§1.3–§1.5, §4, §5).

The session owns the control streams, dispatches incoming streams (request streams to the
handler, subgroup streams by Track Alias, fetch and fill streams by Request ID) and closes
itself with the profile's code when the peer breaks a rule. Which rule is broken is decided by
its sans-IO ``SessionState`` (``relay.moqt.state``), asked for every message and stream; this
module does the I/O around it: a ``SessionError`` raised anywhere under the session closes it
with that error's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from relay.moqt.codes import (
    ObjectStatus,
    SessionErrorCode,
    StreamResetCode,
    UniStreamType,
)
from relay.moqt.dataplane.datagram import decode_datagram
from relay.moqt.errors import SessionError
from relay.moqt.messages import (
    Fetch,
    GoAway,
    Publish,
    PublishNamespace,
    Setup,
    Subscribe,
    SubscribeNamespace,
    TrackStatus,
)
from relay.moqt.params import Params
from relay.moqt.primitives import TrackNamespace
from relay.moqt.state import PeerUniStream, SessionState
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
from .publish import (
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
from .subscribe import (
    FetchResponse,
    NamespaceSubscription,
    PublishedNamespace,
    Subscription,
    read_fetch_stream,
    read_subgroup_stream,
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
        # Every legality decision of this session (relay.moqt.state).
        self.state = SessionState(is_client=conn.is_client, setup=self._our_setup(),
                                  webtransport=conn.transport == "webtransport")
        self._control: SendStream | None = None
        self._setup_received = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = asyncio.Event()
        self._close_info: tuple[int, str] | None = None
        # Receive-side routing of data streams: by the Request ID of our SUBSCRIBE, FETCH or
        # REQUEST_UPDATE (fill), or of a PUBLISH we received; Track Aliases map to Request IDs
        # in the state.
        self.routes: dict[int, FetchResponse | Subscription] = {}
        self._alias_waiters: dict[int, list[asyncio.Future[None]]] = {}
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
            await self._control.write(self.state.control_stream_start())
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
    def peer_setup(self) -> Setup | None:
        return self.state.peer_setup

    @property
    def goaway_received(self) -> GoAway | None:
        return self.state.goaway_received

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def close_info(self) -> tuple[int, str] | None:
        return self._close_info

    @property
    def peer_max_filter_ranges(self) -> int:
        return self.state.peer_max_filter_ranges

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
        for route in list(self.routes.values()):
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
        if self._control is None or self.closed:
            return
        data = self.state.goaway(GoAway(new_session_uri, timeout_ms))
        if data is not None:
            with contextlib.suppress(TransportError):
                await self._control.write(data)

    @property
    def going_away(self) -> bool:
        return self.state.going_away

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
            sub = self._alias_route(d.track_alias)
            if sub is None or sub.ended:
                continue
            prio = d.publisher_priority if d.publisher_priority is not None else 128
            await sub.deliver(ReceivedObject(
                d.group_id, 0, d.object_id, prio, d.status or ObjectStatus.NORMAL,
                d.properties, d.payload, _DATAGRAM))

    async def _dispatch_uni(self, recv: RecvStream) -> None:
        uni = self.state.peer_uni_stream()
        items: list[Any] = []
        while uni.kind is None:
            try:
                chunk = await recv.read()
            except StreamReset:
                return  # reset before its type was known (§18 rule 3): nothing to do
            items = uni.receive(chunk, not chunk)
            if not chunk and uni.kind is None:
                return  # an empty stream
        if uni.kind == UniStreamType.CONTROL:
            await self._read_control(recv, uni, items)
        elif uni.kind == UniStreamType.SUBGROUP:
            await read_subgroup_stream(self, recv, uni.parser, items)  # type: ignore[arg-type]
        elif uni.kind == UniStreamType.FETCH:
            await read_fetch_stream(self, recv, uni.parser, items)  # type: ignore[arg-type]
        else:  # padding
            recv.stop_sending(StreamResetCode.CANCELLED)

    async def _read_control(self, recv: RecvStream, uni: PeerUniStream, items: list[Any]
                            ) -> None:
        while True:
            for msg in items:
                if isinstance(msg, Setup):
                    self._setup_received.set()
                else:
                    self.handler.goaway(self, msg)
            try:
                chunk = await recv.read()
            except StreamReset:
                uni.reset()
                raise
            items = uni.receive(chunk, not chunk)

    # -- request IDs and Track Aliases (the state hands them out) -------------------------------

    def next_request_id(self) -> int:
        return self.state.next_request_id()

    def next_track_alias(self) -> int:
        return self.state.next_track_alias()

    # -- serving the peer's requests -------------------------------------------------------------

    async def _serve_request(self, incoming: IncomingStream) -> None:
        assert incoming.send is not None
        rs = RequestStream(self.state.peer_request_stream(), incoming.send, incoming.recv)
        try:
            await self._serve_request_on(rs)
        finally:
            if rs.send_finished:  # answered and over: forget the stream
                await rs.release()

    async def _serve_request_on(self, rs: RequestStream) -> None:
        try:
            msg = await rs.recv()  # checked, or refused and answered by the state's rules
        except StreamReset:
            return
        if msg is None:
            return
        # §1.5 step 3: requests that overtook the peer's SETUP wait for it.
        if not self._setup_received.is_set():
            await self._wait_setup()
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
        else:
            assert isinstance(msg, TrackStatus)
            await IncomingTrackStatus(self, rs, msg).run(h.track_status)

    # -- routing of data streams (used by subscriber.py) ---------------------------------------

    def _alias_route(self, alias: int) -> Subscription | None:
        rid = self.state.aliases.route(alias)
        route = self.routes.get(rid) if rid is not None else None
        return route if isinstance(route, Subscription) else None

    async def route_for_alias(self, alias: int) -> Subscription | None:
        sub = self._alias_route(alias)
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
        return self._alias_route(alias)

    def alias_bound(self, alias: int) -> None:
        """A SUBSCRIBE_OK or PUBLISH bound ``alias`` (the state checked it): streams that
        overtook it may go on."""
        for w in self._alias_waiters.pop(alias, []):
            if not w.done():
                w.set_result(None)

    def unbind_alias(self, alias: int, sub: Subscription) -> None:
        self.state.aliases.release(alias, sub.request_id)

    async def route_for_request(self, rid: int) -> FetchResponse | Subscription | None:
        """Fetch and fill streams name the Request ID of one of our requests (§11.6)."""
        if not self.state.issued(rid):
            return None
        route = self.routes.get(rid)
        if route is not None:
            return route
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._route_waiters.setdefault(rid, []).append(fut)
        try:
            await asyncio.wait_for(fut, self.config.alias_wait_timeout)
        except TimeoutError:
            return None
        return self.routes.get(rid)

    def bind_request(self, rid: int, route: FetchResponse | Subscription) -> None:
        self.routes[rid] = route
        for w in self._route_waiters.pop(rid, []):
            if not w.done():
                w.set_result(None)

    def unbind_request(self, rid: int) -> None:
        self.routes.pop(rid, None)

    # -- outgoing requests ---------------------------------------------------------------------

    async def open_request(self) -> RequestStream:
        if self.closed:
            code, reason = self._close_info or (SessionErrorCode.INTERNAL_ERROR, "")
            raise SessionClosed(code, reason)
        try:
            send, recv = await self.conn.open_bi()
        except TransportError as e:
            raise self._closed_error(e) from None
        return RequestStream(self.state.request_stream(), send, recv)

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
