"""Byte streams of one session: identical for raw QUIC and WebTransport."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import application_of
from .errors import (
    ConnectionClosed,
    ReceiveBufferFull,
    StreamReset,
    StreamStopped,
    TransportError,
)

if TYPE_CHECKING:
    from .port import StreamPort

# Writes larger than the high-water mark are fed to aioquic in slices no smaller than
# this, so a writer waiting on a nearly-full buffer does not trickle tiny pieces.
_MIN_SLICE = 64 * 1024


class SendStream:
    """The sending half of a stream (a unidirectional stream or one side of a bidi).

    ``write`` applies backpressure: it waits while this stream (or the whole
    connection) has more unsent bytes queued than the configured high-water mark, so
    memory stays bounded by roughly ``send_buffer_high`` plus the bytes in flight.
    """

    __slots__ = ("_closed", "_port", "_room", "_stop_code", "_stopped", "stream_id")

    def __init__(self, port: StreamPort, stream_id: int) -> None:
        self._port = port
        self.stream_id = stream_id
        self._closed = False  # FIN written or reset: no more writes
        self._stop_code: int | None = None
        self._stopped: asyncio.Future[int] | None = None
        self._room: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<SendStream {self.stream_id}>"

    @property
    def stop_code(self) -> int | None:
        """The code of a STOP_SENDING received from the peer, or None."""
        return self._stop_code

    @property
    def unsent(self) -> int:
        """Bytes queued in aioquic for this stream but not sent yet."""
        return self._port.unsent(self.stream_id)

    async def write(self, data: bytes | bytearray | memoryview, end_stream: bool = False
                    ) -> None:
        """Queue ``data`` (and a FIN if ``end_stream``); wait first while over high water.

        Raises :class:`StreamStopped` after a STOP_SENDING from the peer,
        :class:`ConnectionClosed` when the session is gone.
        """
        self._check_writable()
        n = len(data)
        high = self._port.settings.send_buffer_high
        if n <= high:
            if not self._port.has_room(self.stream_id):
                await self._wait_room()
            self._port.send(self.stream_id, data, end_stream)
        else:
            view = memoryview(data)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            n = view.nbytes
            pos = 0
            while pos < n:
                if not self._has_room():
                    await self._wait_room()
                room = max(high - self._port.unsent(self.stream_id), _MIN_SLICE)
                end = min(n, pos + room)
                # A memoryview slice is not a copy; aioquic copies once into its buffer.
                self._port.send(self.stream_id, view[pos:end], end_stream and end == n)
                pos = end
        if end_stream:
            self._closed = True
            self._port.send_done(self)

    async def write_framed(self, head: bytes, data: bytes | bytearray | memoryview,
                           end_stream: bool = False) -> None:
        """``head`` (a frame's header) then ``data``, as ``write(head)`` then ``write(data,
        end_stream)`` would queue them, but with one wait for room and one send for both
        (two writes per Object doubled the per-write work, the relay's forwarding path's
        largest share of Python). Over the high-water mark: the two writes."""
        if len(head) + len(data) > self._port.settings.send_buffer_high:
            await self.write(head)
            await self.write(data, end_stream)
            return
        self._check_writable()
        if not self._port.has_room(self.stream_id):
            await self._wait_room()
        self._port.send_parts(self.stream_id, head, data, end_stream)
        if end_stream:
            self._closed = True
            self._port.send_done(self)

    async def finish(self) -> None:
        """Send FIN (after everything already written)."""
        await self.write(b"", end_stream=True)

    def would_wait(self, n: int) -> bool:
        """A ``write`` of ``n`` bytes now would wait for room (this stream's or the
        connection's); a larger one than the high-water mark always may."""
        return not self._has_room() or n > self._port.settings.send_buffer_high

    @property
    def connection_unsent(self) -> int:
        """Bytes written to any stream of this session and not yet sent."""
        return self._port.connection_unsent()

    @property
    def connection_full(self) -> bool:
        """The session as a whole is at its high-water mark: every write waits."""
        port = self._port
        return port.connection_unsent() >= port.settings.connection_send_buffer_high

    def reset(self, code: int) -> None:
        """Abort sending with RESET_STREAM carrying ``code`` (a MOQT stream reset code)."""
        if self._closed:
            return
        self._closed = True
        self._port.reset(self.stream_id, code)
        self._wake(TransportError("stream was reset locally"))
        self._port.send_done(self)

    async def wait_stopped(self) -> int:
        """Wait for a STOP_SENDING from the peer and return its code.

        The relay itself learns a STOP_SENDING from :meth:`write` (StreamStopped); this and
        :attr:`stop_code` are for a caller that watches a stream without writing to it, as
        the transport, session and fuzz tests do to see what a peer did."""
        if self._stop_code is not None:
            return self._stop_code
        if self._stopped is None:
            self._stopped = self._port.loop.create_future()
        return await asyncio.shield(self._stopped)

    def _has_room(self) -> bool:
        return self._port.has_room(self.stream_id)

    async def _wait_room(self) -> None:
        if self._room is not None:
            raise RuntimeError(f"concurrent write() on stream {self.stream_id}")
        while not self._has_room():
            self._room = self._port.loop.create_future()
            self._port.blocked(self, True)
            try:
                await self._room
            finally:
                self._room = None
                self._port.blocked(self, False)
            self._check_writable()

    def _check_writable(self) -> None:
        if self._stop_code is not None:
            raise StreamStopped(self._stop_code)
        exc = self._port.close_exc
        if exc is not None:
            raise exc
        if self._closed:
            raise TransportError(f"stream {self.stream_id} is closed for writing")

    def _wake(self, exc: BaseException | None = None) -> None:
        fut = self._room
        if fut is not None and not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

    # -- events, from the session's StreamTable -----------------------------------------

    def wake_if_room(self) -> None:
        if self._has_room():
            self._wake()

    def on_stop_sending(self, code: int) -> None:
        if self._stop_code is not None:
            return
        self._stop_code = code
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(code)
        self._wake(StreamStopped(code))
        self._closed = True

    def on_session_closed(self, exc: ConnectionClosed) -> None:
        self._closed = True
        self._wake(exc)
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_exception(exc)
            self._stopped.exception()  # mark retrieved: nobody may be waiting


class RecvStream:
    """The receiving half of a stream.

    Data is buffered here only up to the stream's receive window: credit
    (MAX_STREAM_DATA) is returned to the peer as the application reads.
    """

    __slots__ = ("_buf", "_buffered", "_error", "_fin", "_port", "_waiter", "stream_id")

    def __init__(self, port: StreamPort, stream_id: int) -> None:
        self._port = port
        self.stream_id = stream_id
        self._buf: deque[bytes] = deque()
        self._buffered = 0
        self._fin = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<RecvStream {self.stream_id}>"

    @property
    def buffered(self) -> int:
        """Bytes received and not yet read."""
        return self._buffered

    async def read(self) -> bytes:
        """Return the next chunk as received (no copy); ``b""`` means FIN (end of stream).

        Raises :class:`StreamReset` if the peer reset the stream,
        :class:`ConnectionClosed` if the session ended before FIN.
        """
        buf = self._buf
        if not buf:
            await self._wait_data()
            if not buf:
                return b""
        data = buf.popleft()
        n = len(data)
        self._buffered -= n
        self._port.consumed(self.stream_id, n)
        return data

    async def read_chunks(self) -> tuple[bytes, ...]:
        """Return every chunk received and not read yet, as received (none joined, one wait
        for many: a parser takes them as they are); empty means FIN. Raises as :meth:`read`
        does."""
        buf = self._buf
        if not buf:
            await self._wait_data()
            if not buf:
                return ()
        chunks = (buf.popleft(),) if len(buf) == 1 else tuple(buf)
        buf.clear()
        n = self._buffered
        self._buffered = 0
        self._port.consumed(self.stream_id, n)
        return chunks

    async def _wait_data(self) -> None:
        """Until a chunk is buffered or the stream is over (FIN read: returns, buffer empty)."""
        while not self._buf:
            if self._fin:
                self._port.recv_done(self)
                return
            if self._error is not None:
                raise self._error
            if self._waiter is not None:
                raise RuntimeError(f"concurrent read() on stream {self.stream_id}")
            self._waiter = self._port.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def stop_sending(self, code: int) -> None:
        """Ask the peer to stop (STOP_SENDING with ``code``) and drop buffered data."""
        if self._fin or self._error is not None:
            return
        self._port.stop(self.stream_id, code)
        self._drop(StreamReset(code))

    # -- events, from the session's StreamTable -----------------------------------------

    def on_data(self, data: bytes, fin: bool) -> None:
        if self._error is not None:
            return  # stopped locally: late data is discarded (credit already released)
        if data:
            self._buf.append(data)
            self._buffered += len(data)
            if self._port.buffered(self.stream_id, len(data)):
                code = application_of(self._port.settings).receive_overflow_code
                self._port.stop(self.stream_id, code)
                self._drop(ReceiveBufferFull(code))
                return
        if fin:
            self._fin = True
        self._wake()

    def _drop(self, exc: BaseException) -> None:
        if self._buffered:
            self._port.consumed(self.stream_id, self._buffered)
        self._buf.clear()
        self._buffered = 0
        self._error = exc
        self._wake()
        self._port.recv_done(self)

    def on_reset(self, code: int) -> None:
        if self._error is None and not self._fin:
            self._drop(StreamReset(code))

    def on_session_closed(self, exc: ConnectionClosed) -> None:
        # Data already received stays readable; only a missing FIN becomes an error.
        if self._error is None and not self._fin:
            self._error = exc
            self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)


@dataclass(frozen=True, slots=True)
class IncomingStream:
    """A stream opened by the peer: ``send`` is None for a unidirectional stream."""

    recv: RecvStream
    send: SendStream | None = None

    @property
    def stream_id(self) -> int:
        return self.recv.stream_id

    @property
    def is_bidirectional(self) -> bool:
        return self.send is not None
