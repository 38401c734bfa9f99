"""Memory tier: appends, existence knowledge, byte accounting, LRU over Groups, pins."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterable

import pytest
from fake_clock import Clock
from storage_helpers import (
    end_group,
    end_track,
    flat,
    full_track,
    reference_walk,
    track_key,
    unknown_spans,
)

from storage.interface import (
    OBJECT_MAX,
    AppendResult,
    ConflictError,
    GroupOrder,
    Location,
    ObjectStatus,
    Span,
    SpanKind,
    StoredObject,
    TrackInfo,
    TrackKey,
)
from storage.memory import GROUP_OVERHEAD, OBJECT_OVERHEAD, MemoryStore

T = track_key(0)


def obj(g: int, o: int, data: bytes = b"x", **kw: object) -> StoredObject:
    return StoredObject(g, 0, o, 5, payload=data, **kw)  # type: ignore[arg-type]


def test_append_read_and_zero_copy() -> None:
    mem = MemoryStore(1 << 20)
    data = b"a" * 100
    assert mem.append(T, obj(0, 0, data)) is AppendResult.STORED
    got = mem.get(T, Location(0, 0))
    assert got is not None and got.payload is data  # the very object: no copy


def test_duplicates_and_conflicts() -> None:
    mem = MemoryStore(1 << 20)
    mem.append(T, obj(0, 0, b"same"))
    assert mem.append(T, obj(0, 0, bytearray(b"same"))) is AppendResult.DUPLICATE  # type: ignore[arg-type]
    with pytest.raises(ConflictError):
        mem.append(T, obj(0, 0, b"different"))
    with pytest.raises(ConflictError):
        mem.append(T, StoredObject(0, 1, 0, 5, payload=b"same"))  # other Subgroup
    mem.append(T, obj(0, 3))
    with pytest.raises(ConflictError):  # End of Group below a held Object
        end_group(mem, T, 0, 2)
    end_group(mem, T, 0, 4)
    with pytest.raises(ConflictError):
        end_group(mem, T, 0, 5)
    assert mem.append(T, obj(0, 7)) is AppendResult.NON_EXISTENT
    mem.append(T, obj(2, 1))
    with pytest.raises(ConflictError):  # End of Track below the Largest Object
        end_track(mem, T, 2, 0)
    end_track(mem, T, 3, 0)
    assert mem.append(T, obj(3, 1)) is AppendResult.NON_EXISTENT
    assert mem.append(T, obj(9, 0)) is AppendResult.NON_EXISTENT
    with pytest.raises(ConflictError):
        end_track(mem, T, 4, 0)
    with pytest.raises(ConflictError):
        mem.append(T, StoredObject(1, 0, 0, 5, status=2))


def test_completeness_and_gaps() -> None:
    mem = MemoryStore(1 << 24)
    groups = full_track([3, 3], size=8)
    objs = flat(groups)
    missing = objs.pop(1)  # {0, 1}
    for o in objs:
        mem.append(T, o)
    assert not mem.is_complete(T) and mem.complete_track(T) is None
    assert mem.known_final(T) == Location(2, 0)
    assert unknown_spans(mem.walk(T, Location(0, 0), include_status=True)) == [
        Span(SpanKind.UNKNOWN, Location(0, 1), Location(0, 1))]
    mem.append(T, missing)
    assert mem.is_complete(T)
    assert mem.complete_track(T) == groups
    mem.abort(T)
    assert mem.is_aborted(T) and mem.complete_track(T) is None


def test_byte_accounting_includes_overhead() -> None:
    mem = MemoryStore(1 << 30)
    for g in range(3):
        for o in range(10):
            mem.append(T, obj(g, o, b"p" * (100 + o), properties=b"kv"))
    want = 3 * GROUP_OVERHEAD + sum(100 + o + 2 + OBJECT_OVERHEAD
                                    for g in range(3) for o in range(10))
    assert mem.bytes_used == want
    info = mem.info(T)
    assert info is not None and info.nbytes == want and info.groups == 3


def test_overhead_constants_cover_real_memory() -> None:
    """What accounting charges per Object/Group is at least what CPython really spends."""
    payloads = [bytes([i % 256]) * 8 for i in range(4000)]  # allocated before measuring
    objects = [StoredObject(g, 0, o, 1, payload=payloads[g * 200 + o], properties=b"")
               for g in range(20) for o in range(200)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    mem = MemoryStore(1 << 30)
    for o in objects:
        mem.append(T, o)
    real = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    # The StoredObjects were built outside the measurement; count them as the relay would.
    real += sum(o.__sizeof__() for o in objects)
    charged = mem.bytes_used - sum(len(p) for p in payloads)
    assert charged >= real, (charged, real)


def test_lru_over_groups_and_read_counts_as_use() -> None:
    one_group = GROUP_OVERHEAD + 4 * (OBJECT_OVERHEAD + 1000)
    mem = MemoryStore(3 * one_group)
    for g in range(3):
        for o in range(4):
            mem.append(T, obj(g, o, b"z" * 1000))
    assert mem.held_groups(T) == [0, 1, 2]
    assert list(mem.read(T, Location(0, 0), Location(0, OBJECT_MAX)))  # Group 0 is now fresh
    for o in range(4):
        mem.append(T, obj(3, o, b"z" * 1000))
    assert mem.held_groups(T) == [0, 2, 3]  # Group 1 was the least recently used
    assert mem.bytes_used <= mem.capacity
    assert mem.stats()["evicted_groups"] == 1
    assert mem.stats()["evicted_bytes"] == one_group


def test_eviction_makes_locations_unknown_not_nonexistent() -> None:
    one_group = GROUP_OVERHEAD + 3 * OBJECT_OVERHEAD + 2 * 500
    mem = MemoryStore(one_group + 10)
    mem.append(T, obj(0, 0, b"a" * 500))
    mem.append(T, obj(0, 1, b"a" * 500))
    end_group(mem, T, 0, 2)
    assert mem.group_end(T, 0) == 2
    mem.append(T, obj(1, 0, b"b" * 500))  # evicts Group 0 with its End of Group
    assert mem.group_end(T, 0) is None
    items = list(mem.walk(T, Location(0, 0), Location(0, 5)))
    assert items == [Span(SpanKind.UNKNOWN, Location(0, 0), Location(0, 5))]


def test_pinned_groups_survive_pressure_and_are_accounted() -> None:
    one_group = GROUP_OVERHEAD + 2 * (OBJECT_OVERHEAD + 1000)
    mem = MemoryStore(2 * one_group)
    live, other = track_key(1), track_key(2)
    with mem.pin(live):
        for g in range(4):  # twice the capacity, all pinned
            for o in range(2):
                mem.append(live, obj(g, o, b"l" * 1000))
        for o in range(2):
            mem.append(other, obj(0, o, b"o" * 1000))
        assert mem.held_groups(live) == [0, 1, 2, 3]
        assert all(mem.get(live, Location(g, 1)) is not None for g in range(4))
        assert mem.pinned_bytes >= 2 * one_group
        assert mem.bytes_used == 4 * one_group + (one_group if mem.held_groups(other) else 0)
    # Released: back under the bound, least recently used first.
    assert mem.bytes_used <= mem.capacity
    assert mem.pinned_bytes == 0


def test_pin_of_a_group_range_only() -> None:
    one_group = GROUP_OVERHEAD + OBJECT_OVERHEAD + 1000
    mem = MemoryStore(2 * one_group)
    lease = mem.pin(T, 0, 0)
    for g in range(4):
        mem.append(T, obj(g, 0, b"q" * 1000))
    assert mem.held_groups(T) == [0, 3]  # the pinned Group still counts against capacity
    lease.release()
    lease.release()  # idempotent
    assert mem.bytes_used <= mem.capacity


def test_group_larger_than_capacity_is_not_kept_unless_pinned() -> None:
    mem = MemoryStore(4096)
    assert mem.append(T, obj(0, 0, b"x" * 10_000)) is AppendResult.NOT_KEPT
    assert mem.get(T, Location(0, 0)) is None and mem.bytes_used == 0
    with mem.pin(T):
        assert mem.append(T, obj(1, 0, b"x" * 10_000)) is AppendResult.STORED
        assert mem.get(T, Location(1, 0)) is not None
    assert mem.get(T, Location(1, 0)) is None and mem.bytes_used == 0


def test_drop_track_and_status_objects_readable() -> None:
    mem = MemoryStore(1 << 20)
    for o in flat(full_track([2])):
        mem.append(T, o)
    statuses = [o.status for o in mem.read(T, Location(0, 0))]
    assert statuses == [0, 0, ObjectStatus.END_OF_GROUP, ObjectStatus.END_OF_TRACK]
    mem.drop_track(T)
    assert mem.bytes_used == 0 and mem.tracks() == [] and mem.largest_object(T) is None


def test_groups_expire_after_the_max_cache_duration() -> None:
    """MAX_CACHE_DURATION: a Group is served until that long after its first Object arrived,
    then it is dropped when touched (unknown again, pinned or not); an Object arriving again
    starts the Group afresh. The duration outlives the track's last Group."""
    clock = Clock()
    mem = MemoryStore(1 << 20, clock=clock)
    mem.set_cache_duration(T, 10.0)
    mem.append(T, obj(0, 0))
    clock.now += 5
    mem.append(T, obj(0, 1))  # a later Object of Group 0: expires with the Group
    mem.append(T, obj(1, 0))
    assert mem.first_received(T) == clock.now - 5
    lease = mem.pin(T)
    clock.now += 5  # Group 0 is 10 s old, Group 1 5 s
    assert mem.get(T, Location(0, 1)) is None and mem.group(T, 0) is None
    assert mem.get(T, Location(1, 0)) is not None
    assert [type(i) for i in mem.walk(T, Location(0, 0), Location(0, 1))] == [Span]
    assert mem.stats()["expired_groups"] == 1
    assert mem.largest_object(T) == Location(1, 0)  # knowledge, not cached Objects
    lease.release()
    clock.now += 5
    assert mem.held_groups(T) == [1] and mem.group(T, 1) is None
    assert mem.held_groups(T) == []  # the track held nothing more...
    assert mem.append(T, obj(1, 0)) is AppendResult.STORED  # ... its duration still applies
    assert mem.get(T, Location(1, 0)) is not None
    clock.now += 10
    assert mem.get(T, Location(1, 0)) is None
    mem.set_cache_duration(T, None)
    mem.append(T, obj(1, 0))
    clock.now += 1000
    assert mem.get(T, Location(1, 0)) is not None  # no duration: no expiry


