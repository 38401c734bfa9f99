"""What every request needs from its session: the connection, the rules state, the settings,
a guard for its tasks, closing, and the routes by which data streams reach it.

``MoqtSession`` (session.py) builds on this with SETUP, the accept loop and the request
methods; the request modules (subscribe, publish, fetch, namespace, track_status,
data_streams) depend on this module only, so none of them imports another session module
than the ones below it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from relay.moqt.codes import SessionErrorCode
from relay.moqt.dataplane.fetch import FetchStreamParser
from relay.moqt.errors import SessionError
from relay.moqt.kvp import Properties
from relay.moqt.messages import Setup
from relay.moqt.state import SessionState
from relay.transport import Connection, ConnectionClosed, RequestStreams, TransportError

from .config import SessionConfig
from .errors import SessionClosed
from .events import Source, StreamInfo
from .request_stream import RequestStream

log = logging.getLogger("kvcs.session")


class DataRoute(Protocol):
    """Where a data stream's Objects go: a subscription (its subgroup streams by Track Alias,
    its fill stream by Request ID) or a FETCH (its fetch stream by Request ID)."""

    ended: bool
    track_properties: Properties

    def stream_opened(self) -> None: ...

    def stream_closed(self) -> None: ...

    async def deliver(self, event: Any) -> None: ...

    async def fetch_stream_started(self, parser: FetchStreamParser
                                   ) -> tuple[Source, list[Any]] | None:
        """A fetch or fill stream with this route's Request ID: its Source, and the items the
        parser releases once it knows the Group Order; None to refuse the stream."""
        ...

    async def fetch_stream_ended(self, info: StreamInfo, fin: bool, reset_code: int | None
                                 ) -> None: ...

    def session_closed(self, code: int, reason: str) -> None: ...


class SessionBase:
    """The session as its requests see it (see the module docstring)."""

    def __init__(self, conn: Connection, config: SessionConfig, setup: Setup) -> None:
        self.conn = conn
        self.config = config
        self.is_client = conn.is_client
        # Every legality decision of this session (relay.moqt.state).
        self.state = SessionState(is_client=conn.is_client, setup=setup,
                                  webtransport=conn.transport == "webtransport")
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = asyncio.Event()
        self._close_info: tuple[int, str] | None = None
        # Receive-side routing of data streams: by the Request ID of our SUBSCRIBE, FETCH or
        # REQUEST_UPDATE (fill), or of a PUBLISH we received; Track Aliases map to Request IDs
        # in the state.
        self.routes: dict[int, DataRoute] = {}
        self._alias_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._route_waiters: dict[int, list[asyncio.Future[None]]] = {}

    # -- hooks for the layer above ---------------------------------------------------------------

    def answered(self, req: object, code: int | None) -> None:
        """A request of the peer was answered: accepted (``code`` None) or rejected."""

    def _session_closed(self, code: int, reason: str) -> None:
        """The session ended (called once)."""

    # -- closing ---------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def close_info(self) -> tuple[int, str] | None:
        return self._close_info

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
        self._session_closed(code, reason)
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

    # -- requests ------------------------------------------------------------------------------

    def next_request_id(self) -> int:
        return self.state.next_request_id()

    def next_track_alias(self) -> int:
        return self.state.next_track_alias()

    def request_streams(self) -> RequestStreams:
        """Request streams open now and granted, ours (``out``) and the peer's (``in``)."""
        return self.conn.request_streams()

    async def open_request(self) -> RequestStream:
        if self.closed:
            code, reason = self._close_info or (SessionErrorCode.INTERNAL_ERROR, "")
            raise SessionClosed(code, reason)
        try:
            send, recv = await self.conn.open_bi()
        except TransportError as e:
            raise self._closed_error(e) from None
        return RequestStream(self.state.request_stream(), send, recv)

    # -- routes of data streams ----------------------------------------------------------------

    def alias_route(self, alias: int) -> DataRoute | None:
        """The subscription that bound ``alias`` last, while one lives (the state knows)."""
        rid = self.state.aliases.route(alias)
        return self.routes.get(rid) if rid is not None else None

    async def route_for_alias(self, alias: int) -> DataRoute | None:
        """A subgroup stream can overtake the SUBSCRIBE_OK naming its alias (§8.3): it waits
        for it, at most ``alias_wait_timeout``."""
        if self.alias_route(alias) is None:
            await self._wait_for(self._alias_waiters, alias)
        return self.alias_route(alias)

    def alias_bound(self, alias: int) -> None:
        """A SUBSCRIBE_OK or PUBLISH bound ``alias`` (the state checked it): streams that
        overtook it may go on."""
        _wake(self._alias_waiters, alias)

    def unbind_alias(self, alias: int, request_id: int) -> None:
        self.state.aliases.release(alias, request_id)

    async def route_for_request(self, rid: int) -> DataRoute | None:
        """Fetch and fill streams name the Request ID of one of our requests (§11.6); one may
        overtake the reply that routes it."""
        if not self.state.issued(rid):
            return None
        if rid not in self.routes:
            await self._wait_for(self._route_waiters, rid)
        return self.routes.get(rid)

    def bind_request(self, rid: int, route: DataRoute) -> None:
        self.routes[rid] = route
        _wake(self._route_waiters, rid)

    async def _wait_for(self, waiters: dict[int, list[asyncio.Future[None]]], key: int
                        ) -> None:
        """Until ``key`` is bound or ``alias_wait_timeout`` has passed."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.setdefault(key, []).append(fut)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, self.config.alias_wait_timeout)
        finally:
            pending = waiters.get(key)
            if pending is not None and fut in pending:
                pending.remove(fut)
                if not pending:
                    del waiters[key]

    def unbind_request(self, rid: int) -> None:
        self.routes.pop(rid, None)


def _wake(waiters: dict[int, list[asyncio.Future[None]]], key: int) -> None:
    for w in waiters.pop(key, []):
        if not w.done():
            w.set_result(None)
