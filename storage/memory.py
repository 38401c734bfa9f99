"""Memory tier: a byte-bounded LRU over (track, Group) built on `cachetools.LRUCache`.

Invariants:

* Size of a Group = its payload and properties bytes + `OBJECT_OVERHEAD` per Object +
  `GROUP_OVERHEAD`; the sum over held Groups stays within `capacity` except for Groups pinned by a
  `Lease` (plus at most the one Group being appended to). Pinned data is never evicted, so a
  fill walking a live track cannot lose the Objects under it; the relay bounds what it pins.
* The unit of eviction is a Group, with its End of Group knowledge: after eviction every
  Location of that Group is *unknown* again (never "non-existent"). Track-level knowledge
  (Largest Object, End of Track) outlives its Groups until the track holds no Group and no pin.
* Appending and reading a Group (FETCH, fill hit) both count as a use for LRU.
* Payloads are kept as given (no copy). The relay hands in memoryviews of its receive
  buffers; such a view keeps its whole underlying buffer alive while only the view's bytes
  are charged, so what a Group really holds can exceed its charge by the rest of those
  buffers (the transport's receive chunks: bounded by its window, not by this tier).
* A track with a maximum cache duration (MOQT MAX_CACHE_DURATION, `set_cache_duration`) has
  its Groups expire that long after their first Object arrived: an expired Group is dropped
  when next touched, as if evicted (its Locations are unknown again, pins or not), so nothing
  is ever read from it. A Group's time is its first Object's, so its later Objects expire a
  little early, never late.

Single-threaded (the relay's event loop); no locking.
"""

from __future__ import annotations

import itertools
import time
from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from cachetools import Cache, LRUCache

from storage.interface import (
    OBJECT_MAX,
    AppendResult,
    ConflictError,
    GroupOrder,
    IdRanges,
    Location,
    ObjectStatus,
    StoredObject,
    TrackInfo,
    TrackKey,
    WalkItem,
    normalize_ranges,
)
from storage.quota import MEMORY, ScopeBooks, ScopeQuotas
from storage.walk import read_objects, walk_range

# A StoredObject plus its dict / list slots measures ~140 bytes with tracemalloc on CPython
# 3.11 (tests/storage/test_storage_memory.py checks the bound); charged with headroom for large
# int IDs and memoryview payloads. A Group adds its object, dict, list and LRU node.
OBJECT_OVERHEAD = 256
GROUP_OVERHEAD = 1024

_GroupKey = tuple["_TrackState", int]  # the state object hashes by identity: cheap


class MemoryGroup:
    """The Objects of one Group, sorted by Object ID."""

    __slots__ = ("end_of_group", "ids", "nbytes", "objects", "received_at")

    def __init__(self, received_at: float = 0.0) -> None:
        self.ids: list[int] = []
        self.objects: dict[int, StoredObject] = {}
        self.end_of_group: int | None = None
        self.nbytes = GROUP_OVERHEAD
        self.received_at = received_at  # when its first Object arrived (store clock)

    def objects_between(self, lo: int, hi: int) -> Iterator[StoredObject]:
        ids, objects = self.ids, self.objects
        n = len(ids)
        if n and ids[-1] == n - 1:  # dense 0..n-1: index by ID, no search
            i, j = max(lo, 0), min(hi, n - 1) + 1
        else:
            i, j = bisect_left(ids, lo), bisect_right(ids, hi)
        for k in range(i, j):
            yield objects[ids[k]]

    def whole(self, end_of_track: Location | None, group: int) -> bool:
        """True if every Object of this Group is held and its end is known."""
        if self.end_of_group is not None:
            return self.dense_below(self.end_of_group + 1)
        if end_of_track is not None and end_of_track.group == group:
            return self.dense_below(end_of_track.object + 1)
        return False

    def dense_below(self, n: int) -> bool:
        """True if Objects 0..n-1 are all held."""
        ids = self.ids
        return n == 0 or (len(ids) >= n and ids[n - 1] == n - 1)


