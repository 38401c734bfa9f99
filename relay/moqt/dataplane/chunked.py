"""Incremental framing shared by the subgroup and fetch stream parsers.

Received chunks are parsed in place. An item header cut by a chunk boundary is completed
from a small probe of the next chunk (so the following payload stays a view of that chunk);
a payload that spans chunks is collected as views and joined once.

Subclasses implement ``_step(buf, pos) -> (item, header_end, payload_len)``: it raises
``IndexError`` when ``buf`` ends inside the header and must change no state in that case.
``payload_len`` 0 means ``item`` is complete; otherwise ``_complete(item, payload)`` builds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import protocol_violation

__all__ = ["ChunkedParser"]

_PROBE = 256  # bytes of the next chunk tried first when completing a cut header


class _Hold(Exception):
    """Raised by ``_step`` when parsing must wait for outside information."""


class ChunkedParser:
    __slots__ = ("_ended", "_fin_held", "_held", "_holding", "_need", "_parts", "_pending",
                 "_tail")

    def __init__(self) -> None:
        self._tail: bytes = b""
        self._parts: list[bytes | memoryview] = []
        self._need = 0
        self._pending: Any = None
        self._ended = False
        self._holding = False
        self._held: list[memoryview] = []
        self._fin_held = False

    # -- subclass interface -------------------------------------------------------------------

    def _step(self, buf: Any, pos: int) -> tuple[Any, int, int]:
        raise NotImplementedError

    def _complete(self, item: Any, payload: bytes | memoryview) -> Any:
        raise NotImplementedError

    # -- public ---------------------------------------------------------------------------------

    def feed(self, data: bytes | memoryview = b"", end_stream: bool = False) -> list[Any]:
        """Items completed by ``data``. Do not mutate ``data`` afterwards: payloads view it."""
        need = self._need
        if need and not end_stream:
            # Hot path: a chunk wholly inside a payload spanning chunks (small QUIC frames).
            n = len(data)
            if n < need:
                self._parts.append(data)  # type: ignore[arg-type]
                self._need = need - n
                return []
        if self._ended:
            if data:
                raise protocol_violation("data after FIN")
            return []
        out: list[Any] = []
        if data:
            self._ingest(data, out)
        if end_stream:
            self._end(out)
        return out

    def feed_chunks(self, chunks: Sequence[bytes]) -> list[Any]:
        """``feed`` of ``chunks``, the chunks of one read in order, as a transport hands
        them over. A read lying wholly inside the payload being collected is kept as it came
        (the payload is joined once, when complete: the bulk of a large Object is copied once,
        not twice). A read holding an item boundary is joined and parsed in place, its items
        viewing that buffer: in CPython one join costs less than parsing chunk by chunk."""
        if len(chunks) == 1:
            return self.feed(chunks[0])
        need = self._need
        if need:  # mid-payload (never while ended or held)
            total = sum(map(len, chunks))
            if total < need:
                self._parts.extend(chunks)
                self._need = need - total
                return []
        return self.feed(b"".join(chunks))

    def end_of_stream(self) -> list[Any]:
        """FIN: raises PROTOCOL_VIOLATION if it falls inside a header or an Object."""
        return self.feed(b"", True)

    # -- machinery ------------------------------------------------------------------------------

    def _end(self, out: list[Any]) -> None:
        if self._holding:
            self._fin_held = True
            return
        self._ended = True
        if self._need or self._tail:
            raise protocol_violation("FIN inside an Object")

    def _release(self) -> list[Any]:
        """Parse what was held back by ``_Hold`` (the subclass resolved the wait)."""
        held, self._held, self._holding = self._held, [], False
        out: list[Any] = []
        for chunk in held:
            if self._holding:
                self._held.append(chunk)
            else:
                self._ingest(chunk, out)
        if self._fin_held and not self._holding:
            self._fin_held = False
            self._end(out)
        return out

    def _ingest(self, data: bytes | memoryview, out: list[Any]) -> None:
        if self._holding:
            self._held.append(memoryview(data))
            return
        pos = 0
        if self._need:
            n = len(data)
            if n < self._need:
                self._parts.append(memoryview(data))
                self._need -= n
                return
            k = self._need
            self._parts.append(memoryview(data)[:k])
            payload = b"".join(self._parts)
            self._parts = []
            self._need = 0
            out.append(self._complete(self._pending, payload))
            self._pending = None
            pos = k
            if pos == n:
                return
        if self._tail:
            tail = self._tail
            probe = tail + bytes(memoryview(data)[pos : pos + _PROBE])
            try:
                item, hend, plen = self._step(probe, 0)
            except IndexError:
                if len(data) - pos <= _PROBE:
                    self._tail = probe
                    return
                # A header longer than the probe (large Properties): join it all once.
                self._tail = b""
                self._parse(tail + bytes(memoryview(data)[pos:]), 0, out)
                return
            except _Hold:
                self._tail = b""
                self._holding = True
                self._held.append(memoryview(probe + bytes(memoryview(data)[pos + _PROBE :])))
                return
            self._tail = b""
            pos += hend - len(tail)
            if plen:
                self._payload(item, data, pos, plen, out)
                if self._need:
                    return
                pos += plen
            else:
                out.append(item)
        self._parse(data, pos, out)

    def _payload(self, item: Any, data: Any, pos: int, plen: int, out: list[Any]) -> None:
        end = pos + plen
        if end <= len(data):
            out.append(self._complete(item, memoryview(data)[pos:end]))
        else:
            self._pending = item
            self._parts = [memoryview(data)[pos:]]
            self._need = end - len(data)

    def _parse(self, buf: Any, pos: int, out: list[Any]) -> None:
        n = len(buf)
        mv = memoryview(buf)
        step = self._step
        complete = self._complete
        append = out.append
        while pos < n:
            try:
                item, hend, plen = step(buf, pos)
            except IndexError:
                self._tail = bytes(mv[pos:])
                return
            except _Hold:
                self._holding = True
                self._held.append(mv[pos:])
                return
            if not plen:
                append(item)
                pos = hend
                continue
            pend = hend + plen
            if pend <= n:
                append(complete(item, mv[hend:pend]))
                pos = pend
            else:
                self._pending = item
                self._parts = [mv[hend:]]
                self._need = pend - n
                return
