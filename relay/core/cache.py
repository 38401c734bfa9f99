"""The one boundary between the relay's MOQT vocabulary and the store's.

Storage never imports the relay, so it spells Location, Object Status and Group Order itself
(storage/interface.py); the two agree value for value. The relay converts here and nowhere
else: a received Object becomes a `StoredObject` (the record the cache and the Forwarders
share), and what a walk or read of the store says comes back in relay `Location`s.
"""

from __future__ import annotations

from collections.abc import Iterator

from relay.moqt.codes import ObjectStatus
from relay.moqt.primitives import Location
from relay.session import ReceivedObject, Source
from storage.interface import GroupOrder as StoreOrder
from storage.interface import IdRanges, Span, StoredObject, Tier, TrackKey
from storage.interface import Location as StoreLocation
from storage.tiered import TieredReader


def stored_object(ev: ReceivedObject) -> StoredObject:
    """The cache's record of a received Object (payload and properties as received)."""
    return StoredObject(ev.group, ev.subgroup, ev.object_id, ev.priority, int(ev.status),
                        ev.properties or b"", ev.payload, ev.stream.source is Source.DATAGRAM)


def status_object(group: int, subgroup: int, object_id: int, priority: int,
                  status: ObjectStatus) -> StoredObject:
    return StoredObject(group, subgroup, object_id, priority, int(status))


def relay_location(loc: StoreLocation | None) -> Location | None:
    return Location(loc.group, loc.object) if loc is not None else None


def walk(r: TieredReader, key: TrackKey, start: Location, end: Location,
         object_ids: IdRanges | None = None) -> Iterator[tuple[Tier, StoredObject | Span]]:
    """`TieredReader.walk` in ascending order, its Spans in relay Locations."""
    for tier, item in r.walk(key, StoreLocation(*start), StoreLocation(*end),
                             StoreOrder.ASCENDING, object_ids):
        if isinstance(item, Span):
            item = Span(item.kind, Location(*item.start), Location(*item.end))  # type: ignore[arg-type]
        yield tier, item


def read(r: TieredReader, key: TrackKey, start: Location, end: Location
         ) -> Iterator[StoredObject]:
    """The Objects held of [start, end] (status Objects included), ascending."""
    for _, obj in r.read(key, StoreLocation(*start), StoreLocation(*end)):
        yield obj


__all__ = ["read", "relay_location", "status_object", "stored_object", "walk"]