class _TrackState:
    __slots__ = ("aborted", "end_of_track", "groups", "largest", "max_duration", "pins",
                 "scope", "track")

    def __init__(self, track: TrackKey, scope: bytes | None = None) -> None:
        self.track = track
        self.scope = scope  # None: no per-scope quotas, no books kept
        self.max_duration: float | None = None  # seconds a Group may be served from cache
        self.groups: list[int] = []  # sorted IDs of held Groups (cached or parked)
        self.largest: Location | None = None
        self.end_of_track: StoredObject | None = None
        self.aborted = False
        self.pins: dict[int, tuple[int, int]] = {}  # lease id -> (first, last Group)

    def pinned(self, group: int) -> bool:
        return any(a <= group <= b for a, b in self.pins.values())


class Lease:
    """Keeps a track's Groups [first, last] in memory until released (use as a context manager)."""

    __slots__ = ("_id", "_store", "track")

    def __init__(self, store: MemoryStore, track: TrackKey, lease_id: int) -> None:
        self._store: MemoryStore | None = store
        self.track = track
        self._id = lease_id

    def release(self) -> None:
        if self._store is not None:
            self._store._unpin(self.track, self._id)
            self._store = None

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class _GroupCache(LRUCache[_GroupKey, MemoryGroup]):
    """LRUCache that tells its owner about every eviction (to park pinned Groups)."""

    def __init__(self, maxsize: int, owner: MemoryStore) -> None:
        super().__init__(maxsize, getsizeof=_sizeof)
        self._owner = owner

    def popitem(self) -> tuple[_GroupKey, MemoryGroup]:
        key = self._owner._own_victim()
        if key is None:
            key, grp = super().popitem()
        else:
            grp = self.pop(key)
        self._owner._evicted(key, grp)
        return key, grp


def _sizeof(grp: MemoryGroup) -> int:
    return grp.nbytes


