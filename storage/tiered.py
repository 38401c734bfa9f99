"""Memory in front of LMDB, the way the relay uses them.

* Every Object is appended to memory. When a track is complete (End of Track, no gap) and not
  aborted, the relay takes its Groups from memory (`MemoryStore.complete_track`, on its event
  loop) and hands them to LMDB's writer thread (`LmdbStore.commit_track`), which writes them
  in one transaction. Memory keeps its copy until LRU evicts it; LMDB then serves it.
* Reads look in memory first and fall back to LMDB per Group: a memory Group is used when it is
  whole, or when LMDB does not hold the track. Every walk item says which tier served it, so the
  relay can count hits per tier; `Span`s are served by no tier (Tier.NONE).
* LMDB reads are zero-copy: items from `TieredReader` are valid until the reader closes.
* A full LMDB (`StorageFullError` from `commit_track`) leaves memory untouched: keep serving
  from it (and retry the commit later).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from storage.interface import (
    OBJECT_MAX,
    AppendResult,
    GroupOrder,
    IdRanges,
    Location,
    Span,
    StoredObject,
    Tier,
    TrackInfo,
    TrackKey,
    WalkItem,
    normalize_ranges,
)
from storage.lmdb_store import LmdbReadSession, LmdbStore
from storage.memory import Lease, MemoryGroup, MemoryStore
from storage.walk import GroupSource, read_objects, walk_range


class TieredStore:
    """Memory tier plus an optional LMDB tier for completed tracks."""

    def __init__(self, memory: MemoryStore, durable: LmdbStore | None = None) -> None:
        self.memory = memory
        self.durable = durable

    # -- writing (memory) ------------------------------------------------------------------

    def append(self, track: TrackKey, obj: StoredObject) -> AppendResult:
        return self.memory.append(track, obj)

    def abort(self, track: TrackKey) -> None:
        """The publisher failed: the track is never committed (memory keeps serving it)."""
        self.memory.abort(track)

    def pin(self, track: TrackKey, first_group: int = 0,
            last_group: int = OBJECT_MAX) -> Lease:
        """Keep the track's Groups in memory while a fill walks them (see `MemoryStore.pin`)."""
        return self.memory.pin(track, first_group, last_group)

    def track_properties(self, track: TrackKey) -> bytes:
        """Track Properties committed to LMDB with the track (b"" if none or not held)."""
        if self.durable is None:
            return b""
        with self.durable.session() as s:
            return s.properties(track)

    # -- reading ---------------------------------------------------------------------------

    def reader(self) -> TieredReader:
        """A read context; LMDB views it hands out die with it."""
        return TieredReader(self)

    def largest_object(self, track: TrackKey) -> Location | None:
        with self.reader() as r:
            return r.largest_object(track)

    def known_final(self, track: TrackKey) -> Location | None:
        with self.reader() as r:
            return r.known_final(track)

    def is_complete(self, track: TrackKey) -> bool:
        with self.reader() as r:
            return r.is_complete(track)

    def group_end(self, track: TrackKey, group: int) -> int | None:
        with self.reader() as r:
            return r.group_end(track, group)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"memory": self.memory.stats()}
        if self.durable is not None:
            out["lmdb"] = self.durable.stats()
        return out

    def close(self) -> None:
        if self.durable is not None:
            self.durable.close()


class TieredReader:
    """Reads across both tiers; opens an LMDB read session only when memory falls short."""

    def __init__(self, store: TieredStore) -> None:
        self._store = store
        self._mem = store.memory
        self._session: LmdbReadSession | None = None

    def __enter__(self) -> TieredReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _lmdb(self) -> LmdbReadSession | None:
        if self._session is None and self._store.durable is not None:
            self._session = self._store.durable.session()
        return self._session

    def _durable_info(self, track: TrackKey) -> TrackInfo | None:
        """LMDB's view of the track, skipped when memory alone holds all of it (a walk over
        memory needs the End of Track's Group held, not only the End of Track known)."""
        if self._mem.is_complete(track) and self._mem.holds_final_group(track):
            return None
        session = self._lmdb()
        return session.info(track) if session is not None else None

    def largest_object(self, track: TrackKey) -> Location | None:
        mem = self._mem.largest_object(track)
        info = self._durable_info(track)
        if info is None or info.largest is None:
            return mem
        return info.largest if mem is None else max(mem, info.largest)

    def known_final(self, track: TrackKey) -> Location | None:
        final = self._mem.known_final(track)
        if final is not None:
            return final
        info = self._durable_info(track)
        return info.end_of_track if info is not None else None

    def is_complete(self, track: TrackKey) -> bool:
        return self._mem.is_complete(track) or self._durable_info(track) is not None

    def group_end(self, track: TrackKey, group: int) -> int | None:
        end = self._mem.group_end(track, group)
        if end is not None or self._durable_info(track) is None:
            return end
        session = self._lmdb()
        view = session.group(track, group) if session is not None else None
        return view.end_of_group if view is not None else None

    def _plan(self, track: TrackKey) -> tuple[list[int], Location | None, Location | None,
                                              Callable[[int], GroupSource | None], list[Tier]]:
        """Held Groups, End of Track, Largest, a Group opener, and the opener's last tier."""
        mem = self._mem
        mem_groups = mem.held_groups(track)
        info = self._durable_info(track)
        eot = mem.known_final(track)
        largest = mem.largest_object(track)
        durable_groups = 0
        if info is not None:
            durable_groups = info.groups
            eot = eot or info.end_of_track
            largest = info.largest if largest is None else max(largest, info.largest or largest)
        held = mem_groups
        if durable_groups:
            held = sorted(set(mem_groups).union(range(durable_groups)))
        tier = [Tier.NONE]
        session = self._session

        def open_group(g: int) -> GroupSource | None:
            grp: MemoryGroup | None = mem.group(track, g)
            if grp is not None and (g >= durable_groups or grp.whole(eot, g)):
                tier[0] = Tier.MEMORY
                return grp
            if g < durable_groups and session is not None:
                tier[0] = Tier.LMDB
                return session.group(track, g)
            tier[0] = Tier.MEMORY
            return grp

        return held, eot, largest, open_group, tier

    def read(self, track: TrackKey, start: Location, end: Location | None = None,
             order: GroupOrder = GroupOrder.ASCENDING,
             object_ids: IdRanges | None = None) -> Iterator[tuple[Tier, StoredObject]]:
        """Held Objects of [start, end] (status Objects included) with the serving tier."""
        held, _, largest, open_group, tier = self._plan(track)
        stop = end if end is not None else largest
        if stop is None:
            return
        for obj in read_objects(start, stop, order, normalize_ranges(object_ids), held,
                                open_group):
            yield tier[0], obj

    def walk(self, track: TrackKey, start: Location, end: Location | None = None,
             order: GroupOrder = GroupOrder.ASCENDING, object_ids: IdRanges | None = None,
             include_status: bool = False) -> Iterator[tuple[Tier, WalkItem]]:
        """Objects and unknown / non-existent Spans of [start, end] with the serving tier.

        end None means the Largest Object. Items stay valid until this reader closes.
        """
        held, eot, largest, open_group, tier = self._plan(track)
        stop = end if end is not None else largest
        if stop is None:
            return
        for item in walk_range(start, stop, order, normalize_ranges(object_ids), held,
                               open_group, eot, include_status):
            yield (Tier.NONE if isinstance(item, Span) else tier[0]), item
