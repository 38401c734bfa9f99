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
from storage.memory import GROUP_OVERHEAD, OBJECT_OVERHEAD, MemoryGroup, MemoryStore

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
        assert mem.stats()["pinned_bytes"] >= 2 * one_group
        assert mem.bytes_used == 4 * one_group + (one_group if mem.held_groups(other) else 0)
    # Released: back under the bound, least recently used first.
    assert mem.bytes_used <= mem.capacity
    assert mem.stats()["pinned_bytes"] == 0


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
    big = GROUP_OVERHEAD + OBJECT_OVERHEAD + 10_000
    with mem.pin(T):
        assert mem.append(T, obj(1, 0, b"x" * 10_000)) is AppendResult.STORED
        assert mem.append(T, obj(2, 0, b"x" * 10_000)) is AppendResult.STORED
        assert mem.get(T, Location(1, 0)) is not None
        assert mem.stats()["pinned_bytes"] == mem.bytes_used == 2 * big
    assert mem.get(T, Location(1, 0)) is None and mem.bytes_used == 0
    assert mem.stats()["pinned_bytes"] == 0 and mem.tracks() == []


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
    lambda m: m.group(T, 0),
], ids=["get", "read", "walk", "group"])
def test_every_read_path_counts_as_use(use: Callable[[MemoryStore], object]) -> None:
    """A fill hit (get, group) and a FETCH (read, walk) keep the Group they served from
    eviction."""
    mem = MemoryStore(3 * ONE)
    put_groups(mem, T, range(3))
    assert use(mem)  # served Group 0, the oldest: now the most recently used
    put_groups(mem, T, [3])
    assert mem.held_groups(T) == [0, 2, 3]


def test_metadata_reads_only_peek_and_eviction_counters_add_up() -> None:
    mem = MemoryStore(3 * ONE)
    put_groups(mem, T, range(3))
    assert mem.get(T, Location(0, 0)) is not None  # LRU order now 1, 2, 0
    # info() and first_received() visit Groups 0, 1, 2 in that order: were that a use, the
    # order would become 0, 1, 2 and Group 0 would go first below; so would Group 1 be kept
    # if group_end() or a group(touch=False) of it were a use
    info = mem.info(T)
    assert info is not None and info.nbytes == 3 * ONE and info.groups == 3
    assert mem.first_received(T) is not None
    assert mem.group_end(T, 1) is None and mem.group(T, 1, touch=False) is not None
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
    assert mem.is_aborted(T) is False  # unknown track (a bool, as typed)
    mem.append(T, obj(0, 0))
    assert mem.is_aborted(T) is False
    other = track_key(1)
    with mem.pin(other):
        assert mem.is_aborted(other) is False
        assert list(mem.read(other, Location(0, 0))) == []  # no Largest Object: no range
        assert list(mem.read(other, Location(0, 0), Location(5, 0))) == []
        mem.abort(other)
        assert mem.is_aborted(other)
    assert mem.tracks() == [T]  # released, holding nothing: forgotten


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
        assert mem.stats()["pinned_bytes"] == 3 * ONE and mem.bytes_used == 4 * ONE
        assert mem.discard_group(T, 0)
        assert mem.stats()["pinned_bytes"] == 2 * ONE and mem.bytes_used == 3 * ONE
        assert mem.held_groups(T) == [1, 2, 3] and mem.get(T, Location(0, 0)) is None
    assert mem.stats()["pinned_bytes"] == 0 and mem.bytes_used <= mem.capacity


def test_expired_parked_groups_release_their_bytes() -> None:
    """A pinned Group parked outside the LRU expires like any other: it leaves the tier and
    its bytes leave the pinned count; a track whose last Group expired is forgotten."""
    clock = Clock()
    mem = MemoryStore(2 * ONE, clock=clock)
    mem.set_cache_duration(T, 10.0)
    lease = mem.pin(T)
    put_groups(mem, T, range(4))
    assert mem.stats()["pinned_bytes"] == 3 * ONE
    clock.now += 10
    assert mem.get(T, Location(0, 0)) is None
    assert mem.stats()["pinned_bytes"] == 2 * ONE and mem.bytes_used == 3 * ONE
    assert mem.get(T, Location(1, 0)) is None
    assert mem.stats()["pinned_bytes"] == ONE and mem.bytes_used == 2 * ONE
    assert mem.stats()["expired_groups"] == 2
    assert mem.held_groups(T) == [2, 3]
    lease.release()
    assert mem.group(T, 2) is None and mem.group(T, 3) is None
    assert mem.stats()["expired_groups"] == 4
    assert mem.tracks() == [] and mem.bytes_used == 0 and mem.stats()["pinned_bytes"] == 0