class MemoryStore:
    """The memory tier. `capacity` is in bytes, overhead included."""

    def __init__(self, capacity: int, quotas: ScopeQuotas | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.capacity = capacity
        self._clock = clock
        self.quotas = quotas if quotas is not None and quotas.active(MEMORY) else None
        self.scopes = ScopeBooks()
        # per scope, its cached Groups least recently used first (only with quotas)
        self._scope_lru: dict[bytes, OrderedDict[_GroupKey, None]] = {}
        self._inserting: _GroupKey | None = None  # the Group being put (victim choice)
        self._cache = _GroupCache(capacity, self)
        self._parked: dict[_GroupKey, MemoryGroup] = {}  # pinned Groups pushed out of the LRU
        self._parked_bytes = 0
        self._tracks: dict[TrackKey, _TrackState] = {}
        self._durations: dict[TrackKey, float] = {}  # MAX_CACHE_DURATION per track (s)
        self._lease_ids = itertools.count(1)
        self.evicted_groups = 0
        self.evicted_bytes = 0
        self.expired_groups = 0

    # -- writing ---------------------------------------------------------------------------

    def append(self, track: TrackKey, obj: StoredObject) -> AppendResult:
        """Store one Object (status Objects included); see `AppendResult` and `ConflictError`."""
        st = self._tracks.get(track)
        if st is None:
            st = self._tracks[track] = self._new_state(track)
        loc = Location(obj.group, obj.object_id)
        key = (st, obj.group)
        grp = self._cache.get(key)  # also the LRU "use" of appending
        parked = grp is None and key in self._parked
        if parked:
            grp = self._parked[key]
        if grp is not None and self._expired(st, grp):
            # an Object arriving again after its Group expired starts the Group afresh
            self._drop_expired(st, grp, key)
            grp, parked = None, False
            if self._tracks.get(track) is not st:  # that was its last Group
                st = self._tracks[track] = self._new_state(track)
                key = (st, obj.group)
        try:
            verdict = self._check(st, grp, obj, loc)
        except ConflictError:
            if grp is None and not st.groups:
                self._maybe_forget(track, st)
            raise
        if verdict is not None:
            return verdict
        new = grp is None
        if grp is None:
            grp = MemoryGroup(self._clock())
            insort(st.groups, obj.group)
        oid = obj.object_id
        if not grp.ids or oid > grp.ids[-1]:
            grp.ids.append(oid)
        else:
            insort(grp.ids, oid)
        grp.objects[oid] = obj
        size = obj.nbytes + OBJECT_OVERHEAD
        grp.nbytes += size
        if obj.status == ObjectStatus.END_OF_GROUP:
            grp.end_of_group = oid
        elif obj.status == ObjectStatus.END_OF_TRACK:
            st.end_of_track = obj
        if st.largest is None or loc > st.largest:
            st.largest = loc
        if st.scope is not None:
            self.scopes.add(st.scope, size + (GROUP_OVERHEAD if new else 0))
        if parked:
            self._parked_bytes += size
            return AppendResult.STORED
        result = self._put(track, st, key, grp)
        if st.scope is not None and result is AppendResult.STORED:
            self._enforce_quota(st, key)
        return result

    def abort(self, track: TrackKey) -> None:
        """The track's publisher failed: keep serving what is held, never report it complete."""
        st = self._tracks.get(track)
        if st is None:
            st = self._tracks[track] = self._new_state(track)
        st.aborted = True

    def drop_track(self, track: TrackKey) -> None:
        """Forget the track entirely (pins and cache duration included)."""
        self._durations.pop(track, None)
        st = self._tracks.pop(track, None)
        if st is None:
            return
        for g in st.groups:
            key = (st, g)
            held = Cache.__getitem__(self._cache, key) if key in self._cache \
                else self._parked.get(key)
            if st.scope is not None and held is not None:
                self.scopes.add(st.scope, -held.nbytes)
                self._lru_drop(st, key)
            if key in self._cache:
                del self._cache[key]
            grp = self._parked.pop(key, None)
            if grp is not None:
                self._parked_bytes -= grp.nbytes

    def set_cache_duration(self, track: TrackKey, seconds: float | None) -> None:
        """The track's maximum cache duration (None: none); Groups older than it expire.
        Kept until cleared, also while the track holds nothing (its Objects may come
        back), so the owner clears it when it forgets the track."""
        if seconds is None:
            self._durations.pop(track, None)
        else:
            self._durations[track] = seconds
        st = self._tracks.get(track)
        if st is not None:
            st.max_duration = seconds

    def first_received(self, track: TrackKey) -> float | None:
        """When the first Object of the oldest held Group arrived (store clock)."""
        st = self._tracks.get(track)
        times = [g.received_at for g in (self._group(track, i, touch=False)
                                         for i in list(st.groups)) if g is not None] \
            if st is not None else []
        return min(times) if times else None

    def discard_group(self, track: TrackKey, group: int) -> bool:
        """Drop one held Group as if evicted (its Locations become unknown); pins are ignored.
        Expiry uses it; tests use it to make a Group unknown without filling the tier."""
        st = self._tracks.get(track)
        if st is None:
            return False
        key = (st, group)
        grp = self._parked.pop(key, None)
        if grp is not None:
            self._parked_bytes -= grp.nbytes
        elif key in self._cache:
            grp = self._cache.pop(key)
            self._lru_drop(st, key)
        if grp is None:
            return False
        self._forget_group(track, st, group, grp)
        return True

    def pin(self, track: TrackKey, first_group: int = 0,
            last_group: int = OBJECT_MAX) -> Lease:
        """Keep Groups [first_group, last_group] of `track` (held now or later) from eviction."""
        st = self._tracks.get(track)
        if st is None:
            st = self._tracks[track] = self._new_state(track)
        lease_id = next(self._lease_ids)
        st.pins[lease_id] = (first_group, last_group)
        return Lease(self, track, lease_id)

    # -- reading ---------------------------------------------------------------------------

    def largest_object(self, track: TrackKey) -> Location | None:
        st = self._tracks.get(track)
        return st.largest if st is not None else None

    def known_final(self, track: TrackKey) -> Location | None:
        st = self._tracks.get(track)
        if st is None or st.end_of_track is None:
            return None
        return st.end_of_track.location

    def group_end(self, track: TrackKey, group: int) -> int | None:
        grp = self._group(track, group, touch=False)
        return grp.end_of_group if grp is not None else None

    def group(self, track: TrackKey, group: int, *, touch: bool = True) -> MemoryGroup | None:
        """The held Group (a read use for LRU unless touch=False)."""
        return self._group(track, group, touch=touch)

    def held_groups(self, track: TrackKey) -> list[int]:
        """Sorted IDs of the Groups held for `track`."""
        st = self._tracks.get(track)
        return list(st.groups) if st is not None else []

    def get(self, track: TrackKey, loc: Location) -> StoredObject | None:
        grp = self._group(track, loc.group, touch=True)
        return grp.objects.get(loc.object) if grp is not None else None

    def is_complete(self, track: TrackKey) -> bool:
        """End of Track held and every Location below it held (no gaps, nothing evicted)."""
        st = self._tracks.get(track)
        return st is not None and self._held_to_end(track, st)

    def holds_final_group(self, track: TrackKey) -> bool:
        """The Group of the End of Track is held (not only the End of Track remembered)."""
        st = self._tracks.get(track)
        eot = st.end_of_track if st is not None else None
        return eot is not None and st is not None and eot.group in st.groups

    def is_aborted(self, track: TrackKey) -> bool:
        st = self._tracks.get(track)
        return st is not None and st.aborted

    def complete_track(self, track: TrackKey) -> list[list[StoredObject]] | None:
        """Every Object of a complete, non-aborted track, by Group 0..L; None otherwise."""
        st = self._tracks.get(track)
        if st is None or st.aborted:
            return None
        return self._complete_groups(track, st)

    def read(self, track: TrackKey, start: Location, end: Location | None = None,
             order: GroupOrder = GroupOrder.ASCENDING,
             object_ids: IdRanges | None = None) -> Iterator[StoredObject]:
        st = self._tracks.get(track)
        if st is None or (end is None and st.largest is None):
            return iter(())
        return read_objects(start, end or st.largest, order,  # type: ignore[arg-type]
                            normalize_ranges(object_ids), list(st.groups),
                            lambda g: self._group(track, g, touch=True))

    def walk(self, track: TrackKey, start: Location, end: Location | None = None,
             order: GroupOrder = GroupOrder.ASCENDING, object_ids: IdRanges | None = None,
             include_status: bool = False) -> Iterator[WalkItem]:
        st = self._tracks.get(track)
        largest = st.largest if st is not None else None
        stop = end if end is not None else largest
        if stop is None:
            return iter(())
        if st is None:  # nothing known at all: the whole range is unknown
            return walk_range(start, stop, order, normalize_ranges(object_ids), [],
                              lambda g: None, None, include_status)
        eot = st.end_of_track.location if st.end_of_track is not None else None
        return walk_range(start, stop, order, normalize_ranges(object_ids), list(st.groups),
                          lambda g: self._group(track, g, touch=True), eot, include_status)

    def info(self, track: TrackKey) -> TrackInfo | None:
        st = self._tracks.get(track)
        if st is None:
            return None
        nbytes = 0
        for g in list(st.groups):
            grp = self._group(track, g, touch=False)
            if grp is not None:
                nbytes += grp.nbytes
        return TrackInfo(st.largest, self.known_final(track),
                         self._complete_groups(track, st) is not None, nbytes, len(st.groups))

    def tracks(self) -> list[TrackKey]:
        return list(self._tracks)

    @property
    def bytes_used(self) -> int:
        """Accounted bytes held, pinned Groups included."""
        return self._cache.currsize + self._parked_bytes

    def stats(self) -> dict[str, Any]:
        return {"bytes_used": self.bytes_used, "capacity": self.capacity,
                "groups": len(self._cache) + len(self._parked), "tracks": len(self._tracks),
                "pinned_bytes": self._parked_bytes, "evicted_groups": self.evicted_groups,
                "evicted_bytes": self.evicted_bytes, "expired_groups": self.expired_groups}

    # -- internals -------------------------------------------------------------------------

    def _group(self, track: TrackKey, group: int, *, touch: bool) -> MemoryGroup | None:
        st = self._tracks.get(track)
        if st is None:
            return None
        key = (st, group)
        cache = self._cache
        if key in cache:
            # LRUCache.__getitem__ is the LRU "use"; the base class lookup only peeks.
            grp = cache[key] if touch else Cache.__getitem__(cache, key)
            if st.max_duration is not None and self._expired(st, grp):
                self._drop_expired(st, grp, key)
                return None
            if touch and st.scope is not None:
                self._scope_lru[st.scope].move_to_end(key)
            return grp
        grp = self._parked.get(key)
        if grp is not None and st.max_duration is not None and self._expired(st, grp):
            self._drop_expired(st, grp, key)
            return None
        return grp

    def _expired(self, st: _TrackState, grp: MemoryGroup) -> bool:
        return st.max_duration is not None and \
            self._clock() - grp.received_at >= st.max_duration

    def _drop_expired(self, st: _TrackState, grp: MemoryGroup, key: _GroupKey) -> None:
        """MAX_CACHE_DURATION passed: the Group leaves the tier like an evicted one (its
        Locations are unknown again), pinned or not — it must not be served any more."""
        if self.discard_group(st.track, key[1]):
            self.expired_groups += 1

    def _check(self, st: _TrackState, grp: MemoryGroup | None, obj: StoredObject,
               loc: Location) -> AppendResult | None:
        """None if `obj` is new and consistent; else why it is not stored (or raise)."""
        old = grp.objects.get(obj.object_id) if grp is not None else None
        if old is not None:
            if old.same_fields(obj):
                return AppendResult.DUPLICATE
            raise ConflictError(f"Object {loc} differs from the cached one")
        eot = st.end_of_track
        if obj.status == ObjectStatus.END_OF_GROUP:
            if grp is not None and grp.end_of_group is not None:
                raise ConflictError(f"second End of Group in Group {obj.group}")
            if grp is not None and grp.ids and grp.ids[-1] > obj.object_id:
                raise ConflictError(f"End of Group {loc} below a cached Object")
            if eot is not None and loc >= eot.location:
                raise ConflictError(f"End of Group {loc} at or past End of Track")
            return None
        if obj.status == ObjectStatus.END_OF_TRACK:
            if eot is not None:
                # remembered while its Group is gone: the same one again is no news
                if eot.same_fields(obj):
                    return AppendResult.DUPLICATE
                raise ConflictError(f"second End of Track {loc} (first {eot.location})")
            if st.largest is not None and st.largest >= loc:
                raise ConflictError(f"End of Track {loc} at or below the Largest Object")
            if grp is not None and grp.end_of_group is not None:
                raise ConflictError(f"End of Track {loc} in a Group with End of Group")
            return None
        if obj.status != ObjectStatus.NORMAL:
            raise ConflictError(f"unknown Object Status {obj.status}")
        if eot is not None and loc == eot.location:  # (its Group was evicted)
            raise ConflictError(f"Object {loc} at the End of Track")
        if eot is not None and loc > eot.location:
            return AppendResult.NON_EXISTENT
        if grp is not None and grp.end_of_group is not None and obj.object_id > grp.end_of_group:
            return AppendResult.NON_EXISTENT
        return None

    def _put(self, track: TrackKey, st: _TrackState, key: _GroupKey,
             grp: MemoryGroup) -> AppendResult:
        cache = self._cache
        self._inserting = key
        try:
            cache[key] = grp  # re-set: cachetools sizes an entry only when it is set
        except ValueError:  # this one Group is larger than the whole capacity
            self._inserting = None
            self._lru_drop(st, key)
            if key in cache:
                del cache[key]
            if st.pinned(key[1]):
                self._parked[key] = grp
                self._parked_bytes += grp.nbytes
                return AppendResult.STORED
            self._forget_group(track, st, key[1], grp)
            return AppendResult.NOT_KEPT
        if st.scope is not None:
            lru = self._scope_lru.setdefault(st.scope, OrderedDict())
            lru[key] = None
            lru.move_to_end(key)
        # Pinned Groups parked outside the LRU still count against capacity.
        while self._parked_bytes and cache.currsize + self._parked_bytes > self.capacity \
                and len(cache) > 1:
            cache.popitem()
        self._inserting = None
        return AppendResult.STORED

    def _evicted(self, key: _GroupKey, grp: MemoryGroup) -> None:
        st, g = key
        track = st.track
        self._lru_drop(st, key)
        if st.pinned(g):
            self._parked[key] = grp
            self._parked_bytes += grp.nbytes
            return
        if st.scope is not None:
            self.scopes.evicted(st.scope)
        self.evicted_groups += 1
        self.evicted_bytes += grp.nbytes
        self._forget_group(track, st, g, grp)

    def _forget_group(self, track: TrackKey, st: _TrackState, g: int,
                      grp: MemoryGroup) -> None:
        if st.scope is not None:
            self.scopes.add(st.scope, -grp.nbytes)
        i = bisect_left(st.groups, g)
        if i < len(st.groups) and st.groups[i] == g:
            del st.groups[i]
        self._maybe_forget(track, st)

    def _maybe_forget(self, track: TrackKey, st: _TrackState) -> None:
        if not st.groups and not st.pins and self._tracks.get(track) is st:
            del self._tracks[track]

    def _unpin(self, track: TrackKey, lease_id: int) -> None:
        st = self._tracks.get(track)
        if st is None or st.pins.pop(lease_id, None) is None:
            return
        for g in list(st.groups):
            key = (st, g)
            grp = self._parked.get(key)
            if grp is None or st.pinned(g):
                continue
            del self._parked[key]
            self._parked_bytes -= grp.nbytes
            self._put(track, st, key, grp)
        if self.quotas is not None and st.scope is not None:
            # pins may have held the scope over its quota: back within it now
            self._enforce_quota(st, None)
        self._maybe_forget(track, st)

    # -- per-scope quotas (storage/quota.py) -----------------------------------------------

    def _new_state(self, track: TrackKey) -> _TrackState:
        st = _TrackState(track, self.quotas.scope_of(track) if self.quotas else None)
        st.max_duration = self._durations.get(track)
        return st

    def _lru_drop(self, st: _TrackState, key: _GroupKey) -> None:
        if st.scope is not None:
            lru = self._scope_lru.get(st.scope)
            if lru is not None:
                lru.pop(key, None)
                if not lru:
                    del self._scope_lru[st.scope]

    def _own_victim(self) -> _GroupKey | None:
        """When the tier is full: the inserting scope's LRU Group, so that it makes room
        from its own data; None (global LRU) when it holds nothing else."""
        key = self._inserting
        if key is None or key[0].scope is None:
            return None
        lru = self._scope_lru.get(key[0].scope, {})
        return next((k for k in lru if k != key), None)

    def _enforce_quota(self, st: _TrackState, key: _GroupKey | None) -> None:
        """Evict the scope's own LRU Groups (never ``key``, the one just written) until it
        is back within its quota."""
        assert self.quotas is not None and st.scope is not None
        limit = self.quotas.limit(st.scope, MEMORY)
        if limit is None:
            return
        while self.scopes.held.get(st.scope, 0) > limit:
            lru = self._scope_lru.get(st.scope, {})
            victim = next((k for k in lru if k != key), None)
            if victim is None:
                return
            self._evicted(victim, self._cache.pop(victim))

    def _held_to_end(self, track: TrackKey, st: _TrackState) -> bool:
        """End of Track known and every Location below it held. Asked per read of a
        served Track: it builds nothing (``_complete_groups`` builds the lists)."""
        eot = st.end_of_track
        if eot is None:
            return False
        for g in range(eot.group + 1):
            grp = self._group(track, g, touch=False)
            if g < eot.group:
                if grp is None or grp.end_of_group is None \
                        or not grp.dense_below(grp.end_of_group + 1):
                    return False
            elif eot.object_id and (grp is None or not grp.dense_below(eot.object_id)):
                return False
        return True

    def _complete_groups(self, track: TrackKey,
                         st: _TrackState) -> list[list[StoredObject]] | None:
        if not self._held_to_end(track, st):
            return None
        eot = st.end_of_track
        assert eot is not None
        out: list[list[StoredObject]] = []
        for g in range(eot.group):
            grp = self._group(track, g, touch=False)
            assert grp is not None and grp.end_of_group is not None
            out.append([grp.objects[i] for i in range(grp.end_of_group + 1)])
        grp = self._group(track, eot.group, touch=False)
        objs = [grp.objects[i] for i in range(eot.object_id)] if grp is not None else []
        out.append([*objs, eot])
        return out
