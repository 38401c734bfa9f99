"""Fetch and fill fetch streams (§11.6, §11.7): FETCH_HEADER, Objects with Serialization Flags,
End of Range markers; a stateful encoder and the parser."""

from __future__ import annotations

from typing import Any

from ..codes import EndOfRangeType, FetchFlag, GroupOrder
from ..errors import protocol_violation
from ..kvp import kvps_from_bytes
from ..vi64 import MAX_VI64, decode_vi64, encode_vi64
from .chunked import ChunkedParser, _Hold
from .fields import read_properties, read_vi
from .objects import EndOfRange, FetchHeader, FetchObject, Payload

__all__ = ["FETCH_HEADER_TYPE", "FetchStreamEncoder", "FetchStreamParser", "encode_fetch_header"]

FETCH_HEADER_TYPE = 0x05
_MARKERS = {int(t): t for t in EndOfRangeType}
_SMALL = tuple(bytes((i,)) for i in range(128))


def _vi(v: int) -> bytes:
    return _SMALL[v] if 0 <= v < 128 else encode_vi64(v)


def encode_fetch_header(request_id: int) -> bytes:
    return b"\x05" + encode_vi64(request_id)


class FetchStreamEncoder:
    """Stateful encoder of one fetch / fill stream.

    Flag choice (§11.6 guidance): the first Object of each Group gets Group delta, Object delta
    and Priority (0x1C, or 0x1F with an explicit Subgroup); following Objects of that Group
    write only what changed (0x00 for the next Object of the same Subgroup and priority).
    ``object_header`` returns only the framing: write the payload after it.
    """

    __slots__ = ("_group", "_object", "_prio", "_sub", "group_order", "request_id")

    def __init__(self, request_id: int, group_order: GroupOrder = GroupOrder.ASCENDING) -> None:
        self.request_id = request_id
        self.group_order = GroupOrder(group_order)
        self._group: int | None = None  # previous element (Object or marker)
        self._object = 0
        self._sub: int | None = None  # previous real Object's Subgroup (None: none/datagram)
        self._prio: int | None = None  # previous real Object's priority

    def header_bytes(self) -> bytes:
        return encode_fetch_header(self.request_id)

    def _group_delta(self, group: int) -> int:
        prev = self._group
        assert prev is not None
        d = group - prev - 1 if self.group_order == GroupOrder.ASCENDING else prev - group - 1
        if d < 0:
            raise ValueError(f"Group {group} out of {self.group_order.name} order after {prev}")
        return d

    def object_header(
        self,
        group_id: int,
        subgroup_id: int | None,
        object_id: int,
        publisher_priority: int,
        payload_length: int,
        properties: bytes | None = None,
    ) -> bytes:
        """Framing of one Object. ``subgroup_id`` None = Datagram forwarding preference;
        ``properties`` = raw KVP block (None or empty: no Properties field)."""
        if not 0 <= publisher_priority <= 255:
            raise ValueError("Publisher Priority is one byte")
        out: list[bytes] = []
        if self._group is None or group_id != self._group:
            flags = FetchFlag.GROUP_ID_DELTA | FetchFlag.OBJECT_ID_DELTA | FetchFlag.PRIORITY
            out.append(_vi(group_id if self._group is None else self._group_delta(group_id)))
            sub_bits, sub_field = (0, None) if subgroup_id in (0, None) else (3, subgroup_id)
            obj = _vi(object_id)
            prio_field = True
        else:
            flags = 0
            if object_id == self._object + 1:
                obj = b""
            else:
                if object_id < self._object:
                    raise ValueError(f"Object {object_id} after {self._object} in one Group")
                flags |= FetchFlag.OBJECT_ID_DELTA
                obj = _vi(object_id - self._object)
            if subgroup_id in (0, None):
                sub_bits, sub_field = 0, None
            elif subgroup_id == self._sub:
                sub_bits, sub_field = 1, None
            elif self._sub is not None and subgroup_id == self._sub + 1:
                sub_bits, sub_field = 2, None
            else:
                sub_bits, sub_field = 3, subgroup_id
            prio_field = publisher_priority != self._prio
            if prio_field:
                flags |= FetchFlag.PRIORITY
        if subgroup_id is None:
            flags |= FetchFlag.DATAGRAM
        else:
            flags |= sub_bits
            if sub_field is not None:
                out.append(_vi(sub_field))
        out.append(obj)
        if prio_field:
            out.append(bytes((publisher_priority,)))
        if properties:
            flags |= FetchFlag.PROPERTIES
            out.append(_vi(len(properties)))
            out.append(properties)
        out.append(_vi(payload_length))
        self._group = group_id
        self._object = object_id
        self._sub = subgroup_id
        self._prio = publisher_priority
        return _vi(int(flags)) + b"".join(out)

    def end_of_range(self, kind: EndOfRangeType, group_id: int, object_id: int) -> bytes:
        """An End of Range marker ending at ``{group_id, object_id}`` (inclusive).

        Markers always carry a Group delta, so the marker's Group must differ from the previous
        element's (§17 item 20): ``ValueError`` otherwise.
        """
        kind = EndOfRangeType(kind)
        if self._group is None:
            gd = group_id
        elif group_id == self._group:
            raise ValueError("an End of Range marker cannot end in the previous element's Group")
        else:
            gd = self._group_delta(group_id)
        self._group = group_id
        self._object = object_id
        return encode_vi64(kind) + _vi(gd) + _vi(object_id) + b"\x00"

    def encode_object(
        self,
        group_id: int,
        subgroup_id: int | None,
        object_id: int,
        publisher_priority: int,
        payload: Payload,
        properties: bytes | None = None,
    ) -> bytes:
        """Convenience: framing + payload in one (copying) ``bytes``."""
        return self.object_header(
            group_id, subgroup_id, object_id, publisher_priority, len(payload), properties
        ) + bytes(payload)


