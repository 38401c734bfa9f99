"""Tiered store: memory first, LMDB per Group, explicit commits, tier reporting."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_helpers import describe, flat, full_track, track_key, unknown_spans

from storage.interface import (
    OBJECT_MAX,
    GroupOrder,
    IncompleteTrackError,
    Location,
    Span,
    SpanKind,
    StorageFullError,
    Tier,
)
from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from storage.tiered import TieredStore

T = track_key(0)


@pytest.fixture
def tiered(tmp_path: Path) -> TieredStore:
    store = TieredStore(MemoryStore(64 << 20), LmdbStore(tmp_path / "db", capacity=64 << 20))
    yield store
    store.close()


def _commit(store: TieredStore) -> int:
    """What the relay does (relay/core/relay.py): the whole track from memory, to LMDB."""
    groups = store.memory.complete_track(T)
    if groups is None:
        raise IncompleteTrackError("not complete in memory, or aborted")
    assert store.durable is not None
    return store.durable.commit_track(T, groups)


def _read_copy(store: TieredStore, start: Location, end: Location | None = None,
               order: GroupOrder = GroupOrder.ASCENDING) -> list:
    with store.reader() as r:
        return [(t, o.copy()) for t, o in r.read(T, start, end, order)]


def _fill(store: TieredStore, groups: list, skip: int | None = None) -> None:
    for i, o in enumerate(flat(groups)):
        if i != skip:
            store.append(T, o)


def test_commit_refuses_incomplete_and_aborted(tiered: TieredStore) -> None:
    groups = full_track([3, 3])
    _fill(tiered, groups, skip=2)  # a gap
    assert tiered.memory.complete_track(T) is None
    tiered.append(T, flat(groups)[2])
    assert tiered.memory.complete_track(T) is not None
    tiered.abort(T)
    assert tiered.memory.complete_track(T) is None and tiered.memory.is_aborted(T)
    assert tiered.durable is not None and tiered.durable.tracks() == []


def test_commit_without_end_of_track_is_refused(tiered: TieredStore) -> None:
    groups = full_track([3])
    _fill(tiered, [groups[0]])
    assert not tiered.is_complete(T)
    with pytest.raises(IncompleteTrackError):
        _commit(tiered)


def test_reads_prefer_memory_then_lmdb_per_group(tiered: TieredStore) -> None:
    groups = full_track([4, 4, 4], size=100)
    _fill(tiered, groups)
    assert _commit(tiered) > 0
    with tiered.reader() as r:
        assert {tier for tier, _ in r.read(T, Location(0, 0))} == {Tier.MEMORY}
    tiered.memory.discard_group(T, 1)
    with tiered.reader() as r:
        served = [(tier, o.group) for tier, o in r.read(T, Location(0, 0))]
        assert {(t, g) for t, g in served} == {(Tier.MEMORY, 0), (Tier.LMDB, 1),
                                               (Tier.MEMORY, 2), (Tier.MEMORY, 3)}
        objs = [o for _, o in r.read(T, Location(0, 0))]
        assert describe(objs) == describe(flat(groups))
    tiered.memory.drop_track(T)  # memory lost everything: LMDB alone answers
    assert tiered.is_complete(T)
    assert tiered.known_final(T) == Location(3, 0)
    assert tiered.largest_object(T) == Location(3, 0)
    assert tiered.group_end(T, 1) == 4
    with tiered.reader() as r:
        assert unknown_spans(r.walk(T, Location(0, 0), include_status=True)) == []
    got = _read_copy(tiered, Location(1, 2), Location(2, 1), GroupOrder.DESCENDING)
    assert [(t, o.location) for t, o in got] == [
        (Tier.LMDB, Location(2, 0)), (Tier.LMDB, Location(2, 1)),
        (Tier.LMDB, Location(1, 2)), (Tier.LMDB, Location(1, 3)), (Tier.LMDB, Location(1, 4))]


def test_walk_reports_unknown_and_nonexistent_for_a_live_track(tiered: TieredStore) -> None:
    groups = full_track([3, 3, 3])
    objs = flat(groups)
    for o in objs[:4] + objs[5:8]:  # Group 0 whole, {1, 0} missing, Group 2 not yet started
        tiered.append(T, o)
    with tiered.reader() as r:
        items = list(r.walk(T, Location(0, 0), Location(2, OBJECT_MAX)))
    spans = [i for _, i in items if isinstance(i, Span)]
    assert spans == [
        Span(SpanKind.NON_EXISTENT, Location(0, 3), Location(0, OBJECT_MAX)),
        Span(SpanKind.UNKNOWN, Location(1, 0), Location(1, 0)),
        Span(SpanKind.NON_EXISTENT, Location(1, 3), Location(1, OBJECT_MAX)),
        Span(SpanKind.UNKNOWN, Location(2, 0), Location(2, OBJECT_MAX)),
    ]
    assert all(t is Tier.MEMORY for t, i in items if not isinstance(i, Span))
    assert all(t is Tier.NONE for t, i in items if isinstance(i, Span))


def test_lmdb_full_keeps_memory_serving(tmp_path: Path) -> None:
    store = TieredStore(MemoryStore(64 << 20), LmdbStore(tmp_path / "db", capacity=2048))
    groups = full_track([8], size=1024)
    _fill(store, groups)
    with pytest.raises(StorageFullError):
        _commit(store)
    assert describe(o for _, o in _read_copy(store, Location(0, 0))) == describe(flat(groups))
    store.close()


def test_memory_only_store(tmp_path: Path) -> None:
    store = TieredStore(MemoryStore(1 << 20))
    _fill(store, full_track([2]))
    assert store.durable is None and store.is_complete(T)
    assert store.stats()["memory"]["tracks"] == 1
