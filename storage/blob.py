"""Byte layouts of the LMDB tier: one value per (track, Group), and Full Track Name keys.

Group value (little endian), written once and never modified:

    header   "KVG1" (4) | count (u32)
    index    count x { object_id u64 | subgroup u64 | offset u64 | properties_len u32 |
                       payload_len u32 | priority u8 | status u8 | flags u8 | reserved u8 }
    data     properties then payload of each Object, in index order, back to back

Entries are sorted by Object ID, so an Object-ID range is a slice of the index, and the data of
consecutive Objects is contiguous: a whole Group (a KVCS layer) is one sequential read. Offsets
are from the start of the value, so a reader slices the value's memoryview without copying.
"""

from __future__ import annotations

import hashlib
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence

from storage.interface import (
    OBJECT_MAX,
    Buffer,
    ObjectStatus,
    StorageError,
    StoredObject,
    TrackKey,
)

MAGIC = b"KVG1"
_HEADER = struct.Struct("<4sI")
_ENTRY = struct.Struct("<QQQIIBBBx")
_FLAG_DATAGRAM = 0x01
_U32 = 0xFFFFFFFF


class CorruptGroupError(StorageError):
    """A stored Group value does not parse (never expected: values are written atomically)."""


def group_size(objects: Sequence[StoredObject]) -> int:
    """Length of the Group value `encode_group_into` writes for `objects`."""
    return (_HEADER.size + len(objects) * _ENTRY.size
            + sum(len(o.properties) + len(o.payload) for o in objects))


def encode_group_into(scratch: bytearray, objects: Sequence[StoredObject]) -> int:
    """Write the Group value for `objects` (one Group, ascending IDs) at the start of
    `scratch`, growing it if needed; returns its length.

    A reused scratch buffer instead of a fresh `bytes` per Group: py-lmdb has no MDB_RESERVE,
    so one copy is unavoidable, but fresh multi-MiB allocations would also page-fault.
    """
    size = group_size(objects)
    if len(scratch) < size:
        scratch.extend(bytes(size - len(scratch)))
    n = len(objects)
    _HEADER.pack_into(scratch, 0, MAGIC, n)
    pos, offset = _HEADER.size, _HEADER.size + n * _ENTRY.size
    for obj in objects:
        plen, dlen = len(obj.properties), len(obj.payload)
        if plen > _U32 or dlen > _U32:
            raise StorageError(f"Object {obj.location} too large for the LMDB tier")
        _ENTRY.pack_into(scratch, pos, obj.object_id, obj.subgroup, offset, plen, dlen,
                         obj.priority, obj.status, _FLAG_DATAGRAM if obj.datagram else 0)
        pos += _ENTRY.size
        if plen:
            scratch[offset:offset + plen] = obj.properties
            offset += plen
        if dlen:
            scratch[offset:offset + dlen] = obj.payload
            offset += dlen
    return size


class GroupView:
    """Zero-copy reader over one Group value; valid only while its buffer is."""

    __slots__ = ("_buf", "_count", "_dense", "_ids", "end_of_group", "group")

    def __init__(self, group: int, buf: memoryview) -> None:
        if len(buf) < _HEADER.size:
            raise CorruptGroupError(f"Group {group}: value too short")
        magic, count = _HEADER.unpack_from(buf, 0)
        if magic != MAGIC or len(buf) < _HEADER.size + count * _ENTRY.size:
            raise CorruptGroupError(f"Group {group}: bad header")
        self.group = group
        self._buf = buf
        self._count = count
        self._ids: list[int] | None = None
        self.end_of_group: int | None = None
        last = -1
        if count:
            entry = _ENTRY.unpack_from(buf, _HEADER.size + (count - 1) * _ENTRY.size)
            last = entry[0]
            if entry[6] == ObjectStatus.END_OF_GROUP:
                self.end_of_group = last
        # KVCS Groups are dense (IDs 0..n-1): then an ID is its own index, no search needed.
        self._dense = count > 0 and last == count - 1

    def __len__(self) -> int:
        return self._count

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        if self._dense:
            return max(lo, 0), min(hi, self._count - 1) + 1
        if self._ids is None:
            end = _HEADER.size + self._count * _ENTRY.size
            self._ids = [e[0] for e in _ENTRY.iter_unpack(self._buf[_HEADER.size:end])]
        return bisect_left(self._ids, lo), bisect_right(self._ids, hi)

    def objects_between(self, lo: int, hi: int) -> Iterator[StoredObject]:
        i, j = self._span(lo, hi)
        if i >= j:
            return
        buf, g, new = self._buf, self.group, tuple.__new__
        index = buf[_HEADER.size + i * _ENTRY.size:_HEADER.size + j * _ENTRY.size]
        # The hot read loop: one C-level unpack per entry, tuple.__new__ skips the NamedTuple
        # constructor's Python frame; properties and payload are slices of the mapped value.
        for oid, sub, off, plen, dlen, prio, status, flags in _ENTRY.iter_unpack(index):
            mid = off + plen
            yield new(StoredObject, (g, sub, oid, prio, status, buf[off:mid],
                                     buf[mid:mid + dlen], flags & _FLAG_DATAGRAM == 1))

    def objects(self) -> Iterator[StoredObject]:
        return self.objects_between(0, OBJECT_MAX)


def encode_track_name(track: TrackKey) -> bytes:
    """Length-prefixed Namespace fields then Track Name: an injective encoding."""
    namespace, name = track
    parts = [len(namespace).to_bytes(1, "big")]
    for field in (*namespace, name):
        parts.append(len(field).to_bytes(4, "big"))
        parts.append(bytes(field))
    return b"".join(parts)


def decode_track_name(data: Buffer) -> TrackKey:
    buf = bytes(data)
    count, pos = buf[0], 1
    fields: list[bytes] = []
    for _ in range(count + 1):
        n = int.from_bytes(buf[pos:pos + 4], "big")
        fields.append(buf[pos + 4:pos + 4 + n])
        pos += 4 + n
    if pos != len(buf):
        raise StorageError("bad stored track name")
    return tuple(fields[:-1]), fields[-1]


def track_name_key(encoded: bytes) -> bytes:
    """LMDB keys are at most 511 bytes and Full Track Names up to 4 KiB: key by digest."""
    return hashlib.sha256(encoded).digest()