def test_drop_track_forgets_parked_groups_pins_and_cache_duration() -> None:
    clock = Clock()
    mem = MemoryStore(2 * ONE, clock=clock)
    mem.drop_track(T)  # an unknown track: nothing to do
    mem.set_cache_duration(T, 10.0)
    lease = mem.pin(T)
    put_groups(mem, T, range(4))
    assert mem.stats()["pinned_bytes"] == 3 * ONE
    mem.drop_track(T)
    assert mem.tracks() == [] and mem.held_groups(T) == []
    assert mem.bytes_used == 0 and mem.stats()["pinned_bytes"] == 0
    assert mem.scopes.held == {}  # no quotas: the tier keeps no per-scope books at all
    # The same track again: no pin (it is evicted like any other) and no cache duration.
    put_groups(mem, T, range(3))
    lease.release()  # its pin went with the old track: nothing to release in the new one
    assert mem.held_groups(T) == [1, 2] and mem.stats()["pinned_bytes"] == 0
    clock.now += 1000
    assert mem.get(T, Location(2, 0)) is not None


def test_objects_between_dense_and_sparse_groups() -> None:
    """A Group's Objects in an Object-ID interval: a dense Group (IDs 0..n-1) is indexed by
    ID, any other is searched; both must give exactly the Objects inside the interval."""
    mem = MemoryStore(1 << 20)
    for o in range(4):
        mem.append(T, obj(0, o))
    for o in (1, 3):  # two Objects, the last one's ID is 3: not 0..1
        mem.append(T, obj(1, o))
    dense, sparse = mem.group(T, 0), mem.group(T, 1)
    assert dense is not None and sparse is not None

    def ids(grp: MemoryGroup, lo: int, hi: int) -> list[int]:
        return [o.object_id for o in grp.objects_between(lo, hi)]

    assert ids(dense, 2, 3) == [2, 3] and ids(dense, 1, OBJECT_MAX) == [1, 2, 3]
    assert ids(sparse, 0, 1) == [1] and ids(sparse, 2, 2) == [] and ids(sparse, 0, 9) == [1, 3]
    # the same through a read of part of each Group
    assert [o.object_id for o in mem.read(T, Location(0, 2), Location(1, 2))] == [2, 3, 1]


def test_dense_below_counts_from_object_zero() -> None:
    mem = MemoryStore(1 << 20)
    mem.append(T, obj(0, 1))  # Object 0 is missing
    grp = mem.group(T, 0)
    assert grp is not None
    assert grp.dense_below(0)  # nothing below Object 0: trivially held
    assert not grp.dense_below(1) and not grp.dense_below(2)
    mem.append(T, obj(0, 0))
    assert grp.dense_below(1) and grp.dense_below(2) and not grp.dense_below(3)


def test_objects_append_to_a_parked_group() -> None:
    """A pinned Group pushed out of the LRU still takes its later Objects (counted as pinned,
    beyond the capacity), in the same Group."""
    mem = MemoryStore(2 * ONE)
    with mem.pin(T):
        put_groups(mem, T, range(3))
        assert mem.stats()["pinned_bytes"] == 2 * ONE  # Groups 0 and 1 are parked
        assert mem.append(T, obj(0, 1, b"y" * 10)) is AppendResult.STORED
        assert mem.stats()["pinned_bytes"] == 2 * ONE + OBJECT_OVERHEAD + 10
        assert mem.bytes_used == 3 * ONE + OBJECT_OVERHEAD + 10
        assert [o.object_id for o in mem.read(T, Location(0, 0), Location(0, 1))] == [0, 1]
        assert mem.held_groups(T) == [0, 1, 2]
        # the metrics read these keys (docs/metrics.md)
        assert mem.stats() == {"bytes_used": 3 * ONE + OBJECT_OVERHEAD + 10,
                               "capacity": 2 * ONE, "groups": 3, "tracks": 1,
                               "pinned_bytes": 2 * ONE + OBJECT_OVERHEAD + 10,
                               "evicted_groups": 0, "evicted_bytes": 0,
                               "expired_groups": 0}


