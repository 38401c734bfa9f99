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
from typing import Any

from relay.moqt.codes import SessionErrorCode, StreamResetCode, UniStreamType
from relay.moqt.messages import (
    Fetch,
    GoAway,
    Message,
    Publish,
    PublishNamespace,
    Setup,
    Subscribe,
    SubscribeNamespace,
    SubscribeTracks,
    TrackStatus,
)
from relay.moqt.params import Params
from relay.moqt.primitives import TrackNamespace
from relay.moqt.state import PeerUniStream
from relay.transport import (
    Connection,
    IncomingStream,
    RecvStream,
    SendStream,
    StreamReset,
    TransportError,
)

from .base import SessionBase
from .config import SessionConfig
from .data_streams import read_datagrams, read_fetch_stream, read_subgroup_stream
from .errors import SessionClosed
from .fetch import FetchResponse, IncomingFetch, start_fetch
from .handler import SessionHandler
from .namespace import (
    IncomingPublishNamespace,
    IncomingSubscribeNamespace,
    NamespaceSubscription,
    PublishedNamespace,
    start_publish_namespace,
    start_subscribe_namespace,
)
from .publish import IncomingPublish, start_publish
from .request_stream import RequestStream
from .subscribe import IncomingSubscribe, ServedSubscription, Subscription, start_subscribe
from .track_status import IncomingTrackStatus, track_status
from .tracks import IncomingSubscribeTracks, TrackSubscription, start_subscribe_tracks


class MoqtSession(SessionBase):
    """A MOQT session: SETUP done, requests in both directions.

    Create with :meth:`start` (both roles); the handler answers the peer's requests.
    Outgoing requests: :meth:`subscribe`, :meth:`fetch`, :meth:`publish`,
    :meth:`publish_namespace`, :meth:`subscribe_namespace`, :meth:`subscribe_tracks`,
    :meth:`track_status`.
    """

    def __init__(self, conn: Connection, config: SessionConfig | None = None,
                 handler: SessionHandler | None = None) -> None:
        config = config or SessionConfig()
        super().__init__(conn, config, _our_setup(conn, config))
        self.handler = handler or SessionHandler()
        self._control: SendStream | None = None
        self._setup_received = asyncio.Event()

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
        self.spawn(read_datagrams(self), "datagrams")
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

    @property
    def peer_setup(self) -> Setup | None:
        return self.state.peer_setup

    @property
    def peer_implementation(self) -> str:
        """The peer's MOQT_IMPLEMENTATION ("" before its SETUP, or if it named none): what
        a relay goes by where implementations differ in what they accept."""
        setup = self.state.peer_setup
        return (setup.moqt_implementation or "") if setup is not None else ""

    @property
    def goaway_received(self) -> GoAway | None:
        return self.state.goaway_received

    @property
    def peer_max_filter_ranges(self) -> int:
        return self.state.peer_max_filter_ranges

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

    def answered(self, req: object, code: int | None) -> None:
        self.handler.answered(req, code)

    def _session_closed(self, code: int, reason: str) -> None:
        self.handler.session_closed(self, code, reason)

    # -- incoming streams ----------------------------------------------------------------------

    async def _accept_loop(self) -> None:
        async for incoming in self.conn:
            if incoming.is_bidirectional:
                self.spawn(self._serve_request(incoming), "request")
            else:
                self.spawn(self._dispatch_uni(incoming.recv), "uni")

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
                    self.handler.setup_received(self)  # before any request is served
                    self._setup_received.set()
                else:
                    self.handler.goaway(self, msg)
            try:
                chunk = await recv.read()
            except StreamReset:
                uni.reset()
                raise
            items = uni.receive(chunk, not chunk)

    # -- serving the peer's requests -------------------------------------------------------------

    async def _serve_request(self, incoming: IncomingStream) -> None:
        assert incoming.send is not None
        rs = RequestStream(self.state.peer_request_stream(), incoming.send, incoming.recv,
                           responder=True)
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
        elif isinstance(msg, SubscribeTracks):
            await IncomingSubscribeTracks(self, rs, msg).run(h.subscribe_tracks)
        else:
            assert isinstance(msg, TrackStatus)
            await IncomingTrackStatus(self, rs, msg).run(h.track_status)

    # -- outgoing requests ---------------------------------------------------------------------

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

    async def subscribe_tracks(self, prefix: TrackNamespace, params: Params | None = None
                               ) -> TrackSubscription:
        """SUBSCRIBE_TRACKS: the peer PUBLISHes each Track under ``prefix`` to us (our
        handler's ``publish`` answers each)."""
        return await start_subscribe_tracks(self, prefix, params or Params())

    async def track_status(self, namespace: TrackNamespace, name: bytes,
                           params: Params | None = None) -> Any:
        return await track_status(self, namespace, name, params or Params())


def _our_setup(conn: Connection, c: SessionConfig) -> Setup:
    native_client = conn.is_client and conn.transport == "quic"
    return Setup(
        path=c.path if native_client else None,
        authority=c.authority if native_client else None,
        authorization_tokens=c.authorization_tokens if conn.is_client else (),
        max_filter_ranges=c.max_filter_ranges,
        moqt_implementation=c.implementation,
        max_request_updates=c.max_request_updates,
    )
