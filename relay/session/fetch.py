"""FETCH, both sides (§7.9, §7.10, §10, §11.6): ``FetchResponse`` is a FETCH we sent
(``start_fetch``), ``IncomingFetch`` one the peer sent."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from relay.moqt.codes import GroupOrder, MessageType, StreamResetCode
from relay.moqt.dataplane.fetch import FetchStreamParser
from relay.moqt.kvp import Properties
from relay.moqt.messages import Fetch, FetchOk, RequestOk, RequestUpdate
from relay.moqt.params import Params
from relay.moqt.primitives import Location, TrackNamespace
from relay.transport import StreamReset, TransportError

from .errors import SessionClosed, StreamAborted
from .event_queue import END, EventQueue, EventSource
from .events import FetchEvent, Source, StreamInfo
from .request_stream import RequestStream
from .requests import IncomingTrackRequest, OutgoingTrackRequest, send_routed
from .writers import FetchWriter, _StreamWriter

if TYPE_CHECKING:
    from .base import SessionBase

# How long a FETCH whose request stream the responder FINed, while no fetch stream of it has
# arrived, waits for that stream: it was finished before the FIN, so it is late (reordered,
# or lost and sent again), unless it was reset before its header could name the request.
FETCH_STREAM_GRACE = 1.0


class FetchResponse(OutgoingTrackRequest, EventSource[FetchEvent]):
    """The requester side of a FETCH: FETCH_OK's fields, then the fetch stream's Objects."""

    def __init__(self, session: SessionBase, rs: RequestStream, request_id: int,
                 namespace: TrackNamespace, name: bytes, params: Params) -> None:
        super().__init__(session, rs, request_id, namespace, name, params)
        self.end_of_track = False
        self.end_location: Location | None = None
        self._events = EventQueue(session.config.receive_queue)
        # set once the first reply (FETCH_OK or REQUEST_ERROR) was read, or will never be
        self.reply_read = asyncio.Event()
        self._stream_seen = asyncio.Event()  # a fetch stream of ours arrived (its header)
        self._watcher: asyncio.Task[None] | None = None

    def stream_opened(self) -> None:
        self._stream_seen.set()

    def watch_request(self) -> None:
        """After FETCH_OK: notice the responder ending the request without a fetch stream we
        could ever see (one reset before its header names no request, §18 rule 3)."""
        self._watcher = self.session.spawn(self._watch_request(), "fetch-request-watch")

    async def _watch_request(self) -> None:
        try:
            while (await self.rs.recv()) is not None:
                pass  # nothing else is sent on a FETCH's request stream to us
            code = None
        except StreamReset as e:
            code = e.code
        except TransportError:
            return  # the session's end reaches us through session_closed
        if self.ended or self._stream_seen.is_set():
            return  # the fetch stream's own end decides
        if code is None:
            # a FIN: the responder finished its fetch stream first, so that stream is only
            # late (reordered, lost and resent); a stream reset before its header never comes
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stream_seen.wait(), FETCH_STREAM_GRACE)
            if self._stream_seen.is_set():
                return
        self._watcher = None  # ends here: nothing to cancel
        self._end(StreamAborted(code if code is not None else StreamResetCode.CANCELLED))

    def _end(self, end: Any) -> None:
        if self.ended:
            return
        self.ended = True
        self.session.unbind_request(self.request_id)
        self._events.put_nowait_end(end)
        self.session.spawn(self._close_request(), "fetch-fin")

    def stream_closed(self) -> None:
        pass

    async def fetch_stream_started(self, parser: FetchStreamParser
                                   ) -> tuple[Source, list[Any]] | None:
        return Source.FETCH, parser.set_group_order(self.group_order)

    async def fetch_stream_ended(self, info: StreamInfo, fin: bool, reset_code: int | None
                                 ) -> None:
        self._end(END if fin else StreamAborted(reset_code or 0))

    async def _close_request(self) -> None:
        """The response is complete: FIN the request stream and forget it (§7.10). The
        whole fetch stream can arrive before FETCH_OK (§10 item 4: reordering, loss, or a
        peer's packets coalesced that way); releasing first would discard FETCH_OK unread."""
        await self.reply_read.wait()
        self._stop_watching()
        await self.rs.finish()
        await self.rs.release()

    def session_closed(self, code: int, reason: str) -> None:
        if not self.ended:
            self.ended = True
            self._events.put_nowait_end(SessionClosed(code, reason))

    def cancel(self, code: int = StreamResetCode.CANCELLED) -> None:
        """STOP_SENDING the request stream (§10 item 9); late data is dropped."""
        self._stop_watching()
        self.rs.cancel(code)
        if not self.ended:
            self.ended = True
            self._events.put_nowait_end(discard=True)
        self.session.unbind_request(self.request_id)

    def _stop_watching(self) -> None:
        # the request stream has one reader at a time: ours stops before it is released
        if self._watcher is not None:
            self._watcher.cancel()
        self._watcher = None

    async def collect(self) -> list[FetchEvent]:
        return [e async for e in self]


async def start_fetch(session: SessionBase, namespace: TrackNamespace, name: bytes,
                      params: Params) -> FetchResponse:
    rs = await session.open_request()
    rid = session.next_request_id()
    resp = FetchResponse(session, rs, rid, namespace, name, params)
    # data may come before FETCH_OK (§10 item 4)
    try:
        reply: FetchOk = await send_routed(session, rs, Fetch(rid, namespace, name, params), resp)
    except BaseException:
        # the caller is gone before the reply (cancelled, the session failed): a fetch
        # stream that came first must not wait, unread, for a reader that never comes
        if not resp.ended:
            resp.cancel()
        raise
    finally:
        resp.reply_read.set()
    resp.end_of_track = reply.end_of_track
    resp.end_location = reply.end_location
    resp.track_properties = reply.track_properties
    if not resp.ended:
        resp.watch_request()
    return resp


class IncomingFetch(IncomingTrackRequest):
    TYPE = MessageType.FETCH
    msg: Fetch

    def __init__(self, session: SessionBase, rs: RequestStream, msg: Fetch) -> None:
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
        # §5.2: the responder FINs the request stream once the fetch stream is finished. A
        # reset fetch stream resets the request stream too: the stream may have gone before
        # its header named the request, and the requester must not wait for it.
        if w.reset_code is not None:
            self.rs.cancel(w.reset_code)
            return
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
