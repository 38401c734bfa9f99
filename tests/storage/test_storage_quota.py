"""Per-scope quotas of the memory and LMDB tiers (storage/quota.py), without a relay: a
scope over its quota or writing into a full tier gives up its own LRU data, never another
scope's; LMDB's books survive a reopen."""

from __future__ import annotations

from pathlib import Path

from storage.interface import ObjectStatus, StoredObject
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


def test_lmdb_scope_quota_evicts_own_tracks_and_books_survive_reopen(tmp_path: Path) -> None:
    q = ScopeQuotas(lmdb_default=3 * PAYLOAD + PAYLOAD // 2)
    with LmdbStore(tmp_path, 100 * PAYLOAD, quotas=q) as db:
        size = db.commit_track(_key(A, 0), _track())
        for i in range(6):
            db.commit_track(_key(B, i), _track())
        assert db.info(_key(A, 0))
        assert [i for i in range(6) if db.info(_key(B, i))] == [3, 4, 5]
        assert db.scopes.evictions == {B: 3}
        held = dict(db.scopes.held)
        assert held == {A: size, B: 3 * size}
    with LmdbStore(tmp_path, 100 * PAYLOAD, quotas=q) as db:
        assert db.scopes.held == held
