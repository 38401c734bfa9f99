"""Data-plane values (§11): stream headers and Objects as parsed or to be encoded.

Payloads are ``memoryview`` slices of the received buffers (or ``bytes`` when a payload had to
be joined from several chunks): never copied when avoidable, never interpreted. Object
``properties`` are the raw Key-Value-Pair bytes (``None`` when the stream/Object carries no
Properties field), kept byte-exact for caches; decode with ``kvps_from_bytes``.

Object types are mutable slotted dataclasses for speed; treat them as immutable.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..codes import EndOfRangeType, ObjectStatus, SubgroupFlag, SubgroupIdMode
from ..primitives import Location

__all__ = [
    "EndOfRange",
    "FetchHeader",
    "FetchObject",
    "ObjectDatagram",
    "Payload",
    "SubgroupHeader",
    "SubgroupObject",
]

Payload = bytes | memoryview


@dataclass(frozen=True)
class SubgroupHeader:
    """SUBGROUP_HEADER (§11.2).

    ``subgroup_id_mode`` None picks ZERO for Subgroup 0 and EXPLICIT otherwise. In mode
    FIRST_OBJECT_ID the Subgroup ID is the first Object's ID: ``subgroup_id`` is None on a
    parsed header (the parser exposes it once the first Object arrives) and ignored on encode.
    ``publisher_priority`` None = DEFAULT_PRIORITY (no field on the wire).
    """

    track_alias: int
    group_id: int
    subgroup_id: int | None = 0
    publisher_priority: int | None = 128
    first_object: bool = False
    end_of_group: bool = False
    has_properties: bool = False
    subgroup_id_mode: SubgroupIdMode | None = None

    def __post_init__(self) -> None:
        if self.subgroup_id_mode is None:
            mode = SubgroupIdMode.ZERO if self.subgroup_id == 0 else SubgroupIdMode.EXPLICIT
            object.__setattr__(self, "subgroup_id_mode", mode)

    @property
    def type_flags(self) -> int:
        f = SubgroupFlag.SUBGROUP_HEADER | (int(self.subgroup_id_mode) << 1)  # type: ignore[arg-type]
        if self.has_properties:
            f |= SubgroupFlag.PROPERTIES
        if self.end_of_group:
            f |= SubgroupFlag.END_OF_GROUP
        if self.publisher_priority is None:
            f |= SubgroupFlag.DEFAULT_PRIORITY
        if self.first_object:
            f |= SubgroupFlag.FIRST_OBJECT
        return int(f)


@dataclass(slots=True)
class SubgroupObject:
    """An Object on a subgroup stream. Non-Normal ``status`` ⇒ empty payload, no Properties
    content (``properties`` is ``b""`` on a PROPERTIES stream, else None)."""

    object_id: int
    payload: Payload = b""
    status: ObjectStatus = ObjectStatus.NORMAL
    properties: bytes | None = None


@dataclass(frozen=True, slots=True)
class FetchHeader:
    """FETCH_HEADER (§11.6): the FETCH's Request ID, or a fill's (SUBSCRIBE / REQUEST_UPDATE)."""

    request_id: int


@dataclass(slots=True)
class FetchObject:
    """An Object on a fetch / fill stream. ``subgroup_id`` None = Datagram preference."""

    group_id: int
    subgroup_id: int | None
    object_id: int
    publisher_priority: int
    payload: Payload = b""
    properties: bytes | None = None

    @property
    def location(self) -> Location:
        return Location(self.group_id, self.object_id)


@dataclass(frozen=True, slots=True)
class EndOfRange:
    """End of Range marker (§11.7): every Location after the previous element up to and
    including ``{group_id, object_id}`` is non-existent / unknown / timed out."""

    type: EndOfRangeType
    group_id: int
    object_id: int

    @property
    def location(self) -> Location:
        return Location(self.group_id, self.object_id)


@dataclass(slots=True)
class ObjectDatagram:
    """OBJECT_DATAGRAM (§11.8). ``status`` None = payload form; otherwise the STATUS form
    (no payload). ``publisher_priority`` None = DEFAULT_PRIORITY."""

    track_alias: int
    group_id: int
    object_id: int
    publisher_priority: int | None = 128
    payload: Payload = b""
    status: ObjectStatus | None = None
    properties: bytes | None = None
    end_of_group: bool = False
