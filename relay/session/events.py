"""What a subscriber receives: Objects and the stream/request events around them.

A ``Subscription`` yields, in arrival order per stream: ``ReceivedObject`` (from subgroup
streams and the fill fetch stream), ``StreamEnded`` (a subgroup or fill stream ended: FIN or
reset), ``RangeMarker`` (End of Range on a fill) and finally ``SubscriptionDone``. A
``FetchResponse`` yields ``ReceivedObject`` and ``RangeMarker`` until its stream's FIN.
Payloads are ``memoryview``s, never interpreted. The transport hands received chunks over as
they came (no copy); the stream's parser joins the chunks of one read only when they hold an
Object boundary (its Objects then view that buffer) and joins an Object spanning reads once,
to its exact size. A byte is copied at most twice on the way in, the bulk of a large Object
once (``relay/moqt/dataplane/chunked.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from relay.moqt.codes import EndOfRangeType, ObjectStatus
from relay.moqt.dataplane.objects import SubgroupHeader
from relay.moqt.primitives import Location


class Source(Enum):
    SUBGROUP = "subgroup"  # a live subgroup stream of a subscription
    FILL = "fill"  # the fill fetch stream of a subscription (§9)
    FETCH = "fetch"  # the fetch stream of a FETCH
    DATAGRAM = "datagram"


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """Identity of the data stream an Object came on (one per QUIC stream)."""

    stream_id: int
    source: Source
    header: SubgroupHeader | None = None  # subgroup streams only


@dataclass(frozen=True, slots=True)
class ReceivedObject:
    group: int
    subgroup: int
    object_id: int
    priority: int
    status: ObjectStatus
    properties: bytes | None
    payload: memoryview | bytes
    stream: StreamInfo

    @property
    def location(self) -> Location:
        return Location(self.group, self.object_id)


@dataclass(frozen=True, slots=True)
class RangeMarker:
    """End of Non-Existent / Unknown / Timed-Out Range: every Location after the previous
    element up to and including ``end`` has that status (§11.7)."""

    type: EndOfRangeType
    end: Location
    stream: StreamInfo


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """A subgroup or fill stream ended: ``fin`` True for FIN, else ``reset_code``."""

    stream: StreamInfo
    fin: bool
    reset_code: int | None = None
    last_object_id: int | None = None


@dataclass(frozen=True, slots=True)
class SubscriptionDone:
    """PUBLISH_DONE received (and the announced streams seen, or the linger timer ran out)."""

    status: int
    stream_count: int
    reason: str


@dataclass(frozen=True, slots=True)
class NamespaceEvent:
    """NAMESPACE (``active`` True) or NAMESPACE_DONE for ``prefix + suffix``."""

    suffix: tuple[bytes, ...]
    namespace: tuple[bytes, ...]
    active: bool


SubscriptionEvent = ReceivedObject | RangeMarker | StreamEnded | SubscriptionDone
FetchEvent = ReceivedObject | RangeMarker
