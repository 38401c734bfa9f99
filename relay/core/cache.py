"""Where received Objects become the cache's records, and the relay's walks and reads of it.

The store speaks the codec's vocabulary (Location, Object Status, Group Order), so nothing is
converted: a received Object becomes a `StoredObject` (the record the cache and the
Forwarders share), and walks and reads take and give relay `Location`s.
"""

from __future__ import annotations

from collections.abc import Iterator

from relay.moqt.codes import ObjectStatus
from relay.moqt.primitives import Location
from relay.session import ReceivedObject, Source
from storage.interface import GroupOrder, IdRanges, Span, StoredObject, Tier, TrackKey
from storage.tiered import TieredReader


def stored_object(ev: ReceivedObject) -> StoredObject:
    """The cache's record of a received Object (payload and properties as received, unless
    a payload is a view of a buffer at least twice its size: see ``owned``)."""
    return StoredObject(ev.group, ev.subgroup, ev.object_id, ev.priority, int(ev.status),
                        ev.properties or b"", owned(ev.payload),
                        ev.stream.source is Source.DATAGRAM)


def owned(payload: bytes | memoryview) -> bytes | memoryview:
    """``payload``, or a copy of it where it is a view of a buffer at least twice its size.

    A payload that arrived inside one receive chunk is a view of that chunk and keeps all of
    it alive, while the cache counts only the payload's bytes (``StoredObject.nbytes``): a
    small Object at the end of a 16 KiB chunk would hold the chunk. Copied, what the cache
    holds is what it counts; a payload that is most of its buffer stays a view (the copy
    would cost more than it frees)."""
    if type(payload) is memoryview:
        base = payload.obj
        if isinstance(base, bytes | bytearray) and 2 * payload.nbytes <= len(base):
            return bytes(payload)
    return payload


def status_object(group: int, subgroup: int, object_id: int, priority: int,
                  status: ObjectStatus) -> StoredObject:
    return StoredObject(group, subgroup, object_id, priority, int(status))


def walk(r: TieredReader, key: TrackKey, start: Location, end: Location,
         object_ids: IdRanges | None = None) -> Iterator[tuple[Tier, StoredObject | Span]]:
    """`TieredReader.walk` in ascending order."""
    yield from r.walk(key, start, end, GroupOrder.ASCENDING, object_ids)


def read(r: TieredReader, key: TrackKey, start: Location, end: Location
         ) -> Iterator[StoredObject]:
    """The Objects held of [start, end] (status Objects included), ascending."""
    for _, obj in r.read(key, start, end):
        yield obj


__all__ = ["read", "status_object", "stored_object", "walk"]