class FetchStreamParser(ChunkedParser):
    """Parses one fetch or fill fetch stream from its first byte (0x05).

    Yields ``FetchHeader`` first, then ``FetchObject`` and ``EndOfRange`` items. Group ID
    deltas depend on the Group Order: when it is not known at construction (a fill stream
    before SUBSCRIBE_OK, §9.4), bytes after the header are held until ``set_group_order``,
    which returns the items they complete.
    """

    __slots__ = ("_desc", "_group", "_object", "_order", "_prio", "_sub", "header")

    def __init__(self, group_order: GroupOrder | None = None) -> None:
        super().__init__()
        self.header: FetchHeader | None = None
        self._order = None if group_order is None else GroupOrder(group_order)
        self._desc = self._order == GroupOrder.DESCENDING
        self._group = -1  # -1: no previous element
        self._object = 0
        self._sub: int | None = None
        self._prio: int | None = None

    @property
    def group_order(self) -> GroupOrder | None:
        return self._order

    def set_group_order(self, order: GroupOrder) -> list[Any]:
        """Provide the Group Order; returns the items that were waiting for it."""
        order = GroupOrder(order)
        if self._order is not None:
            if order != self._order:
                raise ValueError("the Group Order of a fetch stream cannot change")
            return []
        self._order = order
        self._desc = order == GroupOrder.DESCENDING
        return self._release()

    def _step(self, buf: Any, pos: int) -> tuple[Any, int, int]:
        if self.header is None:
            t, p = decode_vi64(buf, pos)
            if t != FETCH_HEADER_TYPE:
                raise protocol_violation(f"fetch stream starts with {t:#x}")
            rid, p = decode_vi64(buf, p)
            self.header = FetchHeader(rid)
            return self.header, p, 0
        if self._order is None:
            raise _Hold
        b = buf[pos]
        if b < 0x80:
            flags = b
            p = pos + 1
        else:
            flags, p = decode_vi64(buf, pos)
            if flags >= 0x80:
                return self._marker(flags, buf, p)
        gd = od = 0
        if flags & 0x08:
            gd, p = decode_vi64(buf, p)
        sub: int | None = None
        mode = flags & 0x03
        if not flags & 0x40 and mode == 3:
            sub, p = decode_vi64(buf, p)
        if flags & 0x04:
            od, p = decode_vi64(buf, p)
        if flags & 0x10:
            prio = buf[p]
            p += 1
        else:
            prio = self._prio
        props = None
        if flags & 0x20:
            props, p = read_properties(buf, p)
        plen, p = read_vi(buf, p)
        # Every field is present: validate and resolve, then commit.
        prev_g = self._group
        if prev_g < 0:
            if flags & 0x0C != 0x0C or not flags & 0x10 or (not flags & 0x40 and mode in (1, 2)):
                raise protocol_violation("first fetch Object refers to a previous Object")
            group, obj = gd, od
        else:
            if flags & 0x08:
                group = self._next_group(prev_g, gd)
                obj = od if flags & 0x04 else self._object + 1
            else:
                group = prev_g
                obj = self._object + od if flags & 0x04 else self._object + 1
            if obj > MAX_VI64:
                raise protocol_violation("Object ID exceeds 2^64-1")
            if prio is None:
                raise protocol_violation("fetch Object refers to a missing previous priority")
        if not flags & 0x40:
            if mode == 0:
                sub = 0
            elif mode != 3:
                if self._sub is None:
                    raise protocol_violation("fetch Object refers to a missing previous Subgroup")
                sub = self._sub if mode == 1 else self._sub + 1
                if sub > MAX_VI64:
                    raise protocol_violation("Subgroup ID exceeds 2^64-1")
        if props:
            kvps_from_bytes(props)
        self._group = group
        self._object = obj
        self._sub = sub
        self._prio = prio
        if plen:
            return (group, sub, obj, prio, props), p, plen
        return FetchObject(group, sub, obj, prio, b"", props), p, 0  # type: ignore[arg-type]

    def _next_group(self, prev: int, delta: int) -> int:
        g = prev - delta - 1 if self._desc else prev + delta + 1
        if g < 0 or g > MAX_VI64:
            raise protocol_violation(f"Group ID {g} out of range")
        return g

    def _marker(self, flags: int, buf: Any, p: int) -> tuple[EndOfRange, int, int]:
        kind = _MARKERS.get(flags)
        if kind is None:
            raise protocol_violation(f"invalid Serialization Flags {flags:#x}")
        gd, p = decode_vi64(buf, p)
        od, p = decode_vi64(buf, p)
        plen, p = decode_vi64(buf, p)
        if plen:
            raise protocol_violation("End of Range marker with a payload")
        group = gd if self._group < 0 else self._next_group(self._group, gd)
        self._group = group
        self._object = od
        return EndOfRange(kind, group, od), p, 0

    def _complete(self, item: tuple[Any, ...], payload: Payload) -> FetchObject:
        g, s, o, pr, props = item
        return FetchObject(g, s, o, pr, payload, props)
