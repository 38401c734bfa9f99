"""Control-message framing (§3): ``Type (vi64), Length (16), Body``, and an incremental parser
for control and request streams.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codes import MessageType
from .errors import RequestError, protocol_violation
from .messages.base import MESSAGE_CLASSES, Message
from .reader import Reader
from .vi64 import decode_vi64, encode_vi64

__all__ = [
    "MAX_MESSAGE_BODY",
    "ControlStreamParser",
    "InvalidRequest",
    "decode_message",
    "encode_message",
]

MAX_MESSAGE_BODY = 0xFFFF


def encode_message(msg: Message) -> bytes:
    """The framed message: Type, 16-bit Length, body."""
    body = msg.encode_body()
    if len(body) > MAX_MESSAGE_BODY:
        raise ValueError(f"{msg.TYPE.name} body of {len(body)} bytes exceeds 65535")
    return encode_vi64(msg.TYPE) + len(body).to_bytes(2, "big") + body


def decode_message(msg_type: int, body: bytes | memoryview) -> Message:
    """Decode one body. Unknown type → PROTOCOL_VIOLATION; a request with a bad Range filter
    → ``RequestError`` carrying ``message_type`` and ``request_id``."""
    cls = MESSAGE_CLASSES.get(msg_type)
    if cls is None:
        raise protocol_violation(f"unknown message type {msg_type:#x}")
    return cls.decode_body(Reader(body))


@dataclass(frozen=True)
class InvalidRequest:
    """A well-framed request the session must refuse with REQUEST_ERROR ``error.code``
    (e.g. INVALID_FILTER). The stream stays usable."""

    message_type: MessageType
    request_id: int | None
    error: RequestError


class ControlStreamParser:
    """Incremental parser for a control stream or a request stream.

    ``feed`` returns the messages completed by ``data`` (plus ``InvalidRequest`` items); the
    result does not depend on how the bytes were split. Session errors raise ``SessionError``.
    """

    __slots__ = ("_buf", "_ended")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._ended = False

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(
        self, data: bytes | memoryview = b"", end_stream: bool = False
    ) -> list[Message | InvalidRequest]:
        if self._ended:
            if data:
                raise protocol_violation("data after the end of the stream")
            return []
        buf = self._buf
        buf += data
        out: list[Message | InvalidRequest] = []
        pos = 0
        n = len(buf)
        while pos < n:
            try:
                msg_type, p = decode_vi64(buf, pos)
            except IndexError:
                break
            if msg_type not in MESSAGE_CLASSES:  # fail early: the body can't be skipped
                raise protocol_violation(f"unknown message type {msg_type:#x}")
            if p + 2 > n:
                break
            end = p + 2 + ((buf[p] << 8) | buf[p + 1])
            if end > n:
                break
            body = bytes(buf[p + 2 : end])
            pos = end
            try:
                out.append(decode_message(msg_type, body))
            except RequestError as e:
                out.append(InvalidRequest(MessageType(msg_type), e.request_id, e))
        del buf[:pos]
        if end_stream:
            out.extend(self.end_of_stream())
        return out

    def end_of_stream(self) -> list[Message | InvalidRequest]:
        """FIN received: a message cut by it is a PROTOCOL_VIOLATION."""
        self._ended = True
        if self._buf:
            raise protocol_violation(f"stream ended inside a message ({len(self._buf)} bytes)")
        return []
