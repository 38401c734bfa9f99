"""OBJECT_DATAGRAM and padding datagrams (§11.8). A datagram is always complete: truncation is
a PROTOCOL_VIOLATION, never "wait for more"."""

from __future__ import annotations

from ..codes import PADDING_DATAGRAM_TYPE, DatagramFlag, ObjectStatus
from ..errors import protocol_violation
from ..kvp import kvps_from_bytes
from ..vi64 import decode_vi64, encode_vi64
from .objects import ObjectDatagram

__all__ = ["decode_datagram", "encode_datagram"]

_F = DatagramFlag
_DEFINED = int(
    _F.PROPERTIES | _F.END_OF_GROUP | _F.ZERO_OBJECT_ID | _F.DEFAULT_PRIORITY | _F.STATUS
)


def encode_datagram(d: ObjectDatagram) -> bytes:
    flags = 0
    if d.properties:
        flags |= _F.PROPERTIES
    if d.end_of_group:
        flags |= _F.END_OF_GROUP
    if d.object_id == 0:
        flags |= _F.ZERO_OBJECT_ID
    if d.publisher_priority is None:
        flags |= _F.DEFAULT_PRIORITY
    if d.status is not None:
        flags |= _F.STATUS
        if d.end_of_group:
            raise ValueError("STATUS datagrams cannot set END_OF_GROUP")
        if d.payload:
            raise ValueError("a STATUS datagram has no payload")
        if d.properties and d.status != ObjectStatus.NORMAL:
            raise ValueError("Properties on a non-Normal Object")
    out = [encode_vi64(flags), encode_vi64(d.track_alias), encode_vi64(d.group_id)]
    if d.object_id:
        out.append(encode_vi64(d.object_id))
    if d.publisher_priority is not None:
        out.append(bytes((d.publisher_priority,)))
    if d.properties:
        out.append(encode_vi64(len(d.properties)) + d.properties)
    if d.status is not None:
        out.append(encode_vi64(d.status))
    else:
        out.append(bytes(d.payload))
    return b"".join(out)


def decode_datagram(data: bytes | memoryview) -> ObjectDatagram | None:
    """Decode one datagram; None for a padding datagram. The payload views ``data``."""
    try:
        return _decode(data)
    except IndexError:
        raise protocol_violation("truncated OBJECT_DATAGRAM") from None


def _decode(data: bytes | memoryview) -> ObjectDatagram | None:
    flags, p = decode_vi64(data, 0)
    if flags == PADDING_DATAGRAM_TYPE:
        return None
    if flags >= 0x80 or flags & ~_DEFINED:
        raise protocol_violation(f"invalid OBJECT_DATAGRAM Type Flags {flags:#x}")
    if flags & _F.STATUS and flags & _F.END_OF_GROUP:
        raise protocol_violation("OBJECT_DATAGRAM with STATUS and END_OF_GROUP")
    alias, p = decode_vi64(data, p)
    group, p = decode_vi64(data, p)
    obj = 0
    if not flags & _F.ZERO_OBJECT_ID:
        obj, p = decode_vi64(data, p)
    prio = None
    if not flags & _F.DEFAULT_PRIORITY:
        prio = data[p]
        p += 1
    props = None
    if flags & _F.PROPERTIES:
        ln, p = decode_vi64(data, p)
        if ln == 0:
            raise protocol_violation("OBJECT_DATAGRAM with an empty Properties field")
        if p + ln > len(data):
            raise IndexError
        props = bytes(data[p : p + ln])
        kvps_from_bytes(props)
        p += ln
    status = None
    payload: bytes | memoryview = b""
    if flags & _F.STATUS:
        code, p = decode_vi64(data, p)
        try:
            status = ObjectStatus(code)
        except ValueError:
            raise protocol_violation(f"unknown Object Status {code:#x}") from None
        if props and status != ObjectStatus.NORMAL:
            raise protocol_violation("Properties on a non-Normal Object")
        if p != len(data):
            raise protocol_violation("bytes after the Object Status of a datagram")
    else:
        payload = memoryview(data)[p:]
    return ObjectDatagram(
        alias, group, obj, prio, payload, status, props, bool(flags & _F.END_OF_GROUP)
    )
