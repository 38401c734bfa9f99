"""draft-22 LOCATION_FILTER (§6.2) and its evaluation (§6.3).

The value is self-delimiting: Filter Type (vi64) then exactly as many vi64 fields as the type
number (0..4); type 0x05 Next Object has none. No length prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codes import LocationFilterType
from .errors import protocol_violation
from .primitives import Location, LocationRange
from .reader import Reader
from .vi64 import MAX_VI64, encode_vi64

__all__ = [
    "LocationFilter",
    "decode_location_filter",
    "encode_location_filter",
    "resolve_fetch_range",
    "resolve_subscription_range",
]

_T = LocationFilterType
_ABSOLUTE = frozenset({_T.ABSOLUTE_START, _T.ABSOLUTE_START_GROUP_END, _T.ABSOLUTE_RANGE})


def _nfields(t: LocationFilterType) -> int:
    return 0 if t in (_T.NONE, _T.NEXT_OBJECT) else int(t)


@dataclass(frozen=True, slots=True)
class LocationFilter:
    """One LOCATION_FILTER value; unused fields stay 0."""

    type: LocationFilterType
    start_group: int = 0
    start_object: int = 0
    end_group_delta: int = 0
    end_object: int = 0

    @classmethod
    def none(cls) -> LocationFilter:
        return cls(_T.NONE)

    @classmethod
    def next_object(cls) -> LocationFilter:
        return cls(_T.NEXT_OBJECT)

    @classmethod
    def relative_start(cls, groups_back: int) -> LocationFilter:
        return cls(_T.RELATIVE_START, groups_back)

    @classmethod
    def absolute_start(cls, group: int, obj: int = 0) -> LocationFilter:
        return cls(_T.ABSOLUTE_START, group, obj)

    @classmethod
    def absolute_group_end(cls, group: int, obj: int, end_group: int) -> LocationFilter:
        """Start {group, obj}; end = all of ``end_group`` (an absolute Group ID)."""
        return cls(_T.ABSOLUTE_START_GROUP_END, group, obj, end_group - group)

    @classmethod
    def absolute_range(cls, start: Location, end: Location) -> LocationFilter:
        return cls(_T.ABSOLUTE_RANGE, start[0], start[1], end[0] - start[0], end[1])

    @property
    def is_absolute(self) -> bool:
        """The filter names its start itself (it does not depend on the Largest Object)."""
        return self.type in _ABSOLUTE

    @property
    def end_group(self) -> int:
        return self.start_group + self.end_group_delta


def encode_location_filter(f: LocationFilter) -> bytes:
    t = _T(f.type)
    fields = (f.start_group, f.start_object, f.end_group_delta, f.end_object)[: _nfields(t)]
    if f.start_group + f.end_group_delta > MAX_VI64:
        raise ValueError("StartGroup + EndGroupDelta exceeds 2^64-1")
    return b"".join(encode_vi64(v) for v in (t, *fields))


def decode_location_filter(r: Reader) -> LocationFilter:
    code = r.vi64()
    try:
        t = _T(code)
    except ValueError:
        raise protocol_violation(f"unknown Location Filter Type {code}") from None
    fields = [r.vi64() for _ in range(_nfields(t))]
    f = LocationFilter(t, *fields)
    if f.start_group + f.end_group_delta > MAX_VI64:
        raise protocol_violation("StartGroup + EndGroupDelta exceeds 2^64-1")
    return f


def _start(f: LocationFilter | None, largest: Location | None) -> Location:
    if f is None or f.type == _T.NONE:
        return Location(0, 0)
    if f.type == _T.RELATIVE_START:
        if largest is None:
            return Location(0, 0)
        return Location(min(max(largest.group + 1 - f.start_group, 0), MAX_VI64), 0)
    if f.type == _T.NEXT_OBJECT:
        if largest is None:
            return Location(0, 0)
        return Location(largest.group, largest.object + 1)
    return Location(f.start_group, f.start_object)


def _explicit_end(f: LocationFilter | None) -> Location | None:
    if f is None:
        return None
    if f.type == _T.ABSOLUTE_START_GROUP_END:
        return Location(f.end_group, MAX_VI64)  # "every Object of the Group"
    if f.type == _T.ABSOLUTE_RANGE:
        return Location(f.end_group, f.end_object)
    return None


def resolve_subscription_range(
    f: LocationFilter | None, largest: Location | None
) -> LocationRange:
    """Subscription column of §6.3: start per filter, end only for 0x03/0x04.

    For 0x03 the end is ``{end_group, 2^64-1}``: every Object of that Group.
    """
    return LocationRange(_start(f, largest), _explicit_end(f))


def resolve_fetch_range(f: LocationFilter | None, largest: Location | None) -> LocationRange | None:
    """FETCH / fill column of §6.3: the end is clipped to the Largest Object L.

    Returns None when nothing was published (L absent): a FETCH then fails with
    INVALID_RANGE and no fill stream is opened. Check ``.is_empty`` for start > end (e.g. Next
    Object, or a start beyond L). For 0x03 clipped by nothing, the end is ``{G, 2^64-1}``;
    the responder reports the last Location it knows in Group G in FETCH_OK.
    """
    if largest is None:
        return None
    end = _explicit_end(f)
    return LocationRange(_start(f, largest), largest if end is None else min(end, largest))
