"""Subgroup streams (§11.2–§11.4): SUBGROUP_HEADER, Objects, encoders and the parser."""

from __future__ import annotations

from typing import Any

from ..codes import ObjectStatus, SubgroupFlag, SubgroupIdMode
from ..errors import protocol_violation
from ..kvp import kvps_from_bytes
from ..vi64 import MAX_VI64, decode_vi64, encode_vi64
from .chunked import ChunkedParser
from .fields import read_properties, read_vi
from .objects import Payload, SubgroupHeader, SubgroupObject

__all__ = [
    "SubgroupStreamEncoder",
    "SubgroupStreamParser",
    "decode_subgroup_type_flags",
    "encode_subgroup_header",
    "encode_subgroup_object_header",
    "is_subgroup_type",
]

_NORMAL = ObjectStatus.NORMAL
_STATUS = {int(s): s for s in ObjectStatus}
_SMALL = tuple(bytes((i,)) for i in range(128))


def is_subgroup_type(v: int) -> bool:
    """§1.3 dispatch: a value below 0x80 with bit 0x10 set starts a SUBGROUP_HEADER."""
    return v < 0x80 and bool(v & SubgroupFlag.SUBGROUP_HEADER)


def decode_subgroup_type_flags(flags: int) -> SubgroupIdMode:
    """Validate Type Flags; returns the Subgroup ID mode (PROTOCOL_VIOLATION if invalid)."""
    if flags >= 0x80:
        raise protocol_violation(f"SUBGROUP_HEADER Type Flags {flags:#x} >= 0x80")
    if not flags & SubgroupFlag.SUBGROUP_HEADER:
        raise protocol_violation(f"SUBGROUP_HEADER Type Flags {flags:#x} without bit 0x10")
    mode = (flags & 0x06) >> 1
    if mode == 3:
        raise protocol_violation("reserved SUBGROUP_ID_MODE 0b11")
    return SubgroupIdMode(mode)


def encode_subgroup_header(h: SubgroupHeader) -> bytes:
    out = [encode_vi64(h.type_flags), encode_vi64(h.track_alias), encode_vi64(h.group_id)]
    if h.subgroup_id_mode == SubgroupIdMode.EXPLICIT:
        if h.subgroup_id is None:
            raise ValueError("explicit Subgroup ID mode needs a subgroup_id")
        out.append(encode_vi64(h.subgroup_id))
    elif h.subgroup_id_mode == SubgroupIdMode.ZERO and h.subgroup_id not in (0, None):
        raise ValueError("Subgroup ID mode ZERO with a non-zero subgroup_id")
    if h.publisher_priority is not None:
        if not 0 <= h.publisher_priority <= 255:
            raise ValueError("Publisher Priority is one byte")
        out.append(bytes((h.publisher_priority,)))
    return b"".join(out)


def _vi(v: int) -> bytes:
    return _SMALL[v] if 0 <= v < 128 else encode_vi64(v)


def encode_subgroup_object_header(
    object_id_delta: int,
    payload_length: int,
    *,
    status: ObjectStatus = _NORMAL,
    properties: bytes | None = None,
) -> bytes:
    """Framing of one Object (everything but the payload). ``properties`` is the raw KVP block:
    pass ``b""``/``None``-free bytes exactly when the stream has the PROPERTIES flag."""
    parts = _vi(object_id_delta)
    if properties is not None:
        if properties and status != _NORMAL:
            raise ValueError("Properties on a non-Normal Object")
        parts += _vi(len(properties)) + properties
    if payload_length:
        if status != _NORMAL:
            raise ValueError("a status Object has no payload")
        return parts + _vi(payload_length)
    return parts + b"\x00" + _vi(status)


