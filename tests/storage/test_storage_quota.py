"""Per-scope quotas of the memory and LMDB tiers (storage/quota.py), without a relay: a
scope over its quota or writing into a full tier gives up its own LRU data, never another
scope's; LMDB's books survive a reopen."""

from __future__ import annotations

from pathlib import Path

from fake_clock import Clock

from storage.interface import AppendResult, Location, ObjectStatus, StoredObject
from storage.lmdb_store import LmdbStore
from storage.memory import GROUP_OVERHEAD, OBJECT_OVERHEAD, MemoryStore
from storage.quota import ScopeQuotas

A, B = b"\xaa" * 4, b"\xbb" * 4
PAYLOAD = 10_000
GROUP = PAYLOAD + OBJECT_OVERHEAD + GROUP_OVERHEAD  # one Object per Group


def _key(scope: bytes, n: int) -> tuple[tuple[bytes, ...], bytes]:
    return (b"kvcs-1", scope, b"c"), b"t%d" % n


def _track(n_groups: int = 1) -> list[list[StoredObject]]:
    groups = [[StoredObject(g, 0, 0, 0, payload=bytes(PAYLOAD)),
               StoredObject(g, 0, 1, 0, ObjectStatus.END_OF_GROUP)]
              for g in range(n_groups)]
    groups.append([StoredObject(n_groups, 0, 0, 0, ObjectStatus.END_OF_TRACK)])
    return groups