def test_an_object_for_an_expired_group_starts_it_afresh() -> None:
    """An Object arriving for a Group that expired untouched: the old Group goes (counted as
    expired, its Objects unknown again) and the Object starts the Group anew, with its own
    time; this holds for a Group parked outside the LRU and for a track's last Group."""
    clock = Clock()
    mem = MemoryStore(1 << 20, clock=clock)
    mem.set_cache_duration(T, 10.0)
    mem.append(T, obj(0, 0, b"old"))
    mem.append(T, obj(0, 1, b"old"))
    clock.now += 5
    mem.append(T, obj(1, 0))
    clock.now += 5  # Group 0 expired, nobody touched it since; Group 1 is 5 s old
    assert mem.append(T, obj(0, 1, b"new")) is AppendResult.STORED  # no conflict with "old"
    assert mem.stats()["expired_groups"] == 1
    assert mem.get(T, Location(0, 0)) is None
    got = mem.get(T, Location(0, 1))
    assert got is not None and got.payload == b"new"
    grp = mem.group(T, 0)
    assert grp is not None and grp.received_at == clock.now
    assert mem.get(T, Location(1, 0)) is not None  # the track's other Group is untouched
    assert mem.bytes_used == 2 * (GROUP_OVERHEAD + OBJECT_OVERHEAD) + 3 + 1
    # A parked (pinned) Group: its bytes leave the pinned count.
    other = track_key(1)
    small = MemoryStore(2 * ONE, clock=clock)
    small.set_cache_duration(other, 10.0)
    with small.pin(other):
        put_groups(small, other, range(3))
        assert small.stats()["pinned_bytes"] == 2 * ONE  # Groups 0 and 1 are parked
        clock.now += 10
        assert small.append(other, obj(0, 0, b"new")) is AppendResult.STORED
        assert small.stats()["expired_groups"] == 1
        got = small.get(other, Location(0, 0))
        assert got is not None and got.payload == b"new"
    # A track's last Group: the track itself starts afresh (its old knowledge is gone).
    last = track_key(2)
    mem.set_cache_duration(last, 10.0)
    mem.append(last, obj(3, 0, b"old"))
    end_track(mem, last, 3, 1)
    clock.now += 10
    assert mem.append(last, obj(3, 0, b"new")) is AppendResult.STORED
    assert mem.known_final(last) is None and mem.held_groups(last) == [3]
    got = mem.get(last, Location(3, 0))
    assert got is not None and got.payload == b"new"
    clock.now += 10  # the new Group expires too: the duration outlived the old track state
    assert mem.get(last, Location(3, 0)) is None
    # Aborted before its first Object: the track keeps its cache duration.
    aborted = track_key(3)
    mem.set_cache_duration(aborted, 10.0)
    mem.abort(aborted)
    mem.append(aborted, obj(0, 0))
    assert mem.is_aborted(aborted)
    clock.now += 10
    assert mem.get(aborted, Location(0, 0)) is None


def test_abort_keeps_serving_what_is_held() -> None:
    mem = MemoryStore(1 << 20)
    mem.abort(track_key(5))  # a track not seen yet: remembered as aborted
    assert mem.is_aborted(track_key(5))
    for o in flat(full_track([2])):
        mem.append(T, o)
    mem.abort(T)
    assert mem.is_aborted(T) and mem.is_complete(T) and mem.complete_track(T) is None
    assert [o.object_id for o in mem.read(T, Location(0, 0))] == [0, 1, 2, 0]
    assert mem.held_groups(T) == [0, 1] and mem.known_final(T) == Location(1, 0)


def test_conflicting_first_object_leaves_no_track_behind() -> None:
    mem = MemoryStore(1 << 20)
    with pytest.raises(ConflictError):
        mem.append(T, StoredObject(0, 0, 0, 5, status=2))  # not an Object Status
    assert mem.tracks() == []
    mem.append(T, obj(0, 0))
    with pytest.raises(ConflictError):  # a conflict in a held Group keeps the track
        mem.append(T, obj(0, 0, b"other"))
    assert mem.tracks() == [T]


def test_cache_duration_applies_to_groups_already_held() -> None:
    clock = Clock()
    mem = MemoryStore(1 << 20, clock=clock)
    mem.set_cache_duration(T, None)  # clearing a duration never set: nothing to do
    mem.append(T, obj(0, 0))
    mem.set_cache_duration(T, 10.0)  # set while the track holds a Group
    clock.now += 10
    assert mem.get(T, Location(0, 0)) is None
    mem.append(T, obj(1, 0))
    mem.set_cache_duration(T, None)  # cleared while the track holds a Group
    clock.now += 1000
    assert mem.get(T, Location(1, 0)) is not None