# One Group of one 1000-byte Object: tiers sized in these make eviction order exact.
PAY = 1000
ONE = GROUP_OVERHEAD + OBJECT_OVERHEAD + PAY


def put_groups(mem: MemoryStore, track: TrackKey, groups: Iterable[int]) -> None:
    for g in groups:
        assert mem.append(track, obj(g, 0, b"z" * PAY)) is AppendResult.STORED


@pytest.mark.parametrize("use", [
    lambda m: m.get(T, Location(0, 0)),
    lambda m: list(m.read(T, Location(0, 0), Location(0, 0))),
    lambda m: list(m.walk(T, Location(0, 0), Location(0, 0))),
], ids=["get", "read", "walk"])
def test_every_read_path_counts_as_use(use: Callable[[MemoryStore], object]) -> None:
    """A fill hit (get) and a FETCH (read, walk) keep the Group they served from eviction."""
    mem = MemoryStore(3 * ONE)
    put_groups(mem, T, range(3))
    assert use(mem)  # served Group 0, the oldest: now the most recently used
    put_groups(mem, T, [3])
    assert mem.held_groups(T) == [0, 2, 3]


def test_info_only_peeks_and_eviction_counters_add_up() -> None:
    mem = MemoryStore(3 * ONE)
    put_groups(mem, T, range(3))
    assert mem.get(T, Location(0, 0)) is not None  # LRU order now 1, 2, 0
    # info() visits Groups 0, 1, 2 in that order: were it a use, the order would become
    # 0, 1, 2 and Group 0 would go first below
    info = mem.info(T)
    assert info is not None and info.nbytes == 3 * ONE and info.groups == 3
    put_groups(mem, T, [3, 4])
    assert mem.held_groups(T) == [0, 3, 4]
    assert mem.stats()["evicted_groups"] == 2
    assert mem.stats()["evicted_bytes"] == 2 * ONE


