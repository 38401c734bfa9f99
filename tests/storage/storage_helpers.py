"""Shared test helpers: deterministic tracks and a brute-force reference walk."""

from __future__ import annotations

from collections.abc import Iterable

from storage.interface import (
    OBJECT_MAX,
    GroupOrder,
    Location,
    ObjectStatus,
    Span,
    SpanKind,
    StoredObject,
    TrackKey,
    WalkItem,
    normalize_ranges,
)


def track_key(i: int, ns: bytes = b"kvcs") -> TrackKey:
    return (ns, b"seg"), f"track-{i}".encode()


def payload(g: int, o: int, size: int, salt: int = 0) -> bytes:
    """Distinct, non-trivial bytes per Location (so a misplaced slice is caught)."""
    head = f"{salt}:{g}:{o}|".encode()
    return (head * (size // len(head) + 1))[:size]


def full_track(groups: list[int], *, size: int = 16, salt: int = 0,
               eot_objects: int = 0, props: bool = True) -> list[list[StoredObject]]:
    """A whole track: Group g has `groups[g]` data Objects and End of Group; then End of Track.

    Object sizes vary with the Object ID (some empty) to exercise the offsets.
    """
    out: list[list[StoredObject]] = []
    for g, n in enumerate(groups):
        objs = [StoredObject(g, 0, o, 7, ObjectStatus.NORMAL,
                             payload(g, o, 3, salt) if props and o % 2 else b"",
                             payload(g, o, (size * (o % 3)) // 2, salt))
                for o in range(n)]
        objs.append(StoredObject(g, 0, n, 7, ObjectStatus.END_OF_GROUP))
        out.append(objs)
    last = len(groups)
    tail = [StoredObject(last, 0, o, 7, ObjectStatus.NORMAL, b"", payload(last, o, size, salt))
            for o in range(eot_objects)]
    tail.append(StoredObject(last, 0, eot_objects, 7, ObjectStatus.END_OF_TRACK))
    out.append(tail)
    return out


def flat(groups: Iterable[Iterable[StoredObject]]) -> list[StoredObject]:
    return [o for objs in groups for o in objs]


def same(a: StoredObject, b: StoredObject) -> bool:
    return a.same_fields(b)


def describe(items: Iterable[WalkItem]) -> list[tuple]:
    """Comparable form of walk items (buffers as bytes)."""
    out: list[tuple] = []
    for it in items:
        if isinstance(it, Span):
            out.append(("span", int(it.kind), tuple(it.start), tuple(it.end)))
        else:
            out.append(("obj", it.group, it.object_id, it.subgroup, it.priority, it.status,
                        bytes(it.properties), bytes(it.payload), it.datagram))
    return out


def reference_walk(objects: dict[Location, StoredObject], end_of_track: Location | None,
                   start: Location, end: Location, order: GroupOrder,
                   object_ids: list[tuple[int, int | None]] | None,
                   include_status: bool) -> list[WalkItem]:
    """Brute force: classify Location by Location (Object IDs up to the largest held + 2,
    then one uniform tail), then merge neighbouring pieces of one kind."""
    if start > end:
        return []
    ranges = normalize_ranges(object_ids)
    eogs = {loc.group: loc.object for loc, o in objects.items()
            if o.status == ObjectStatus.END_OF_GROUP}
    top = max((loc.object for loc in objects), default=0) + 2
    if end_of_track is not None:
        top = max(top, end_of_track.object + 2)

    def kind_at(g: int, o: int) -> SpanKind:
        if end_of_track is not None and Location(g, o) >= end_of_track:
            return SpanKind.NON_EXISTENT
        if g in eogs and o >= eogs[g]:
            return SpanKind.NON_EXISTENT
        return SpanKind.UNKNOWN

    pieces: list[WalkItem] = []
    groups = list(range(start.group, end.group + 1))
    if order == GroupOrder.DESCENDING:
        groups.reverse()
    for g in groups:
        lo = start.object if g == start.group else 0
        hi = end.object if g == end.group else OBJECT_MAX
        for a, b in ranges:
            a, b = max(a, lo), min(b, hi)
            if a > b:
                continue
            for o in range(a, min(b, top) + 1):
                obj = objects.get(Location(g, o))
                if obj is not None and (include_status or obj.status == ObjectStatus.NORMAL):
                    pieces.append(obj)
                else:
                    k = kind_at(g, o)
                    pieces.append(Span(k, Location(g, o), Location(g, o)))
            if b > top:
                t = max(a, top + 1)
                pieces.append(Span(kind_at(g, t), Location(g, t), Location(g, b)))
    merged: list[WalkItem] = []
    for p in pieces:
        if (isinstance(p, Span) and merged and isinstance(merged[-1], Span)
                and merged[-1].kind == p.kind):
            merged[-1] = Span(p.kind, merged[-1].start, p.end)
        else:
            merged.append(p)
    return merged


def resolve_fetch(filter_type: int, fields: tuple[int, ...],
                  largest: Location) -> tuple[Location, Location]:
    """MOQT-PROFILE §6.3, FETCH column: (start, end) of a Location filter against L."""
    if filter_type == 0x00:
        return Location(0, 0), largest
    if filter_type == 0x01:
        (n,) = fields
        return Location(max(largest.group + 1 - n, 0), 0), largest
    if filter_type == 0x05:
        return Location(largest.group, largest.object + 1), largest
    sg, so = fields[0], fields[1]
    if filter_type == 0x02:
        return Location(sg, so), largest
    if filter_type == 0x03:
        return Location(sg, so), min(Location(sg + fields[2], OBJECT_MAX), largest)
    if filter_type == 0x04:
        return Location(sg, so), min(Location(sg + fields[2], fields[3]), largest)
    raise ValueError(filter_type)


def crash_track(i: int) -> list[list[StoredObject]]:
    """Track i of the crash test: a few small ones, then every 4th one of a few MiB."""
    sizes = [1 + (i * 7 + g) % 9 for g in range(1 + i % 4)]
    size = 256 * 1024 if i % 4 == 3 else 1024 + 37 * (i % 11)
    return full_track(sizes, size=size, salt=i, eot_objects=i % 2)


def deleted_by_child(i: int) -> bool:
    """crash_child.py deletes track i when it commits track i + 3 and (i + 3) % 5 == 0."""
    return (i + 3) % 5 == 0


def end_group(store: object, track: TrackKey, group: int, object_id: int) -> object:
    """Append the End of Group status Object {group, object_id} (as the relay caches it)."""
    return store.append(track, StoredObject(group, 0, object_id, 0,  # type: ignore[attr-defined]
                                            ObjectStatus.END_OF_GROUP))


def end_track(store: object, track: TrackKey, group: int, object_id: int = 0) -> object:
    """Append the End of Track status Object {group, object_id} (KVCS: {L, 0})."""
    return store.append(track, StoredObject(group, 0, object_id, 0,  # type: ignore[attr-defined]
                                            ObjectStatus.END_OF_TRACK))


def unknown_spans(items: Iterable[object]) -> list[Span]:
    """The UNKNOWN Spans of a walk (tiered walks yield (tier, item) pairs)."""
    out = []
    for it in items:
        item = it[1] if isinstance(it, tuple) and not isinstance(it, (Span, StoredObject)) \
            else it
        if isinstance(item, Span) and item.kind is SpanKind.UNKNOWN:
            out.append(item)
    return out
