"""Record types and the read/write contract shared by the storage tiers.

The storage package sits *below* the relay core: of `relay/` it imports only the MOQT
vocabulary of the sans-IO codec (Location, Object Status, Group Order, the vi64 bound), so the
relay and its store speak one vocabulary and nothing converts between them
(tests/test_layers.py).

Invariants every tier keeps:

* An Object, once stored, never changes (MOQT §11.1): a duplicate with different fields is a
  `ConflictError`, an identical duplicate is ignored.
* Payloads and properties are opaque bytes; they are stored and returned as given. Reads return
  the stored objects (memory) or memoryviews into the database (LMDB) — no payload copies.
* Existence knowledge comes only from End of Group / End of Track status objects. Anything the
  store does not hold and cannot prove absent is *unknown*; eviction makes data unknown, never
  non-existent (MOQT §14.1).
* A walk (`walk`) lists, in stream order, every Location of a requested range as either a stored
  Object or a `Span` saying the Locations in it are unknown or known not to exist — exactly what a
  FETCH or fill needs to decide between "send", "skip" and "ask upstream / End of Range marker".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple, TypeAlias

# re-exported: the tiers take them from here
from relay.moqt.codes import GroupOrder as GroupOrder
from relay.moqt.codes import ObjectStatus
from relay.moqt.primitives import Location
from relay.moqt.vi64 import MAX_VI64

OBJECT_MAX = MAX_VI64
"""Largest vi64 value: an end Location {g, OBJECT_MAX} means "up to the end of Group g"."""



class SpanKind(IntEnum):
    """What a walk knows about Locations it holds no Object for."""

    UNKNOWN = 0
    NON_EXISTENT = 1


class Tier(IntEnum):
    """Which tier served a walk item (the relay counts hits per tier)."""

    NONE = 0  # a Span: nothing was served
    MEMORY = 1
    LMDB = 2


Namespace: TypeAlias = tuple[bytes, ...]
TrackKey: TypeAlias = tuple[Namespace, bytes]
"""(Track Namespace fields, Track Name): the Full Track Name, raw octets."""

Buffer: TypeAlias = bytes | memoryview


class StoredObject(NamedTuple):
    """One cached Object with every field §14.1 requires a cache to keep.

    A NamedTuple rather than a frozen dataclass: reads build one per Object, and tuple
    construction is ~3x cheaper. Compare with `same_fields` (bytes vs memoryview by content).
    """

    group: int
    subgroup: int
    object_id: int
    priority: int
    status: int = ObjectStatus.NORMAL
    properties: Buffer = b""
    payload: Buffer = b""
    datagram: bool = False

    @property
    def location(self) -> Location:
        return Location(self.group, self.object_id)

    @property
    def nbytes(self) -> int:
        """Payload plus properties bytes (what byte accounting charges, before overhead)."""
        return len(self.payload) + len(self.properties)

    def same_fields(self, other: StoredObject) -> bool:
        """True if `other` is byte-identical (memoryviews and bytes compare by content)."""
        return (
            self.group == other.group
            and self.object_id == other.object_id
            and self.subgroup == other.subgroup
            and self.priority == other.priority
            and self.status == other.status
            and self.datagram == other.datagram
            and self.properties == other.properties
            and self.payload == other.payload
        )

    def copy(self) -> StoredObject:
        """A copy whose buffers are `bytes`, safe to keep after a read session ends."""
        if isinstance(self.payload, bytes) and isinstance(self.properties, bytes):
            return self
        return StoredObject(self.group, self.subgroup, self.object_id, self.priority,
                            self.status, bytes(self.properties), bytes(self.payload),
                            self.datagram)


class Span(NamedTuple):
    """Locations a walk holds no Object for, from `start` to `end` inclusive *in stream order*.

    With ascending Group order that is the lexicographic interval [start, end]; with descending
    order `start.group >= end.group` and the span covers every Location the walk would have
    visited between the two. Only Locations that pass the request's Object-ID ranges are meant.
    The end is exactly where an End of Range marker (§11.7) for this span goes.
    """

    kind: SpanKind
    start: Location
    end: Location


WalkItem: TypeAlias = StoredObject | Span

IdRanges: TypeAlias = Sequence[tuple[int, int | None]]
"""OBJECTID_FILTER ranges as decoded: inclusive (start, end), end None = open (§6.5)."""


class AppendResult(IntEnum):
    STORED = 0
    DUPLICATE = 1  # identical Object already held: ignored
    NON_EXISTENT = 2  # Location already known not to exist (§14.1: neither cache nor forward)
    NOT_KEPT = 3  # accepted but larger than the tier's capacity, so not retained


class StorageError(Exception):
    """Base class of every storage error."""


class ConflictError(StorageError):
    """An Object contradicts what is stored (different bytes, Object past a Group's/Track's end).

    The relay treats this as a Malformed Track (§14.2); the store is left unchanged.
    """


class IncompleteTrackError(StorageError):
    """A commit to the durable tier was refused: no End of Track, a gap, or an aborted track."""


class StorageFullError(StorageError):
    """The durable tier cannot take more data (LMDB map at its limit, or the disk is full).

    The caller keeps serving from memory; nothing partial was written. Worth retrying: room
    may be made (eviction, expiry, a freed disk, read sessions that close), unless it is a
    `TrackTooLargeError`.
    """


class TrackTooLargeError(StorageFullError):
    """The track is larger than the tier's capacity or its scope's quota: no retry helps."""


@dataclass(frozen=True, slots=True)
class TrackInfo:
    """What a tier knows about a track as a whole."""

    largest: Location | None
    end_of_track: Location | None
    complete: bool
    nbytes: int
    groups: int


def normalize_ranges(ranges: IdRanges | None) -> list[tuple[int, int]]:
    """Sorted, merged, closed Object-ID ranges; None (no filter) means every Object ID."""
    if ranges is None:
        return [(0, OBJECT_MAX)]
    closed = sorted((lo, OBJECT_MAX if hi is None else hi) for lo, hi in ranges)
    out: list[tuple[int, int]] = []
    for lo, hi in closed:
        if hi < lo:
            continue
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out
