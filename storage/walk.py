"""The range walk both tiers share: Objects plus unknown / non-existent Spans, in stream order.

A tier supplies the sorted IDs of the Groups it holds in the range, a way to open one Group, and
the End of Track Location if known. Existence rules (MOQT §11.4, §14.1):

* in Group g, Object IDs >= its End of Group Object's ID do not exist;
* Locations >= the End of Track Location do not exist;
* every other Location the tier holds no Object for is unknown.

Runs of Groups the tier does not hold at all are reported without visiting each Group, so a walk
over a sparse or huge Group range costs O(groups held), not O(groups in range).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from storage.interface import (
    OBJECT_MAX,
    GroupOrder,
    Location,
    ObjectStatus,
    Span,
    SpanKind,
    StoredObject,
    WalkItem,
)

_NORMAL = ObjectStatus.NORMAL


class GroupSource(Protocol):
    """One Group as a tier holds it."""

    @property
    def end_of_group(self) -> int | None:
        """Object ID of the Group's End of Group Object, if held."""
        ...

    def objects_between(self, lo: int, hi: int) -> Iterable[StoredObject]:
        """Held Objects with lo <= Object ID <= hi, ascending."""
        ...


def group_bounds(g: int, start: Location, end: Location) -> tuple[int, int]:
    """The Object-ID interval of Group g that lies inside [start, end]."""
    lo = start.object if g == start.group else 0
    hi = end.object if g == end.group else OBJECT_MAX
    return lo, hi


def clip_ranges(ranges: Sequence[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """Intersection of normalized Object-ID ranges with [lo, hi]."""
    if len(ranges) == 1:  # the common case (no filter, or KVCS's single 0..n-1)
        a, b = ranges[0]
        a, b = max(a, lo), min(b, hi)
        return [(a, b)] if a <= b else []
    out = []
    for a, b in ranges:
        a, b = max(a, lo), min(b, hi)
        if a <= b:
            out.append((a, b))
    return out


def groups_in(held: Sequence[int], first: int, last: int) -> Sequence[int]:
    """The slice of sorted Group IDs `held` inside [first, last]."""
    return held[bisect_left(held, first):bisect_right(held, last)]


def read_objects(start: Location, end: Location, order: GroupOrder,
                 ranges: Sequence[tuple[int, int]], held: Sequence[int],
                 open_group: Callable[[int], GroupSource | None]) -> Iterator[StoredObject]:
    """Held Objects (status Objects included) of [start, end] in stream order."""
    if start > end:
        return
    groups = groups_in(held, start.group, end.group)
    if order == GroupOrder.DESCENDING:
        groups = groups[::-1]
    for g in groups:
        src = open_group(g)
        if src is None:
            continue
        lo, hi = group_bounds(g, start, end)
        for a, b in clip_ranges(ranges, lo, hi):
            yield from src.objects_between(a, b)


class _Coalescer:
    """Merges consecutive span pieces of one kind; Objects flush the pending span."""

    __slots__ = ("end", "kind", "start")

    def __init__(self) -> None:
        self.kind: SpanKind | None = None
        self.start = Location(0, 0)
        self.end = Location(0, 0)

    def add(self, kind: SpanKind, start: Location, end: Location) -> Span | None:
        if self.kind is kind:
            self.end = end
            return None
        done = self.flush()
        self.kind, self.start, self.end = kind, start, end
        return done

    def flush(self) -> Span | None:
        if self.kind is None:
            return None
        span = Span(self.kind, self.start, self.end)
        self.kind = None
        return span


def walk_range(start: Location, end: Location, order: GroupOrder,
               ranges: Sequence[tuple[int, int]], held: Sequence[int],
               open_group: Callable[[int], GroupSource | None],
               end_of_track: Location | None, include_status: bool = False
               ) -> Iterator[WalkItem]:
    """Every Location of [start, end] passing `ranges`, as Objects and maximal Spans.

    `held` is the sorted list of Group IDs the tier holds; `open_group` may still return None
    (the Group went away), which makes it unknown like any Group not held.
    """
    if start > end or not ranges:
        return
    co = _Coalescer()
    eot_group = end_of_track.group if end_of_track is not None else None

    def absent_from(g: int, eog: int | None, held: bool) -> int | None:
        # Smallest Object ID from which Group g is known not to exist.
        f = eog
        if eot_group is not None:
            if g > eot_group:
                return 0
            if g == eot_group:
                assert end_of_track is not None
                eot = end_of_track.object
                if not held and include_status:
                    # the End of Track status Object itself is at that Location: a tier
                    # that does not hold its Group does not know it (another tier may)
                    eot += 1
                f = eot if f is None else min(f, eot)
        return f

    def gap(g: int, x: int, y: int, f: int | None) -> Iterator[Span]:
        if f is None or f > y:
            pieces = ((SpanKind.UNKNOWN, x, y),)
        elif f <= x:
            pieces = ((SpanKind.NON_EXISTENT, x, y),)
        else:
            pieces = ((SpanKind.UNKNOWN, x, f - 1), (SpanKind.NON_EXISTENT, f, y))
        for kind, a, b in pieces:
            done = co.add(kind, Location(g, a), Location(g, b))
            if done is not None:
                yield done

    def one_group(g: int, src: GroupSource | None) -> Iterator[WalkItem]:
        lo, hi = group_bounds(g, start, end)
        f = absent_from(g, src.end_of_group if src is not None else None, src is not None)
        for a, b in clip_ranges(ranges, lo, hi):
            cursor = a
            if src is not None:
                for obj in src.objects_between(a, b):
                    if obj.status != _NORMAL and not include_status:
                        continue
                    if obj.object_id > cursor:
                        yield from gap(g, cursor, obj.object_id - 1, f)
                    done = co.flush()
                    if done is not None:
                        yield done
                    yield obj
                    cursor = obj.object_id + 1
            if cursor <= b:
                yield from gap(g, cursor, b, f)

    def missing_run(g1: int, g2: int) -> Iterator[WalkItem]:
        # Groups g1..g2 are not held: only the edge Groups and the End of Track Group can
        # differ from their neighbours, everything between them is one uniform piece.
        special = sorted({g for g in (g1, g2, start.group, end.group, eot_group)
                          if g is not None and g1 <= g <= g2})
        parts: list[tuple[int, int, bool]] = []  # (first, last, is_special)
        prev = g1 - 1
        for s in special:
            if s > prev + 1:
                parts.append((prev + 1, s - 1, False))
            parts.append((s, s, True))
            prev = s
        if order == GroupOrder.DESCENDING:
            parts.reverse()
        for first, last, is_special in parts:
            if is_special:
                yield from one_group(first, None)
                continue
            kind = (SpanKind.NON_EXISTENT if eot_group is not None and first > eot_group
                    else SpanKind.UNKNOWN)
            a, b = ranges[0][0], ranges[-1][1]
            if order == GroupOrder.DESCENDING:
                first, last = last, first
            done = co.add(kind, Location(first, a), Location(last, b))
            if done is not None:
                yield done

    groups = groups_in(held, start.group, end.group)
    units: list[tuple[int, int, bool]] = []  # (first, last, held)
    prev = start.group - 1
    for g in groups:
        if g > prev + 1:
            units.append((prev + 1, g - 1, False))
        units.append((g, g, True))
        prev = g
    if prev < end.group:
        units.append((prev + 1, end.group, False))
    if order == GroupOrder.DESCENDING:
        units.reverse()
    for first, last, is_held in units:
        if is_held:
            yield from one_group(first, open_group(first))
        else:
            yield from missing_run(first, last)
    done = co.flush()
    if done is not None:
        yield done
