"""Per-scope byte quotas of the two tiers, so one tenant cannot evict another's caches.

A scope is one field of the Track Namespace (KVCS: field 1, the Scope ID); the relay says
which when it builds the quotas, so this module knows nothing of any profile. Each scope may
hold at most its quota per tier (an override per Scope ID, else the default; None: no bound
of its own). Over it, the scope's own least recently used data goes first; and when a tier
as a whole is full, a scope that still holds something of its own gives that up before
anybody else's (only a scope holding nothing in that tier falls back to the global LRU).

Single-threaded per tier, like the tiers themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from storage.interface import TrackKey

MEMORY = "memory"
LMDB = "lmdb"


@dataclass(frozen=True)
class ScopeQuotas:
    memory_default: int | None = None
    lmdb_default: int | None = None
    # Scope ID -> (memory quota, LMDB quota); None in a slot: that tier's default
    overrides: Mapping[bytes, tuple[int | None, int | None]] = field(default_factory=dict)
    scope_field: int = 1

    def scope_of(self, track: TrackKey) -> bytes:
        ns = track[0]
        return bytes(ns[self.scope_field]) if len(ns) > self.scope_field else b""

    def limit(self, scope: bytes, tier: str) -> int | None:
        slot = 0 if tier == MEMORY else 1
        own = self.overrides.get(scope)
        if own is not None and own[slot] is not None:
            return own[slot]
        return self.default(tier)

    def default(self, tier: str) -> int | None:
        """The quota of each scope without one of its own."""
        return self.memory_default if tier == MEMORY else self.lmdb_default

    def active(self, tier: str) -> bool:
        """Any bound at all for ``tier`` (else the tier keeps no per-scope books)."""
        slot = 0 if tier == MEMORY else 1
        return self.default(tier) is not None or \
            any(v[slot] is not None for v in self.overrides.values())


@dataclass
class ScopeBooks:
    """What one tier holds and evicted per scope."""

    held: dict[bytes, int] = field(default_factory=dict)
    evictions: dict[bytes, int] = field(default_factory=dict)

    def add(self, scope: bytes, n: int) -> None:
        self.held[scope] = self.held.get(scope, 0) + n
        if not self.held[scope]:
            del self.held[scope]

    def evicted(self, scope: bytes) -> None:
        self.evictions[scope] = self.evictions.get(scope, 0) + 1


__all__ = ["LMDB", "MEMORY", "ScopeBooks", "ScopeQuotas"]
