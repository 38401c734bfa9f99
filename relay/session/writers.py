"""Writing the data plane: one subgroup stream, or one fetch / fill fetch stream.

Writes are awaitable: they return once the bytes are queued in the transport and wait first
while the stream or the connection is over its send high-water mark, so a fast producer can
never grow memory without bound. Payloads are handed to the transport as given (a
``memoryview`` of a cached buffer stays a view until aioquic copies it into its send buffer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from relay.moqt.codes import EndOfRangeType, GroupOrder, ObjectStatus, StreamResetCode
from relay.moqt.dataplane.fetch import FetchStreamEncoder
from relay.moqt.dataplane.objects import SubgroupHeader
from relay.moqt.dataplane.subgroup import SubgroupStreamEncoder
from relay.transport import SendStream, TransportError

if TYPE_CHECKING:
    Payload = bytes | bytearray | memoryview

# Below this, framing and payload are joined into one write (one aioquic call is cheaper
# than two for small Objects; above it the copy would cost more than the call).
_JOIN_BELOW = 2048


class _StreamWriter:
    __slots__ = ("_on_close", "closed", "reset_code", "stream")

    def __init__(self, stream: SendStream, on_close: Callable[[_StreamWriter], None] | None
                 ) -> None:
        self.stream = stream
        self._on_close = on_close
        self.closed = False
        self.reset_code: int | None = None

    @property
    def stream_id(self) -> int:
        return self.stream.stream_id

    async def _write(self, head: bytes, payload: Payload | None = None, fin: bool = False
                     ) -> None:
        if payload is None or len(payload) == 0:
            await self.stream.write(head, end_stream=fin)
        elif len(payload) < _JOIN_BELOW:
            await self.stream.write(head + bytes(payload), end_stream=fin)
        else:
            await self.stream.write_framed(head, payload, fin)

    async def finish(self) -> None:
        """FIN: every Object of the stream was written."""
        if self.closed:
            return
        try:
            await self.stream.finish()
        finally:
            self._closed()

    def reset(self, code: int = StreamResetCode.INTERNAL_ERROR) -> None:
        """RESET_STREAM: the stream ends before all its Objects were written (§11.5)."""
        if self.closed:
            return
        self.reset_code = code
        with contextlib.suppress(TransportError):
            self.stream.reset(code)
        self._closed()

    def _closed(self) -> None:
        if not self.closed:
            self.closed = True
            if self._on_close is not None:
                self._on_close(self)


class SubgroupWriter(_StreamWriter):
    """One subgroup stream: SUBGROUP_HEADER, then Objects in ascending Object ID order."""

    __slots__ = ("_enc", "header", "last_object_id")

    def __init__(self, stream: SendStream, header: SubgroupHeader,
                 on_close: Callable[[_StreamWriter], None] | None = None) -> None:
        super().__init__(stream, on_close)
        self.header = header
        self._enc = SubgroupStreamEncoder(header)
        self.last_object_id: int | None = None

    def header_bytes(self) -> bytes:
        return self._enc.header_bytes()

    async def write_object(self, object_id: int, payload: Payload, *,
                           properties: bytes | None = None, fin: bool = False) -> None:
        head = self._enc.object_header(object_id, len(payload), properties)
        self.last_object_id = object_id
        await self._write(head, payload, fin)
        if fin:
            self._closed()

    async def write_status(self, object_id: int, status: ObjectStatus, *, fin: bool = False
                           ) -> None:
        """End of Group / End of Track (or an empty Normal Object with status NORMAL)."""
        head = self._enc.status_object(object_id, ObjectStatus(status))
        self.last_object_id = object_id
        await self._write(head, None, fin)
        if fin:
            self._closed()


class FetchWriter(_StreamWriter):
    """One fetch or fill fetch stream: FETCH_HEADER, then Objects and End of Range markers in
    the stream's Group Order (§11.6, §11.7)."""

    __slots__ = ("_enc", "request_id")

    def __init__(self, stream: SendStream, request_id: int,
                 group_order: GroupOrder = GroupOrder.ASCENDING,
                 on_close: Callable[[_StreamWriter], None] | None = None) -> None:
        super().__init__(stream, on_close)
        self.request_id = request_id
        self._enc = FetchStreamEncoder(request_id, group_order)

    def header_bytes(self) -> bytes:
        return self._enc.header_bytes()

    async def write_object(self, group: int, subgroup: int | None, object_id: int,
                           priority: int, payload: Payload, *,
                           properties: bytes | None = None) -> None:
        """``subgroup`` None = an Object with Datagram forwarding preference."""
        head = self._enc.object_header(group, subgroup, object_id, priority, len(payload),
                                       properties)
        await self._write(head, payload)

    async def write_marker(self, kind: EndOfRangeType, end_group: int, end_object: int) -> None:
        await self._write(self._enc.end_of_range(kind, end_group, end_object))
