"""Range reads and walks of every tier against a brute-force reference model (hypothesis)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import (
    describe,
    end_track,
    flat,
    full_track,
    reference_walk,
    resolve_fetch,
    track_key,
)

from storage.interface import (
    OBJECT_MAX,
    GroupOrder,
    Location,
    ObjectStatus,
    Span,
    SpanKind,
    StoredObject,
    Tier,
)
from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from storage.tiered import TieredStore

_names = itertools.count()


@st.composite
def tracks(draw: st.DrawFn) -> tuple[list[list[StoredObject]], bool]:
    """A consistent whole track (sometimes with no End of Track: then the last Group is open)."""
    sizes = draw(st.lists(st.integers(0, 6), min_size=0, max_size=5))
    eot_objects = draw(st.integers(0, 3))
    track = full_track(sizes, size=draw(st.integers(0, 40)), eot_objects=eot_objects,
                       salt=draw(st.integers(0, 9)))
    ended = draw(st.booleans())
    if not ended:
        track[-1] = track[-1][:-1]  # drop End of Track
    return track, ended


@st.composite
def id_filters(draw: st.DrawFn) -> list[tuple[int, int | None]] | None:
    if draw(st.booleans()):
        return None
    out: list[tuple[int, int | None]] = []
    for _ in range(draw(st.integers(1, 3))):
        lo = draw(st.integers(0, 9))
        hi = draw(st.one_of(st.none(), st.integers(lo, 12)))
        out.append((lo, hi))
    return out


@st.composite
def location_filters(draw: st.DrawFn) -> tuple[int, tuple[int, ...]]:
    ftype = draw(st.sampled_from([0x00, 0x01, 0x02, 0x03, 0x04, 0x05]))
    if ftype in (0x00, 0x05):
        return ftype, ()
    if ftype == 0x01:
        return ftype, (draw(st.integers(0, 8)),)
    sg, so = draw(st.integers(0, 7)), draw(st.integers(0, 8))
    if ftype == 0x02:
        return ftype, (sg, so)
    if ftype == 0x03:
        return ftype, (sg, so, draw(st.integers(0, 6)))
    return ftype, (sg, so, draw(st.integers(0, 6)), draw(st.integers(0, 9)))


@st.composite
def raw_ranges(draw: st.DrawFn) -> tuple[Location, Location | None]:
    """Unclipped start/end (end past the Largest Object, open end, group end)."""
    start = Location(draw(st.integers(0, 9)), draw(st.integers(0, 9)))
    end = draw(st.one_of(
        st.none(),
        st.builds(Location, st.integers(0, 11), st.integers(0, 10)),
        st.builds(Location, st.integers(0, 11), st.just(OBJECT_MAX)),
    ))
    return start, end


orders = st.sampled_from([GroupOrder.ASCENDING, GroupOrder.DESCENDING])


def _model(objs: list[StoredObject]) -> tuple[dict[Location, StoredObject], Location | None]:
    held = {o.location: o for o in objs}
    eot = next((o.location for o in objs if o.status == ObjectStatus.END_OF_TRACK), None)
    return held, eot


@settings(max_examples=300, deadline=None)
@given(track=tracks(), keep=st.lists(st.booleans(), min_size=60, max_size=60),
       perm=st.randoms(use_true_random=False), filt=location_filters(), raw=raw_ranges(),
       use_filter=st.booleans(), order=orders, ids=id_filters(), include_status=st.booleans())
def test_memory_walk_matches_reference(track, keep, perm, filt, raw, use_filter, order, ids,
                                       include_status) -> None:
    groups, _ = track
    received = [o for o, k in zip(flat(groups), itertools.cycle(keep), strict=False) if k]
    perm.shuffle(received)  # arrival order must not matter
    mem = MemoryStore(1 << 30)
    t = track_key(0)
    for o in received:
        mem.append(t, o)
    held, eot = _model(received)
    largest = max(held, default=None)
    assert mem.largest_object(t) == largest
    assert mem.known_final(t) == eot
    if use_filter:
        if largest is None:
            return
        start, end = resolve_fetch(*filt, largest)
    else:
        start, end = raw
    stop = end if end is not None else largest
    if stop is None:
        assert list(mem.walk(t, start, end, order, ids)) == []
        return
    want = reference_walk(held, eot, start, stop, order, ids, include_status)
    got = list(mem.walk(t, start, end, order, ids, include_status))
    assert describe(got) == describe(want)
    want_objs = [i for i in reference_walk(held, eot, start, stop, order, ids, True)
                 if not isinstance(i, Span)]
    assert describe(mem.read(t, start, end, order, ids)) == describe(want_objs)


@pytest.fixture(scope="module")
def durable(tmp_path_factory: pytest.TempPathFactory) -> LmdbStore:
    store = LmdbStore(tmp_path_factory.mktemp("walk") / "db", capacity=1 << 30)
    yield store
    store.close()


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(track=tracks(), filt=location_filters(), raw=raw_ranges(), use_filter=st.booleans(),
       order=orders, ids=id_filters(), include_status=st.booleans(),
       evict=st.lists(st.booleans(), min_size=8, max_size=8))
def test_lmdb_and_tiered_walk_match_reference(durable: LmdbStore, track, filt, raw, use_filter,
                                              order, ids, include_status, evict) -> None:
    groups, ended = track
    if not ended:
        return
    t = track_key(next(_names), ns=b"walk")
    mem = MemoryStore(1 << 30)
    for o in flat(groups):
        mem.append(t, o)
    tiered = TieredStore(mem, durable)
    assert tiered.durable.commit_track(t, tiered.memory.complete_track(t)) > 0  # type: ignore[union-attr, arg-type]
    # Memory loses some Groups: the tiered walk must fill them from LMDB, per Group.
    for g, drop in zip(range(len(groups)), evict, strict=False):
        if drop:
            assert mem.discard_group(t, g)
    held, eot = _model(flat(groups))
    largest = max(held)
    if use_filter:
        start, end = resolve_fetch(*filt, largest)
    else:
        start, end = raw
    stop = end if end is not None else largest
    want = describe(reference_walk(held, eot, start, stop, order, ids, include_status))
    with durable.session() as s:
        assert describe(s.walk(t, start, end, order, ids, include_status)) == want
        want_objs = [i for i in reference_walk(held, eot, start, stop, order, ids, True)
                     if not isinstance(i, Span)]
        assert describe(s.read(t, start, end, order, ids)) == describe(want_objs)
    with tiered.reader() as r:
        items = list(r.walk(t, start, end, order, ids, include_status))
        assert describe(i for _, i in items) == want
        for tier, item in items:
            if isinstance(item, Span):
                assert tier is Tier.NONE and item.kind is SpanKind.NON_EXISTENT
            else:
                whole_in_memory = mem.group(t, item.group, touch=False) is not None
                assert tier is (Tier.MEMORY if whole_in_memory else Tier.LMDB)


def test_walk_over_a_huge_group_range_is_cheap() -> None:
    mem = MemoryStore(1 << 20)
    t = track_key(1)
    mem.append(t, StoredObject(5, 0, 0, 1, payload=b"x"))
    mem.append(t, StoredObject(10**12, 0, 0, 1, payload=b"y"))
    end_track(mem, t, 10**12 + 1)
    items = list(mem.walk(t, Location(0, 0), Location(10**15, 3)))
    spans = [i for i in items if isinstance(i, Span)]
    assert [(s.kind, s.start, s.end) for s in spans] == [
        (SpanKind.UNKNOWN, Location(0, 0), Location(4, OBJECT_MAX)),
        (SpanKind.UNKNOWN, Location(5, 1), Location(10**12 - 1, OBJECT_MAX)),
        (SpanKind.UNKNOWN, Location(10**12, 1), Location(10**12, OBJECT_MAX)),
        (SpanKind.NON_EXISTENT, Location(10**12 + 1, 0), Location(10**15, 3)),
    ]
    desc = list(mem.walk(t, Location(0, 0), Location(10**12, 0), GroupOrder.DESCENDING))
    assert isinstance(desc[0], StoredObject) and desc[0].group == 10**12
    assert desc[1] == Span(SpanKind.UNKNOWN, Location(10**12 - 1, 0), Location(6, OBJECT_MAX))


def test_kvcs_layer_fetch_with_objectid_filter(tmp_path: Path) -> None:
    """KVCS §5.3: layers a..b = filter 0x03 {a, 0, b-a}, Ascending, OBJECTID_FILTER 0..n-1."""
    groups = full_track([8] * 6, size=64)
    t = track_key(2)
    store = LmdbStore(tmp_path / "db", capacity=1 << 24)
    mem = MemoryStore(1 << 24)
    for o in flat(groups):
        mem.append(t, o)
    store.commit_track(t, groups)
    start, end = resolve_fetch(0x03, (2, 0, 2), Location(6, 0))
    want = [(g, o) for g in range(2, 5) for o in range(4)]
    with store.session() as s:
        got = [(o.group, o.object_id) for o in s.walk(t, start, end, object_ids=[(0, 3)])
               if isinstance(o, StoredObject)]
        assert got == want
    got_mem = [(o.group, o.object_id) for o in mem.walk(t, start, end, object_ids=[(0, 3)])
               if isinstance(o, StoredObject)]
    assert got_mem == want
    store.close()


def test_an_end_of_track_group_memory_lost_is_served_from_lmdb(durable: LmdbStore) -> None:
    """Found by the walk property test: memory still knows the End of Track after its Group
    was evicted, so it called itself complete and the tiered walk reported the End of Track
    Location as not existing (or unknown) instead of reading that Group from LMDB."""
    t = track_key(next(_names), ns=b"walk")
    mem = MemoryStore(1 << 30)
    statuses = (ObjectStatus.END_OF_GROUP, ObjectStatus.END_OF_GROUP, ObjectStatus.END_OF_TRACK)
    for g, status in enumerate(statuses):
        mem.append(t, StoredObject(g, 0, 0, 7, status, b"", b""))
    tiered = TieredStore(mem, durable)
    assert tiered.durable.commit_track(t, tiered.memory.complete_track(t)) > 0  # type: ignore[union-attr, arg-type]
    assert mem.discard_group(t, 2)
    with tiered.reader() as r:
        items = list(r.walk(t, Location(0, 0), None, GroupOrder.ASCENDING, None, True))
    tier, last = items[-1]
    assert isinstance(last, StoredObject) and last.status == ObjectStatus.END_OF_TRACK
    assert tier == Tier.LMDB
    # and a tier that does not hold the Group never calls the End of Track Location absent
    spans = [i for _, i in items if isinstance(i, Span)]
    assert all(not (s.start <= Location(2, 0) <= s.end) for s in spans)
