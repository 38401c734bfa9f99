"""Range filters (§6.5): SUBGROUP_FILTER, OBJECTID_FILTER, PRIORITY_FILTER,
OBJECT_PROPERTY_FILTER, TRACK_PROPERTY_FILTER — value layout and evaluation.

Problems with a filter's content are request errors (REQUEST_ERROR INVALID_FILTER); problems
with the framing around it (a Length running past the message) stay session errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from .codes import ParameterType, RequestErrorCode
from .errors import RequestError
from .reader import Reader
from .vi64 import MAX_VI64, encode_vi64

__all__ = [
    "RANGE_FILTER_TYPES",
    "Range",
    "RangeFilter",
    "decode_range_filter",
    "encode_range_filter",
    "evaluate_range_filters",
]

RANGE_FILTER_TYPES = frozenset(
    {
        ParameterType.SUBGROUP_FILTER,
        ParameterType.OBJECTID_FILTER,
        ParameterType.PRIORITY_FILTER,
        ParameterType.OBJECT_PROPERTY_FILTER,
        ParameterType.TRACK_PROPERTY_FILTER,
    }
)
_WITH_PROPERTY_TYPE = frozenset(
    {ParameterType.OBJECT_PROPERTY_FILTER, ParameterType.TRACK_PROPERTY_FILTER}
)


class Range(NamedTuple):
    """Inclusive ``[start, end]``; ``end`` None = open (only the last Range may be open)."""

    start: int
    end: int | None = None

    def __contains__(self, v: object) -> bool:
        return isinstance(v, int) and self.start <= v and (self.end is None or v <= self.end)


def _invalid(reason: str) -> RequestError:
    return RequestError(RequestErrorCode.INVALID_FILTER, reason)


@dataclass(frozen=True, slots=True)
class RangeFilter:
    """One Range-filter parameter.

    ``set_id`` None encodes the zero-length value: "no filter" (in REQUEST_UPDATE: remove this
    filter type). ``property_type`` is set exactly for OBJECT_/TRACK_PROPERTY_FILTER.
    """

    type: ParameterType
    set_id: int | None = 0
    ranges: tuple[Range, ...] = ()
    property_type: int | None = None

    @classmethod
    def clear(cls, type: ParameterType) -> RangeFilter:
        return cls(type, None)

    @property
    def key(self) -> tuple[int, int | None, int | None]:
        """(Type, SetID, Property Type): must be unique within one parameter list."""
        return (self.type, self.set_id, self.property_type)

    def matches(self, value: int) -> bool:
        return any(value in r for r in self.ranges)


def encode_range_filter(f: RangeFilter) -> bytes:
    """The value of the parameter, without its Length."""
    if f.set_id is None:
        return b""
    if not 0 <= f.set_id <= 255:
        raise ValueError("SetID is one byte")
    out = [bytes((f.set_id,))]
    if f.type in _WITH_PROPERTY_TYPE:
        if f.property_type is None or f.property_type & 1:
            raise ValueError("property filters need an even Property Type")
        out.append(encode_vi64(f.property_type))
    elif f.property_type is not None:
        raise ValueError("only property filters carry a Property Type")
    prev_end = 0
    for i, (start, end) in enumerate(f.ranges):
        if start < prev_end:
            raise ValueError("Ranges must be ascending and not overlap backwards")
        out.append(encode_vi64(start - prev_end))
        if end is None:
            if i != len(f.ranges) - 1:
                raise ValueError("only the last Range may be open")
            break
        if end < start:
            raise ValueError("Range end below its start")
        out.append(encode_vi64(end - start))
        prev_end = end
    return b"".join(out)


def decode_range_filter(ptype: ParameterType, r: Reader) -> RangeFilter:
    """Decode a value bounded by ``r`` (its Length already applied)."""
    if r.at_end():
        return RangeFilter(ptype, None)
    set_id = r.u8()
    prop = None
    if ptype in _WITH_PROPERTY_TYPE:
        if r.at_end():
            raise _invalid("property filter without a Property Type")
        prop = r.vi64()
        if prop & 1:
            raise _invalid("odd Property Type in a property filter")
    values: list[int] = []
    while not r.at_end():
        values.append(r.vi64())
    ranges: list[Range] = []
    prev_end = 0
    for i in range(0, len(values), 2):
        start = prev_end + values[i]
        if start > MAX_VI64:
            raise _invalid("Range start exceeds 2^64-1")
        if i + 1 < len(values):
            end: int | None = start + values[i + 1]
            if end > MAX_VI64:  # type: ignore[operator]
                raise _invalid("Range end exceeds 2^64-1")
            prev_end = end  # type: ignore[assignment]
        else:
            end = None
        if ptype == ParameterType.PRIORITY_FILTER and (
            start > 255 or (end is not None and end > 255)
        ):
            raise _invalid("PRIORITY_FILTER value above 255")
        ranges.append(Range(start, end))
    return RangeFilter(ptype, set_id, tuple(ranges), prop)


def evaluate_range_filters(
    filters: Iterable[RangeFilter],
    *,
    subgroup_id: int | None,
    object_id: int,
    priority: int,
    properties: Mapping[int, int] | None = None,
) -> bool:
    """Does an Object pass the Range filters? Same-SetID filters AND, SetID groups OR (§6.5).

    No (active) filter → pass. An Object without a Subgroup (datagram preference) never
    matches a SUBGROUP_FILTER, nor does an Object lacking the filtered property match an
    OBJECT_PROPERTY_FILTER. TRACK_PROPERTY_FILTER concerns SUBSCRIBE_TRACKS, not Objects, and
    is ignored here.
    """
    groups: dict[int, bool] = {}
    for f in filters:
        if f.set_id is None or f.type == ParameterType.TRACK_PROPERTY_FILTER:
            continue
        if f.type == ParameterType.SUBGROUP_FILTER:
            ok = subgroup_id is not None and f.matches(subgroup_id)
        elif f.type == ParameterType.OBJECTID_FILTER:
            ok = f.matches(object_id)
        elif f.type == ParameterType.PRIORITY_FILTER:
            ok = f.matches(priority)
        else:
            v = None if properties is None else properties.get(f.property_type)  # type: ignore[arg-type]
            ok = v is not None and f.matches(v)
        groups[f.set_id] = groups.get(f.set_id, True) and ok
    return not groups or any(groups.values())