def test_info_reports_what_the_tier_knows() -> None:
    mem = MemoryStore(1 << 20)
    assert mem.info(T) is None
    for o in flat(full_track([2, 1], size=8)):  # End of Track at {2, 0}
        mem.append(T, o)
    held = mem.bytes_used
    assert mem.info(T) == TrackInfo(Location(2, 0), Location(2, 0), True, held, 3)
    other = track_key(1)
    mem.append(other, obj(1, 4))  # a Largest Object, no End of Track, Group 0 unknown
    assert mem.info(other) == TrackInfo(Location(1, 4), None, False,
                                        GROUP_OVERHEAD + OBJECT_OVERHEAD + 1, 1)


def test_whole_group_needs_its_end_and_every_object() -> None:
    """`whole` tells the tiered store it may serve a Group from memory as complete: its end
    (End of Group, or the End of Track Object in it) and every Object below are held."""
    mem = MemoryStore(1 << 20)
    mem.append(T, obj(0, 0))
    mem.append(T, obj(0, 1))
    grp = mem.group(T, 0)
    assert grp is not None
    assert not grp.whole(None, 0)  # no End of Group, no End of Track: its end is unknown
    assert not grp.whole(Location(1, 0), 0)  # the End of Track is in another Group
    assert not grp.whole(Location(0, 2), 0)  # the End of Track Object itself is not held
    end_track(mem, T, 0, 2)
    assert grp.whole(Location(0, 2), 0)
    other = track_key(1)
    mem.append(other, obj(0, 1))
    end_group(mem, other, 0, 2)  # Object 0 is missing
    grp1 = mem.group(other, 0)
    assert grp1 is not None and not grp1.whole(None, 0)
    mem.append(other, obj(0, 0))
    assert grp1.whole(None, 0)


