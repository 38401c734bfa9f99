"""Bounded reader for complete control-message bodies and parameter values.

Inside a body whose Length has already been checked, running out of bytes means the fields
do not fit the announced Length: a PROTOCOL_VIOLATION, never "wait for more".
"""

from __future__ import annotations

from .errors import protocol_violation
from .vi64 import decode_vi64

__all__ = ["Reader"]


class Reader:
    """Cursor over ``buf[pos:end]``."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def at_end(self) -> bool:
        return self.pos >= self.end

    def vi64(self) -> int:
        if self.pos >= self.end:
            raise protocol_violation("field runs past the end of the message")
        try:
            v, p = decode_vi64(self.buf, self.pos)
        except IndexError:
            raise protocol_violation("vi64 runs past the end of the message") from None
        if p > self.end:
            raise protocol_violation("vi64 runs past the end of the message")
        self.pos = p
        return v

    def u8(self) -> int:
        if self.pos >= self.end:
            raise protocol_violation("byte field runs past the end of the message")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > self.end:
            raise protocol_violation("length runs past the end of the message")
        out = bytes(self.buf[self.pos : end])
        self.pos = end
        return out

    def length_prefixed(self, limit: int | None = None, what: str = "field") -> bytes:
        n = self.vi64()
        if limit is not None and n > limit:
            raise protocol_violation(f"{what} longer than {limit} bytes")
        return self.take(n)

    def sub(self, n: int) -> Reader:
        """A reader over the next ``n`` bytes; this reader skips past them."""
        end = self.pos + n
        if end > self.end:
            raise protocol_violation("length runs past the end of the message")
        r = Reader(self.buf, self.pos, end)
        self.pos = end
        return r

    def rest(self) -> bytes:
        out = bytes(self.buf[self.pos : self.end])
        self.pos = self.end
        return out

    def expect_end(self, what: str = "message") -> None:
        if self.pos != self.end:
            raise protocol_violation(f"{self.end - self.pos} unexpected bytes at the end of {what}")
