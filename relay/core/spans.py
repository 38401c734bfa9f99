"""Spans of Locations (inclusive ranges) and what an upstream fetch or fill stream said
about them: which Locations it delivered, marked unknown, or skipped (§11.7, §10 item 6).
Arithmetic only: no store, no session."""

from __future__ import annotations

from collections.abc import Sequence

from relay.moqt.codes import EndOfRangeType
from relay.moqt.primitives import Location
from relay.session import RangeMarker
from storage.interface import OBJECT_MAX

Spans = list[tuple[Location, Location]]


def after(loc: Location) -> Location:
    return Location(loc.group, loc.object + 1) if loc.object < OBJECT_MAX \
        else Location(loc.group + 1, 0)


def before(loc: Location) -> Location:
    return Location(loc.group, loc.object - 1) if loc.object > 0 \
        else Location(loc.group - 1, OBJECT_MAX)


def gaps(start: Location, end: Location, covered: Sequence[tuple[Location, Location]]
         ) -> Spans:
    """The parts of the inclusive span [start, end] outside every inclusive range of
    ``covered`` (in any order)."""
    out: Spans = []
    cur = start
    for lo, hi in sorted(covered):
        if hi < cur:
            continue
        if lo > end:
            break
        if lo > cur:
            out.append((cur, before(lo)))
        if hi >= end:
            return out
        cur = after(hi)
    if cur <= end:
        out.append((cur, end))
    return out


class MarkerSpans:
    """What an upstream fetch or fill stream said, element by element: the Locations of
    its Objects, and the Unknown and Timed-Out ranges of its End of Range markers (§11.7;
    each covers every Location after the previous element up to and including the
    marker's). Once the stream ended with FIN, everything else it covered does not exist
    (§10 item 6), but the marked ranges say nothing about existence (§14.9: a relay MUST
    NOT turn unknown into does-not-exist)."""

    def __init__(self, start: Location) -> None:
        self.next = start  # the first Location after the previous element
        self.unknown: Spans = []
        self.delivered: Spans = []  # runs of consecutive Objects, in stream order

    def element(self, loc: Location) -> None:
        self.next = after(loc)

    def object(self, loc: Location) -> None:
        d = self.delivered
        if d and after(d[-1][1]) == loc:
            d[-1] = (d[-1][0], loc)
        else:
            d.append((loc, loc))
        self.element(loc)

    def marker(self, ev: RangeMarker) -> None:
        if ev.type != EndOfRangeType.NON_EXISTENT and ev.end >= self.next:
            self.unknown.append((self.next, ev.end))
        self.element(ev.end)

    def gap_before(self, loc: Location) -> Spans:
        """The Locations an element at ``loc`` skips: the stream is in order, so they are
        not there (a marker would have said unknown), whether or not a FIN follows."""
        return [(self.next, before(loc))] if self.next < loc else []

    def absent(self, start: Location, end: Location) -> Spans:
        """The Locations of [start, end] the stream, ended with FIN, skipped: they do not
        exist. Decided on what the stream carried, never on what the cache holds after it:
        an Object it delivered that the cache has evicted since is unknown, not absent."""
        return gaps(start, end, self.delivered + self.unknown)


__all__ = ["MarkerSpans", "Spans", "after", "before", "gaps"]