def test_tracks_without_objects() -> None:
    """A track known only by a pin or an abort: nothing to read, not aborted unless said."""
    mem = MemoryStore(1 << 20)
    assert not mem.is_aborted(T)  # unknown track
    mem.append(T, obj(0, 0))
    assert not mem.is_aborted(T)
    other = track_key(1)
    with mem.pin(other):
        assert not mem.is_aborted(other)
        assert list(mem.read(other, Location(0, 0))) == []  # no Largest Object: no range
        assert list(mem.read(other, Location(0, 0), Location(5, 0))) == []
        mem.abort(other)
        assert mem.is_aborted(other)


@pytest.mark.parametrize("order", [GroupOrder.ASCENDING, GroupOrder.DESCENDING],
                         ids=["ascending", "descending"])
def test_walk_of_an_unknown_track_is_one_unknown_span(order: GroupOrder) -> None:
    mem = MemoryStore(1 << 20)
    start, end = Location(1, 2), Location(3, 4)
    want = reference_walk({}, None, start, end, order, None, False)
    assert list(mem.walk(T, start, end, order)) == want
    assert list(mem.walk(T, start, end, order, include_status=True)) == want
    assert list(mem.walk(T, start)) == []  # nothing known, no end given: no range at all


def test_discard_group() -> None:
    """discard_group drops a held Group as if evicted, pinned (and parked) or not; it says
    whether there was one."""
    mem = MemoryStore(2 * ONE)
    assert not mem.discard_group(T, 0)  # unknown track
    put_groups(mem, T, [0, 1])
    assert not mem.discard_group(T, 5)  # known track, Group not held
    assert mem.discard_group(T, 0)
    assert mem.held_groups(T) == [1] and mem.get(T, Location(0, 0)) is None
    assert mem.bytes_used == ONE
    assert mem.group_end(T, 0) is None
    assert mem.discard_group(T, 1)  # its last Group: the tier forgets the track
    assert mem.tracks() == [] and mem.bytes_used == 0
    # Pinned Groups beyond the capacity are parked outside the LRU, still discardable.
    with mem.pin(T):
        put_groups(mem, T, range(4))
        assert mem.pinned_bytes == 3 * ONE and mem.bytes_used == 4 * ONE
        assert mem.discard_group(T, 0)
        assert mem.pinned_bytes == 2 * ONE and mem.bytes_used == 3 * ONE
        assert mem.held_groups(T) == [1, 2, 3] and mem.get(T, Location(0, 0)) is None
    assert mem.pinned_bytes == 0 and mem.bytes_used <= mem.capacity


def test_expired_parked_groups_release_their_bytes() -> None:
    """A pinned Group parked outside the LRU expires like any other: it leaves the tier and
    its bytes leave the pinned count; a track whose last Group expired is forgotten."""
    clock = Clock()
    mem = MemoryStore(2 * ONE, clock=clock)
    mem.set_cache_duration(T, 10.0)
    lease = mem.pin(T)
    put_groups(mem, T, range(4))
    assert mem.pinned_bytes == 3 * ONE
    clock.now += 10
    assert mem.get(T, Location(0, 0)) is None
    assert mem.pinned_bytes == 2 * ONE and mem.bytes_used == 3 * ONE
    assert mem.get(T, Location(1, 0)) is None
    assert mem.pinned_bytes == ONE and mem.bytes_used == 2 * ONE
    assert mem.stats()["expired_groups"] == 2
    assert mem.held_groups(T) == [2, 3]
    lease.release()
    assert mem.group(T, 2) is None and mem.group(T, 3) is None
    assert mem.stats()["expired_groups"] == 4
    assert mem.tracks() == [] and mem.bytes_used == 0 and mem.pinned_bytes == 0


def test_drop_track_forgets_parked_groups_pins_and_cache_duration() -> None:
    clock = Clock()
    mem = MemoryStore(2 * ONE, clock=clock)
    mem.drop_track(T)  # an unknown track: nothing to do
    mem.set_cache_duration(T, 10.0)
    lease = mem.pin(T)
    put_groups(mem, T, range(4))
    assert mem.pinned_bytes == 3 * ONE
    mem.drop_track(T)
    assert mem.tracks() == [] and mem.held_groups(T) == []
    assert mem.bytes_used == 0 and mem.pinned_bytes == 0
    assert mem.scopes.held == {}  # no quotas: the tier keeps no per-scope books at all
    lease.release()  # its pin went with the track: nothing left to release
    # The same track again: no pin (it is evicted like any other) and no cache duration.
    put_groups(mem, T, range(3))
    assert mem.held_groups(T) == [1, 2] and mem.pinned_bytes == 0
    clock.now += 1000
    assert mem.get(T, Location(2, 0)) is not None