def test_memory_scope_quota_and_full_tier_evict_only_the_writer() -> None:
    # B may hold 3 Groups; the tier holds 5: A's 2 Groups must survive B's 10.
    q = ScopeQuotas(memory_default=3 * GROUP)
    mem = MemoryStore(5 * GROUP + GROUP // 2, q)
    for i in range(2):
        mem.append(_key(A, i), StoredObject(0, 0, 0, 0, payload=bytes(PAYLOAD)))
    for i in range(10):
        mem.append(_key(B, i), StoredObject(0, 0, 0, 0, payload=bytes(PAYLOAD)))
    assert all(mem.held_groups(_key(A, i)) == [0] for i in range(2))
    assert [i for i in range(10) if mem.held_groups(_key(B, i))] == [7, 8, 9]
    assert mem.scopes.held[B] <= 3 * GROUP and A not in mem.scopes.evictions
    assert mem.scopes.evictions[B] == 7
    mem.drop_track(_key(A, 0))
    assert mem.scopes.held[A] == GROUP
    # a tier full of other scopes' data: a scope with nothing of its own takes the LRU's
    q2 = ScopeQuotas(overrides={A: (10 * GROUP, None)})
    mem2 = MemoryStore(2 * GROUP + GROUP // 2, q2)
    for scope, i in ((A, 0), (A, 1), (B, 0)):
        mem2.append(_key(scope, i), StoredObject(0, 0, 0, 0, payload=bytes(PAYLOAD)))
    assert mem2.held_groups(_key(A, 0)) == [] and mem2.held_groups(_key(B, 0)) == [0]


def _put(mem: MemoryStore, scope: bytes, i: int) -> AppendResult:
    """Group 0 of track i of `scope`: one Object, GROUP bytes."""
    return mem.append(_key(scope, i), StoredObject(0, 0, 0, 0, payload=bytes(PAYLOAD)))


def _held(mem: MemoryStore, scope: bytes, n: int) -> list[int]:
    return [i for i in range(n) if mem.held_groups(_key(scope, i))]


def test_memory_scope_quota_alone_bounds_a_scope() -> None:
    """The tier has room for everything: only the quota (the scope's own override, else the
    default) makes a scope give up its least recently used Groups."""
    q = ScopeQuotas(memory_default=3 * GROUP + GROUP // 2,
                    overrides={A: (GROUP + GROUP // 2, None)})
    mem = MemoryStore(100 * GROUP, q)
    for i in range(6):
        assert _put(mem, B, i) is AppendResult.STORED
    assert _held(mem, B, 6) == [3, 4, 5]
    assert mem.scopes.held[B] == 3 * GROUP and mem.scopes.evictions[B] == 3
    assert mem.get(_key(B, 3), Location(0, 0)) is not None  # a read is a use in the scope too
    _put(mem, B, 6)
    assert _held(mem, B, 7) == [3, 5, 6]
    for i in range(3):
        _put(mem, A, i)
    assert _held(mem, A, 3) == [2]  # A's own quota: one Group
    assert mem.scopes.held == {A: GROUP, B: 3 * GROUP}
    assert mem.scopes.evictions == {A: 2, B: 4}
    assert mem.bytes_used == 4 * GROUP  # the tier was never full
    assert mem.stats()["evicted_groups"] == 6 and mem.stats()["evicted_bytes"] == 6 * GROUP


def test_memory_group_over_the_quota_is_kept_until_the_next() -> None:
    """The Group just written is never the quota's victim, even alone above the quota."""
    mem = MemoryStore(100 * GROUP, ScopeQuotas(memory_default=GROUP // 2))
    assert _put(mem, A, 0) is AppendResult.STORED
    assert _held(mem, A, 1) == [0] and mem.scopes.held[A] == GROUP
    assert _put(mem, A, 1) is AppendResult.STORED
    assert _held(mem, A, 2) == [1] and mem.scopes.held[A] == GROUP
    assert mem.scopes.evictions[A] == 1


def test_memory_pinned_group_larger_than_the_tier_within_a_quota() -> None:
    """A pinned Group larger than the whole tier is parked, counted in its scope's books, and
    the quota has nothing of the scope's own in the LRU to evict for it."""
    mem = MemoryStore(GROUP // 2, ScopeQuotas(memory_default=GROUP // 4))
    with mem.pin(_key(A, 0)):
        assert _put(mem, A, 0) is AppendResult.STORED
        assert mem.stats()["pinned_bytes"] == GROUP and mem.scopes.held[A] == GROUP
        assert mem.get(_key(A, 0), Location(0, 0)) is not None
    assert _held(mem, A, 1) == [] and mem.scopes.held == {} and mem.bytes_used == 0


def test_memory_scope_books_follow_discard_and_expiry() -> None:
    """A discarded or expired Group leaves its scope's books and its LRU: later quota
    evictions pick only Groups still held."""
    clock = Clock()
    mem = MemoryStore(100 * GROUP, ScopeQuotas(memory_default=2 * GROUP + GROUP // 2),
                      clock=clock)
    mem.set_cache_duration(_key(A, 1), 10.0)
    _put(mem, A, 0)
    _put(mem, A, 1)
    assert mem.discard_group(_key(A, 0), 0)
    assert mem.scopes.held[A] == GROUP
    clock.now += 10
    assert mem.get(_key(A, 1), Location(0, 0)) is None  # expired
    assert mem.scopes.held == {} and mem.tracks() == [] and mem.bytes_used == 0
    for i in range(2, 5):
        _put(mem, A, i)
    assert _held(mem, A, 5) == [3, 4]
    assert mem.scopes.held[A] == 2 * GROUP and mem.scopes.evictions[A] == 1


def test_memory_scope_books_follow_drop_track() -> None:
    """Dropping a track takes its Groups out of the scope's books and LRU, parked ones
    included, so that later quota evictions pick only Groups still held."""
    mem = MemoryStore(100 * GROUP, ScopeQuotas(memory_default=2 * GROUP + GROUP // 2))
    _put(mem, A, 0)
    _put(mem, A, 1)
    mem.drop_track(_key(A, 0))
    assert mem.scopes.held[A] == GROUP
    _put(mem, A, 2)
    _put(mem, A, 3)
    assert _held(mem, A, 4) == [2, 3] and mem.scopes.evictions[A] == 1
    # B: a pinned track over its quota; the quota's victim is pinned, so it is parked
    mem2 = MemoryStore(100 * GROUP, ScopeQuotas(memory_default=GROUP + GROUP // 2))
    track = _key(B, 0)
    with mem2.pin(track):
        for g in range(2):
            mem2.append(track, StoredObject(g, 0, 0, 0, payload=bytes(PAYLOAD)))
        assert mem2.held_groups(track) == [0, 1] and mem2.stats()["pinned_bytes"] == GROUP
        assert mem2.scopes.held[B] == 2 * GROUP
        mem2.drop_track(track)
        assert mem2.scopes.held == {} and mem2.bytes_used == 0 and mem2.stats()["pinned_bytes"] == 0


def test_memory_group_larger_than_the_tier_leaves_the_books_as_they_were() -> None:
    mem = MemoryStore(4 * GROUP, ScopeQuotas(memory_default=10 * GROUP))
    _put(mem, A, 0)
    big = StoredObject(0, 0, 0, 0, payload=bytes(5 * GROUP))
    assert mem.append(_key(A, 1), big) is AppendResult.NOT_KEPT
    assert mem.scopes.held == {A: GROUP} and mem.tracks() == [_key(A, 0)]
    _put(mem, A, 2)  # the scope's LRU still holds exactly its cached Groups
    assert _held(mem, A, 3) == [0, 2] and mem.scopes.held == {A: 2 * GROUP}
    # A held Group that grows beyond the tier goes as a whole, out of the LRU too: filling
    # the tier then makes room from A's Groups still held
    assert mem.append(_key(A, 0), StoredObject(0, 0, 1, 0, payload=bytes(5 * GROUP))) \
        is AppendResult.NOT_KEPT
    assert _held(mem, A, 3) == [2] and mem.scopes.held == {A: GROUP}
    for i in range(3, 7):
        _put(mem, A, i)
    assert _held(mem, A, 7) == [3, 4, 5, 6] and mem.scopes.evictions == {A: 1}


def test_lmdb_scope_quota_evicts_own_tracks_and_books_survive_reopen(tmp_path: Path) -> None:
    q = ScopeQuotas(lmdb_default=3 * PAYLOAD + PAYLOAD // 2)
    with LmdbStore(tmp_path, 100 * PAYLOAD, quotas=q) as db:
        size = db.commit_track(_key(A, 0), _track())
        for i in range(6):
            db.commit_track(_key(B, i), _track())
        assert db.info(_key(A, 0))
        assert [i for i in range(6) if db.info(_key(B, i))] == [3, 4, 5]
        assert db.scopes.evictions == {B: 3} and db.stats()["evicted_tracks"] == 3
        held = dict(db.scopes.held)
        assert held == {A: size, B: 3 * size}
    with LmdbStore(tmp_path, 100 * PAYLOAD, quotas=q) as db:
        assert db.scopes.held == held


def test_memory_books_charge_the_group_overhead_once() -> None:
    mem = MemoryStore(100 * GROUP, ScopeQuotas(memory_default=10 * GROUP))
    for o in range(3):
        mem.append(_key(A, 0), StoredObject(0, 0, o, 0, payload=bytes(100)))
    assert mem.scopes.held == {A: GROUP_OVERHEAD + 3 * (OBJECT_OVERHEAD + 100)}
    assert mem.scopes.held[A] == mem.bytes_used


def test_lmdb_keeps_no_books_without_an_lmdb_quota(tmp_path: Path) -> None:
    """Quotas for the memory tier only: the LMDB tier keeps no per-scope books (nothing of
    it is exported per scope) and evicts by its global LRU alone."""
    with LmdbStore(tmp_path, 100 * PAYLOAD, quotas=ScopeQuotas(memory_default=GROUP)) as db:
        assert db.quotas is None
        for i in range(3):
            db.commit_track(_key(A, i), _track())
        assert db.scopes.held == {} and db.scopes.evictions == {}


def test_memory_keeps_no_books_without_a_memory_quota() -> None:
    """Quotas for LMDB only: the memory tier keeps no per-scope books and evicts by its
    global LRU alone."""
    mem = MemoryStore(100 * GROUP, ScopeQuotas(lmdb_default=GROUP))
    assert mem.quotas is None
    for i in range(3):
        _put(mem, A, i)
    assert mem.scopes.held == {} and _held(mem, A, 3) == [0, 1, 2]


def test_memory_scope_back_within_its_quota_once_its_pins_are_released() -> None:
    """Pinned Groups may hold a scope over its memory quota (a fill or FETCH is reading them);
    once released, the scope gives up its own LRU Groups at once, not at its next write."""
    q = ScopeQuotas(memory_default=GROUP + GROUP // 2)
    mem = MemoryStore(100 * GROUP, q)
    lease = mem.pin(_key(B, 0))
    for g in range(3):
        mem.append(_key(B, 0), StoredObject(g, 0, 0, 0, payload=bytes(PAYLOAD)))
    assert mem.held_groups(_key(B, 0)) == [0, 1, 2]  # pinned: kept over the quota
    lease.release()
    assert mem.scopes.held[B] <= GROUP + GROUP // 2
    assert len(mem.held_groups(_key(B, 0))) == 1 and mem.scopes.evictions[B] == 2


def test_lmdb_full_tier_evicts_the_writing_scopes_own_tracks_first(tmp_path: Path) -> None:
    """Quotas on but far from reached; the tier itself full. B writing into it gives up its
    own least recently used Tracks, never A's older one (not the tier's global LRU)."""
    q = ScopeQuotas(lmdb_default=100 * PAYLOAD)
    with LmdbStore(tmp_path / "probe", 100 * PAYLOAD) as probe:
        size = probe.commit_track(_key(A, 0), _track())  # one Track's bytes
    with LmdbStore(tmp_path / "db", 3 * size + size // 2, quotas=q) as db:
        db.commit_track(_key(A, 0), _track())  # the least recently used of the whole tier
        for i in range(6):
            db.commit_track(_key(B, i), _track())
        assert db.info(_key(A, 0)) is not None
        assert [i for i in range(6) if db.info(_key(B, i))] == [4, 5]
        assert db.scopes.evictions == {B: 4}
        assert db.scopes.held == {A: size, B: 2 * size}


def test_lmdb_scope_at_exactly_its_quota_keeps_every_track(tmp_path: Path) -> None:
    """A quota of exactly three Tracks holds three: a scope gives up Tracks only beyond it."""
    with LmdbStore(tmp_path / "probe", 100 * PAYLOAD) as probe:
        size = probe.commit_track(_key(A, 0), _track())
    with LmdbStore(tmp_path / "db", 100 * PAYLOAD,
                   quotas=ScopeQuotas(lmdb_default=3 * size)) as db:
        for i in range(3):
            db.commit_track(_key(A, i), _track())
        assert [i for i in range(3) if db.info(_key(A, i))] == [0, 1, 2]
        assert db.scopes.evictions == {} and db.scopes.held == {A: 3 * size}
        assert db.stats()["bytes_used"] == 3 * size
        db.commit_track(_key(A, 3), _track())
        assert [i for i in range(4) if db.info(_key(A, i))] == [1, 2, 3]


def test_lmdb_scope_quota_of_its_own_bounds_it_and_leaves_unbounded_scopes_alone(
        tmp_path: Path) -> None:
    """No default: A has a quota of its own (one Track, exactly), B none at all."""
    with LmdbStore(tmp_path / "probe", 100 * PAYLOAD) as probe:
        size = probe.commit_track(_key(A, 0), _track())
    q = ScopeQuotas(overrides={A: (None, size)})
    with LmdbStore(tmp_path / "db", 100 * PAYLOAD, quotas=q) as db:
        for i in range(3):
            db.commit_track(_key(A, i), _track())
            db.commit_track(_key(B, i), _track())
        assert [i for i in range(3) if db.info(_key(A, i))] == [2]
        assert [i for i in range(3) if db.info(_key(B, i))] == [0, 1, 2]
        assert db.scopes.held == {A: size, B: 3 * size}