class SubgroupStreamEncoder:
    """Stateful encoder of one subgroup stream (Object ID deltas).

    Write ``header_bytes()`` first, then per Object ``object_header(...)`` followed by the
    payload — the payload itself is never copied by the codec.
    """

    __slots__ = ("_prev", "header")

    def __init__(self, header: SubgroupHeader) -> None:
        self.header = header
        self._prev = -1

    def header_bytes(self) -> bytes:
        return encode_subgroup_header(self.header)

    def _delta(self, object_id: int) -> int:
        prev = self._prev
        delta = object_id if prev < 0 else object_id - prev - 1
        if delta < 0:
            raise ValueError(f"Object {object_id} does not follow Object {prev}")
        self._prev = object_id
        return delta

    def _props(self, properties: bytes | None) -> bytes | None:
        if self.header.has_properties:
            return b"" if properties is None else properties
        if properties:
            raise ValueError("Properties on a stream without the PROPERTIES flag")
        return None

    def object_header(
        self, object_id: int, payload_length: int, properties: bytes | None = None
    ) -> bytes:
        """Framing of a Normal Object (payload_length 0 = an empty Normal Object)."""
        prev = self._prev
        delta = object_id if prev < 0 else object_id - prev - 1
        if 0 <= delta < 128 and payload_length and properties is None \
                and not self.header.has_properties:
            # the relay's every forwarded Object: what the general path below builds,
            # without its five calls
            self._prev = object_id
            return _SMALL[delta] + encode_vi64(payload_length)
        return encode_subgroup_object_header(
            self._delta(object_id), payload_length, properties=self._props(properties)
        )

    def status_object(self, object_id: int, status: ObjectStatus) -> bytes:
        """A status Object (End of Group / End of Track): complete, no payload."""
        return encode_subgroup_object_header(
            self._delta(object_id), 0, status=status, properties=self._props(None)
        )

    def encode_object(
        self, object_id: int, payload: Payload, properties: bytes | None = None
    ) -> bytes:
        """Convenience: framing + payload in one (copying) ``bytes``."""
        return self.object_header(object_id, len(payload), properties) + bytes(payload)


class SubgroupStreamParser(ChunkedParser):
    """Parses one subgroup stream from its first byte (the Type Flags).

    ``feed`` yields the ``SubgroupHeader`` first, then ``SubgroupObject`` items.
    """

    __slots__ = ("_prev", "_props", "header", "subgroup_id")

    def __init__(self) -> None:
        super().__init__()
        self.header: SubgroupHeader | None = None
        self.subgroup_id: int | None = None  # known after the header (mode 1: first Object)
        self._props = False
        self._prev = -1

    def _header(self, buf: Any, pos: int) -> tuple[SubgroupHeader, int, int]:
        flags, p = decode_vi64(buf, pos)
        mode = decode_subgroup_type_flags(flags)
        alias, p = decode_vi64(buf, p)
        group, p = decode_vi64(buf, p)
        sub: int | None = 0
        if mode == SubgroupIdMode.EXPLICIT:
            sub, p = decode_vi64(buf, p)
        elif mode == SubgroupIdMode.FIRST_OBJECT_ID:
            sub = None
        prio = None
        if not flags & SubgroupFlag.DEFAULT_PRIORITY:
            prio = buf[p]
            p += 1
        h = SubgroupHeader(
            alias,
            group,
            sub,
            prio,
            first_object=bool(flags & SubgroupFlag.FIRST_OBJECT),
            end_of_group=bool(flags & SubgroupFlag.END_OF_GROUP),
            has_properties=bool(flags & SubgroupFlag.PROPERTIES),
            subgroup_id_mode=mode,
        )
        self.header = h
        self.subgroup_id = sub
        self._props = h.has_properties
        return h, p, 0

    def _step(self, buf: Any, pos: int) -> tuple[Any, int, int]:
        if self.header is None:
            return self._header(buf, pos)
        b = buf[pos]
        if b < 0x80:
            delta = b
            p = pos + 1
        else:
            delta, p = decode_vi64(buf, pos)
        props = None
        if self._props:
            props, p = read_properties(buf, p)
        plen, p = read_vi(buf, p)
        prev = self._prev
        oid = delta if prev < 0 else prev + delta + 1
        if oid > MAX_VI64:
            raise protocol_violation("Object ID exceeds 2^64-1")
        if plen:
            if props:
                _check_props(props)
            self._commit(oid)
            return (oid, props), p, plen
        code, p = decode_vi64(buf, p)
        status = _STATUS.get(code)
        if status is None:
            raise protocol_violation(f"unknown Object Status {code:#x}")
        if props:
            if status != _NORMAL:
                raise protocol_violation("Properties on a non-Normal Object")
            _check_props(props)
        self._commit(oid)
        return SubgroupObject(oid, b"", status, props), p, 0

    def _commit(self, oid: int) -> None:
        if self._prev < 0 and self.subgroup_id is None:
            self.subgroup_id = oid  # SUBGROUP_ID_MODE 0b01
        self._prev = oid

    def _complete(self, item: tuple[int, bytes | None], payload: Payload) -> SubgroupObject:
        return SubgroupObject(item[0], payload, _NORMAL, item[1])


def _check_props(raw: bytes) -> None:
    kvps_from_bytes(raw)  # framing only (PROTOCOL_VIOLATION); values are the cache's business
