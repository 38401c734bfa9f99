"""Incoming unidirectional streams (§1.3): identify the stream type, then parse it."""

from __future__ import annotations

from typing import Any

from ..codes import PADDING_STREAM_TYPE, GroupOrder, MessageType, UniStreamType
from ..control import ControlStreamParser
from ..errors import protocol_violation
from ..vi64 import decode_vi64, encode_vi64
from .fetch import FETCH_HEADER_TYPE, FetchStreamParser
from .subgroup import SubgroupStreamParser, decode_subgroup_type_flags, is_subgroup_type

__all__ = ["PADDING_STREAM_HEADER", "UniStreamParser", "classify_stream_type"]

PADDING_STREAM_HEADER = encode_vi64(PADDING_STREAM_TYPE)


def classify_stream_type(first: int) -> UniStreamType:
    """Map the stream's first vi64 to its kind; anything else → PROTOCOL_VIOLATION."""
    if first == MessageType.SETUP:
        return UniStreamType.CONTROL
    if first == FETCH_HEADER_TYPE:
        return UniStreamType.FETCH
    if first == PADDING_STREAM_TYPE:
        return UniStreamType.PADDING
    if is_subgroup_type(first):
        decode_subgroup_type_flags(first)  # reserved mode 0b11
        return UniStreamType.SUBGROUP
    raise protocol_violation(f"unknown unidirectional stream type {first:#x}")


class UniStreamParser:
    """One incoming unidirectional stream.

    ``feed`` returns, by ``kind``: CONTROL → control messages (starting with SETUP);
    SUBGROUP → ``SubgroupHeader`` then ``SubgroupObject``s; FETCH → ``FetchHeader`` then
    ``FetchObject`` / ``EndOfRange``; PADDING → nothing. ``kind`` is None until the first
    vi64 is complete. A second control stream is the session's check (it sees ``kind``).

    Once ``kind`` is known, hot paths may call ``parser.feed`` directly (one call less per
    received chunk).
    """

    __slots__ = ("_fetch_order", "_head", "kind", "parser")

    def __init__(self, fetch_group_order: GroupOrder | None = None) -> None:
        self.kind: UniStreamType | None = None
        self.parser: ControlStreamParser | SubgroupStreamParser | FetchStreamParser | None = None
        self._head = b""
        self._fetch_order = fetch_group_order

    @property
    def buffered(self) -> int:
        """Bytes held while the stream type is still incomplete."""
        return len(self._head)

    def feed(self, data: bytes | memoryview = b"", end_stream: bool = False) -> list[Any]:
        if self.parser is None:
            if self.kind == UniStreamType.PADDING:
                return []
            buf: bytes | memoryview = data
            if self._head:
                buf = self._head + bytes(data)
            try:
                first, _ = decode_vi64(buf, 0)
            except IndexError:
                self._head = bytes(buf)
                if end_stream:
                    raise protocol_violation("stream ended before its type") from None
                return []
            self._head = b""
            self.kind = classify_stream_type(first)
            if self.kind == UniStreamType.PADDING:
                return []
            if self.kind == UniStreamType.CONTROL:
                self.parser = ControlStreamParser()
            elif self.kind == UniStreamType.FETCH:
                self.parser = FetchStreamParser(self._fetch_order)
            else:
                self.parser = SubgroupStreamParser()
            data = buf
        return self.parser.feed(data, end_stream)

    def end_of_stream(self) -> list[Any]:
        return self.feed(b"", True)

    def set_group_order(self, order: GroupOrder) -> list[Any]:
        """Fetch / fill streams: provide the Group Order once the Request ID is resolved."""
        if isinstance(self.parser, FetchStreamParser):
            return self.parser.set_group_order(order)
        if self.parser is None and self.kind is None:
            self._fetch_order = order
            return []
        raise ValueError("not a fetch stream")
