"""Memory tier: appends, existence knowledge, byte accounting, LRU over Groups, pins."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from fake_clock import Clock
from storage_helpers import end_group, end_track, flat, full_track, track_key, unknown_spans

from storage.interface import (
    OBJECT_MAX,
    AppendResult,
    ConflictError,
    Location,
    ObjectStatus,
    Span,
    SpanKind,
    StoredObject,
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
