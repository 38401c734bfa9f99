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
from .errors import RequestError, SessionError
from .kvp import kvps_from_bytes
from .reader import Reader
from .vi64 import MAX_VI64, encode_vi64

__all__ = [
    "RANGE_FILTER_TYPES",
    "ObjectFilter",
    "Range",
    "RangeFilter",
    "decode_range_filter",
    "encode_range_filter",
    "evaluate_range_filters",
    "override_filters",
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


def override_filters(base: Iterable[RangeFilter], over: Iterable[RangeFilter]
                     ) -> tuple[RangeFilter, ...]:
    """``base`` with every filter type that ``over`` carries replaced by ``over``'s filters of
    that type; a zero-length one only removes the type. How REQUEST_UPDATE changes a
    subscription's filters (§6.5) and how FILL_PARAMETERS inherit them (§6.4)."""
    over = tuple(over)
    replaced = {f.type for f in over}
    kept = [f for f in base if f.type not in replaced]
    return (*kept, *(f for f in over if f.set_id is not None))


class ObjectFilter:
    """The Range filters of one subscription, fill or FETCH, ready to test Objects (§6.5).

    Built once per request; ``passes`` is called per Object. An Object's Properties are
    decoded only when an OBJECT_PROPERTY_FILTER needs them (the relay never looks into
    payloads; Properties are header fields).
    """

    __slots__ = ("_filters", "_needs_properties")

    def __init__(self, filters: Iterable[RangeFilter]) -> None:
        self._filters = tuple(f for f in filters if f.set_id is not None
                              and f.type != ParameterType.TRACK_PROPERTY_FILTER)
        self._needs_properties = any(f.type == ParameterType.OBJECT_PROPERTY_FILTER
                                     for f in self._filters)

    @classmethod
    def of(cls, filters: Iterable[RangeFilter]) -> ObjectFilter | None:
        """The filter, or None when nothing is filtered (the common case costs nothing)."""
        f = cls(filters)
        return f if f._filters else None

    def passes(self, subgroup_id: int | None, object_id: int, priority: int,
               properties: bytes | memoryview | None = None) -> bool:
        props: dict[int, int] | None = None
        if self._needs_properties and properties:
            props = {}
            try:
                for kv in kvps_from_bytes(properties):
                    if isinstance(kv.value, int):
                        props.setdefault(kv.type, kv.value)
            except (SessionError, ValueError, IndexError):
                props = None  # undecodable Properties hold no value to match
        return evaluate_range_filters(self._filters, subgroup_id=subgroup_id,
                                      object_id=object_id, priority=priority,
                                      properties=props)

    def object_ids(self) -> list[tuple[int, int | None]] | None:
        """Object-ID ranges outside which no Object can pass, or None if there are none:
        a store walk can skip everything else (no unknown spans reported for it either).
        That holds only when every SetID group has an OBJECTID_FILTER (groups are ORed)."""
        by_set: dict[int, RangeFilter | None] = {}
        for f in self._filters:
            if f.type == ParameterType.OBJECTID_FILTER:
                by_set[f.set_id] = f  # type: ignore[index]
            else:
                by_set.setdefault(f.set_id, None)  # type: ignore[arg-type]
        if not by_set or any(f is None for f in by_set.values()):
            return None
        return [(r.start, r.end) for f in by_set.values() if f is not None for r in f.ranges]