def test_first_received() -> None:
    clock = Clock()
    mem = MemoryStore(1 << 20, clock=clock)
    assert mem.first_received(T) is None  # unknown track
    with mem.pin(T):
        assert mem.first_received(T) is None  # known, holds no Group
        mem.append(T, obj(1, 0))
        clock.now += 3
        mem.append(T, obj(0, 0))
        assert mem.first_received(T) == clock.now - 3  # the oldest Group, not the lowest ID


def test_leases_are_independent() -> None:
    """Two leases on one track pin their own ranges; releasing one puts back into the LRU
    only the parked Groups no other lease pins."""
    mem = MemoryStore(2 * ONE)
    first, second = mem.pin(T, 0, 0), mem.pin(T, 1, 2)
    put_groups(mem, T, range(4))
    assert mem.held_groups(T) == [0, 1, 2, 3] and mem.stats()["pinned_bytes"] == 3 * ONE
    second.release()  # Group 0 stays parked; 1 and 2 go back, then the LRU trims
    assert mem.held_groups(T) == [0, 2] and mem.stats()["pinned_bytes"] == ONE
    first.release()
    assert mem.stats()["pinned_bytes"] == 0
    put_groups(mem, T, [4])
    assert mem.held_groups(T) == [0, 4]  # Group 0 came back as the most recently used


def test_holds_final_group_only_while_that_group_is_held() -> None:
    mem = MemoryStore(2 * ONE)
    assert not mem.holds_final_group(T)  # unknown track
    lease = mem.pin(T, 0, 0)
    put_groups(mem, T, [0])
    assert not mem.holds_final_group(T)  # no End of Track known
    end_track(mem, T, 1, 0)
    assert mem.holds_final_group(T)
    put_groups(mem, track_key(1), [0])  # evicts Group 1 of T; Group 0 is pinned
    assert mem.held_groups(T) == [0] and mem.known_final(T) == Location(1, 0)
    assert not mem.holds_final_group(T)  # the End of Track is remembered, not held
    # ... which is all completeness needs of a final Group with no Object below its End
    end_group(mem, T, 0, 1)
    assert mem.is_complete(T)
    eog = StoredObject(0, 0, 1, 0, ObjectStatus.END_OF_GROUP)
    eot = StoredObject(1, 0, 0, 0, ObjectStatus.END_OF_TRACK)
    assert mem.complete_track(T) == [[obj(0, 0, b"z" * PAY), eog], [eot]]
    lease.release()


def test_parked_bytes_fill_the_capacity_exactly() -> None:
    """Parked Groups count against capacity; the LRU keeps what fits up to the byte."""
    mem = MemoryStore(3 * ONE)
    with mem.pin(T, 0, 0):
        put_groups(mem, T, range(4))
        assert mem.held_groups(T) == [0, 2, 3] and mem.bytes_used == mem.capacity


def test_complete_track_needs_every_object_of_every_group() -> None:
    groups = full_track([3, 2], size=8, eot_objects=2)  # End of Track at {2, 2}
    objs = flat(groups)
    # each one missing: the last Object below End of Group 0, that End of Group itself,
    # an Object of the final Group below the End of Track
    for missing in (objs[2], objs[3], objs[-2]):
        mem = MemoryStore(1 << 20)
        for o in objs:
            if o is not missing:
                mem.append(T, o)
        assert not mem.is_complete(T) and mem.complete_track(T) is None
    mem = MemoryStore(1 << 20)
    for o in objs:
        mem.append(T, o)
    assert mem.is_complete(T) and mem.complete_track(T) == groups


def test_a_remembered_end_of_track_whose_group_was_evicted_still_decides() -> None:
    """Once the End of Track's Group is evicted, the End of Track is still known: the same
    End of Track sent again (a publisher re-serving what a relay evicted) is a duplicate;
    an Object at its Location, or an End of Track at the Location of an evicted Object,
    contradicts what was cached (§14.2)."""
    mem = MemoryStore(1 << 20)
    mem.append(T, obj(0, 0))
    mem.append(T, obj(1, 0))
    eot = StoredObject(1, 0, 1, 5, ObjectStatus.END_OF_TRACK)
    mem.append(T, eot)
    mem.discard_group(T, 1)
    assert mem.known_final(T) == Location(1, 1)  # remembered
    assert mem.append(T, eot) is AppendResult.DUPLICATE
    with pytest.raises(ConflictError):
        mem.append(T, obj(1, 1))
    other = MemoryStore(1 << 20)
    other.append(T, obj(0, 0))
    other.append(T, obj(1, 0))
    other.discard_group(T, 1)
    with pytest.raises(ConflictError):
        other.append(T, StoredObject(1, 0, 0, 5, ObjectStatus.END_OF_TRACK))
