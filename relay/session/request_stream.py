"""One request stream (§1.3, §5): a bidirectional stream carrying one request and its replies."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from relay.moqt.codes import StreamResetCode
from relay.moqt.messages.base import Message
from relay.moqt.state import Refuse, RequestState
from relay.transport import RecvStream, SendStream, StreamReset, TransportError


class RequestStream:
    """Messages in and out of one request stream, each through its ``RequestState``.

    ``recv`` returns the next message the state accepted, ``None`` at FIN, and raises
    ``StreamReset`` when the peer reset its direction. What the state refuses (a request or a
    REQUEST_UPDATE, answered with REQUEST_ERROR) is answered here, in order, and never
    returned; a refused request then reads as ``None``. A broken rule (``SessionError``)
    propagates: the caller's task guard closes the session with its code.

    On a ``responder`` stream (a request of the peer's) our FIN after the final message
    completes the request (§5.2): the requester's direction is then released (read to its
    FIN, or STOP_SENDING) at once, so a requester that never FINs does not hold the stream,
    and with it its stream credit, for the rest of the session.
    """

    __slots__ = ("_pending", "_recv_done", "_released", "_responder", "_send_done",
                 "recv_stream", "send_stream", "state")

    def __init__(self, state: RequestState, send: SendStream, recv: RecvStream, *,
                 responder: bool = False) -> None:
        self.state = state
        self.send_stream = send
        self.recv_stream = recv
        self._responder = responder
        self._pending: deque[Message | Refuse] = deque()
        self._send_done = False
        self._recv_done = False
        self._released = False

    @property
    def stream_id(self) -> int:
        return self.send_stream.stream_id

    @property
    def send_finished(self) -> bool:
        """Our direction has ended (FIN or reset): nothing more will be answered here."""
        return self._send_done

    async def send(self, msg: Message, *, fin: bool = False) -> None:
        if self._send_done:
            return
        data = self.state.send(msg)
        if fin:
            self.state.send_ended()
        await self.send_stream.write(data, end_stream=fin)
        if fin:
            self._send_done = True
            if self._responder:
                await self.release()

    async def finish(self) -> None:
        """FIN our direction (idempotent; a closed or stopped stream is left alone)."""
        if self._send_done:
            return
        self._send_done = True
        self.state.send_ended()
        with contextlib.suppress(TransportError):
            await self.send_stream.finish()
        if self._responder:
            await self.release()

    async def recv(self) -> Message | None:
        while True:
            while not self._pending:
                if self._recv_done:
                    return None
                try:
                    chunk = await self.recv_stream.read()
                except StreamReset:
                    if self._released:
                        return None  # we stopped reading: the request is over, not reset
                    raise
                if not chunk:
                    self._recv_done = True
                self._pending.extend(self.state.receive(chunk, not chunk))
            item = self._pending.popleft()
            if not isinstance(item, Refuse):
                return item
            with contextlib.suppress(TransportError):
                await self.send(item.reply, fin=item.final)
            if item.final:  # the request is over before it began
                self._pending.clear()
                await self.release()
                return None

    async def wait_reset(self) -> None:
        """Return once the peer reset its direction (it cancelled the request, §5.1), while
        we hold back the answer. A message that arrives meanwhile stays for ``recv``; after
        one, or after FIN, this waits forever (nothing but a reset cancels then)."""
        while not self._pending and not self._recv_done:
            try:
                chunk = await self.recv_stream.read()
            except StreamReset:
                if not self._released:
                    return
                break
            if not chunk:
                self._recv_done = True
            self._pending.extend(self.state.receive(chunk, not chunk))
        await asyncio.Event().wait()

    def take_received(self) -> list[Message]:
        """The messages that arrived with the last one ``recv`` returned (in the same read)
        and were not asked for yet, up to the first the state refused (``recv`` answers
        that one)."""
        taken: list[Message] = []
        while self._pending and not isinstance(self._pending[0], Refuse):
            item = self._pending.popleft()
            assert not isinstance(item, Refuse)
            taken.append(item)
        return taken

    async def release(self) -> None:
        """The request is over (REQUEST_ERROR, TRACK_STATUS_OK): stop reading so the
        transport forgets the stream. A long-lived session makes many requests; each
        finished one must not leave its receive side behind. A FIN already received is
        read (that frees it); a peer still sending gets STOP_SENDING. Never waits."""
        if self._recv_done:
            return
        self._recv_done = True
        self._released = True
        self.recv_stream.stop_sending(StreamResetCode.CANCELLED)
        with contextlib.suppress(StreamReset, TransportError):
            while await self.recv_stream.read():
                pass

    def cancel(self, code: int = StreamResetCode.CANCELLED) -> None:
        """Abort both directions (RESET_STREAM + STOP_SENDING), §5.1."""
        if not self._send_done:
            self._send_done = True
            self.state.send_ended()
            self.send_stream.reset(code)
        if not self._recv_done:
            self._recv_done = True
            self.recv_stream.stop_sending(code)


__all__ = ["RequestStream", "StreamReset"]
