"""Storage tiers for the relay: memory (cachetools) and LMDB (completed tracks).

`storage.interface` holds the record types and the contract; `storage.memory` the byte-bounded
LRU tier; `storage.lmdb_store` the durable tier (whole tracks only); `storage.tiered` combines
them the way the relay uses them. Nothing here imports from `relay/`.
"""

from storage.interface import (
    OBJECT_MAX,
    AppendResult,
    ConflictError,
    GroupOrder,
    IncompleteTrackError,
    Location,
    ObjectStatus,
    Span,
    SpanKind,
    StorageError,
    StorageFullError,
    StoredObject,
    Tier,
    TrackInfo,
    TrackKey,
    TrackTooLargeError,
)
from storage.lmdb_store import LmdbReadSession, LmdbStore
from storage.memory import Lease, MemoryStore
from storage.tiered import TieredReader, TieredStore

__all__ = [
    "OBJECT_MAX",
    "AppendResult",
    "ConflictError",
    "GroupOrder",
    "IncompleteTrackError",
    "Lease",
    "LmdbReadSession",
    "LmdbStore",
    "Location",
    "MemoryStore",
    "ObjectStatus",
    "Span",
    "SpanKind",
    "StorageError",
    "StorageFullError",
    "StoredObject",
    "Tier",
    "TieredReader",
    "TieredStore",
    "TrackInfo",
    "TrackKey",
    "TrackTooLargeError",
]
