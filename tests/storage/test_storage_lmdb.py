"""LMDB tier: whole tracks only, restart, LRU eviction that survives restart, max age, full map."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest
from fake_clock import Clock
from storage_helpers import describe, flat, full_track, reference_walk, track_key

from storage.interface import (
    GroupOrder,
    IncompleteTrackError,
    Location,
    ObjectStatus,
    StorageError,
    StorageFullError,
    StoredObject,
    TrackTooLargeError,
)
from storage.lmdb_store import LmdbStore

KiB = 1024


def _stored(store: LmdbStore, t: tuple) -> list[tuple]:
    with store.session() as s:
        return describe(o.copy() for o in s.read(t, Location(0, 0)))


def test_commit_reopen_bit_identical(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, capacity=64 << 20)
    tracks = {track_key(i): full_track([5, 0, 7], size=300, salt=i, eot_objects=i % 2)
              for i in range(5)}
    for t, groups in tracks.items():
        assert store.commit_track(t, groups) > 0
    assert store.commit_track(track_key(0), tracks[track_key(0)]) == 0  # already held
    used = store.stats()["bytes_used"]
    store.close()
    store = LmdbStore(tmp_path, capacity=64 << 20)
    assert store.stats()["bytes_used"] == used
    assert sorted(store.tracks()) == sorted(tracks)
    for t, groups in tracks.items():
        assert _stored(store, t) == describe(flat(groups))
        info = store.info(t)
        assert info is not None and info.complete and info.groups == len(groups)
        assert info.end_of_track == flat(groups)[-1].location
    store.close()


def test_a_store_opens_in_a_new_nested_directory_and_syncs_its_commits(
        tmp_path: Path) -> None:
    """The directory is made with its parents; by default each commit is flushed to disk
    (LMDB's sync; only the meta page's flush is left to the OS, metasync off), and the map
    may grow to twice the capacity plus 16 MiB (B-tree pages, page rounding, pages freed
    while readers still need them)."""
    store = LmdbStore(tmp_path / "a" / "b", capacity=1 << 20)
    assert store.stats()["map_limit"] == 2 * (1 << 20) + (16 << 20)
    flags = store._env.flags()
    assert flags["sync"] and not flags["metasync"]
    assert not flags["readahead"]  # Groups are read at random: no OS readahead
    store.commit_track(track_key(0), full_track([1]))
    assert store.tracks() == [track_key(0)]
    store.close()
    store = LmdbStore(tmp_path / "c", capacity=1 << 20, sync=False)  # asked not to sync
    assert not store._env.flags()["sync"]
    store.close()


def test_a_reopened_store_starts_from_the_map_it_had_grown_to(tmp_path: Path) -> None:
    """A map an earlier run grew is reopened at least at its file's size, not at
    ``initial_map_size``, and grows on from there."""
    def open_store() -> LmdbStore:
        return LmdbStore(tmp_path, capacity=1 << 30, map_limit=4 << 20,
                         initial_map_size=256 * KiB)

    groups = full_track([16], size=32 * KiB)  # ~400 KiB per track
    store = open_store()
    for i in range(3):
        store.commit_track(track_key(i), groups)
    assert store.stats()["map_size"] > 256 * KiB
    store.close()
    on_disk = (tmp_path / "data.mdb").stat().st_size
    store = open_store()
    assert store.stats()["map_size"] == on_disk > 256 * KiB
    for i in range(3, 6):
        store.commit_track(track_key(i), groups)
    assert store.tracks() == [track_key(i) for i in range(6)]
    assert store.stats()["map_size"] > on_disk
    store.close()


def test_the_files_layout_is_the_documented_one(tmp_path: Path) -> None:
    """The named databases and counters of the module's docstring: what a data directory
    an earlier run (or another version) wrote holds, read with LMDB alone."""
    clock = Clock()
    store = LmdbStore(tmp_path, capacity=1 << 20, clock=clock)
    groups = full_track([2, 1])
    size = store.commit_track(track_key(0), groups, properties=b"props",
                              expires_at=clock.now + 60)
    store.close()
    env = lmdb.open(str(tmp_path), readonly=True, lock=False, max_dbs=8)
    try:
        with env.begin() as txn:
            entries = {name.decode(): txn.stat(env.open_db(name, txn=txn, create=False))[
                "entries"] for name in (b"names", b"tracks", b"expiry", b"groups", b"lru",
                                         b"props")}
            counters = {k.decode(): int.from_bytes(txn.get(k), "big")
                        for k in (b"next_id", b"seq", b"bytes")}
    finally:
        env.close()
    assert entries == {"names": 1, "tracks": 1, "expiry": 1, "groups": len(groups), "lru": 1,
                       "props": 1}
    assert counters == {"next_id": 2, "seq": 1, "bytes": size}


def test_long_binary_track_names(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, capacity=1 << 20)
    t = (tuple(bytes([i]) * 200 for i in range(10)), b"\x00\xff" * 300)  # > 511-byte LMDB keys
    store.commit_track(t, full_track([1]))
    assert store.tracks() == [t] and store.info(t)
    assert not store.info((t[0], b"other"))
    store.close()


@pytest.mark.parametrize("breakage", ["gap", "no_end_of_track", "no_end_of_group", "empty",
                                      "wrong_group", "last_ends_in_end_of_group",
                                      "last_ends_in_normal_object", "end_of_track_too_early",
                                      "object_after_end_of_track"])
def test_incomplete_tracks_are_never_written(tmp_path: Path, breakage: str) -> None:
    # The last Group of a committed Track must end in End of Track: a Track whose last Group
    # ends in End of Group, or in a normal Object, may still grow.
    groups = full_track([3, 3], eot_objects=2)
    if breakage == "gap":
        del groups[1][1]
    elif breakage == "no_end_of_track":
        groups[-1].pop()
        groups[-1].pop()
        groups[-1].pop()
    elif breakage == "last_ends_in_end_of_group":
        groups.pop()
    elif breakage == "last_ends_in_normal_object":
        groups[-1].pop()
    elif breakage == "end_of_track_too_early":
        groups[0][-1] = StoredObject(0, 0, 3, 7, ObjectStatus.END_OF_TRACK)
    elif breakage == "object_after_end_of_track":
        groups[-1].append(StoredObject(2, 0, 3, 7, payload=b"late"))
    elif breakage == "no_end_of_group":
        groups[0].pop()
    elif breakage == "empty":
        groups = []
    else:
        groups[0][0] = StoredObject(5, 0, 0, 7, payload=b"x")
    store = LmdbStore(tmp_path, capacity=1 << 20)
    with pytest.raises(IncompleteTrackError):
        store.commit_track(track_key(0), groups)
    assert store.tracks() == [] and store.stats()["bytes_used"] == 0
    assert store.stats()["groups"] == 0
    store.close()


def test_lru_eviction_order_survives_restart(tmp_path: Path) -> None:
    clock = Clock()
    groups = full_track([4, 4], size=2 * KiB)
    size = LmdbStore(tmp_path / "probe", capacity=1 << 20).commit_track(track_key(99), groups)
    capacity = 3 * size
    store = LmdbStore(tmp_path / "db", capacity=capacity, clock=clock)
    for i in range(3):
        clock.now += 1
        store.commit_track(track_key(i), groups)
    with store.session() as s:  # reading track 0 makes it the most recently used
        assert s.read(track_key(0), Location(0, 0)) is not None
        assert s.group(track_key(0), 1) is not None
    store.close()  # the use is persisted on close
    store = LmdbStore(tmp_path / "db", capacity=capacity, clock=clock)
    assert store.tracks() == [track_key(1), track_key(2), track_key(0)]
    store.commit_track(track_key(3), groups)
    assert store.tracks() == [track_key(2), track_key(0), track_key(3)]
    assert store.stats()["bytes_used"] == 3 * size <= capacity
    assert store.stats()["evicted_tracks"] == 1
    assert store.stats()["groups"] == 3 * len(groups)  # no Group of track 1 left behind
    store.close()


def test_uses_since_the_last_write_keep_their_order_not_the_track_ids(tmp_path: Path) -> None:
    """Uses recorded by readers between writes are written in the order they happened: a
    track read after another is the more recently used, whatever their track ids."""
    clock = Clock()
    groups = full_track([2], size=KiB)
    store = LmdbStore(tmp_path, capacity=1 << 20, clock=clock)
    for i in range(3):
        store.commit_track(track_key(i), groups)
    for i in (1, 0):  # track 1 used first, then track 0 (the lower id)
        clock.now += 1
        with store.session() as s:
            assert s.info(track_key(i)) is not None
    store.flush_usage()
    assert store.tracks() == [track_key(2), track_key(1), track_key(0)]
    store.close()


def test_a_use_of_a_track_removed_meanwhile_loses_no_later_use(tmp_path: Path) -> None:
    """A read session opened before a track was deleted still sees it and records a use of
    it; writing the uses skips that one and keeps the later ones."""
    clock = Clock()
    groups = full_track([2], size=KiB)
    store = LmdbStore(tmp_path, capacity=1 << 20, clock=clock)
    for i in range(3):
        store.commit_track(track_key(i), groups)
    with store.session() as old:
        assert store.delete_track(track_key(0))
        clock.now += 1
        assert old.info(track_key(0)) is not None  # its snapshot predates the delete
    clock.now += 1
    with store.session() as s:
        assert s.info(track_key(1)) is not None
    store.flush_usage()
    assert store.tracks() == [track_key(2), track_key(1)]
    store.close()


def test_track_larger_than_capacity_is_refused(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, capacity=4 * KiB)
    with pytest.raises(StorageFullError):
        store.commit_track(track_key(0), full_track([8], size=2 * KiB))
    assert store.tracks() == []
    store.close()


def test_a_track_of_exactly_the_capacity_fits(tmp_path: Path) -> None:
    groups = full_track([8], size=2 * KiB)
    size = LmdbStore(tmp_path / "probe", capacity=1 << 20).commit_track(track_key(0), groups)
    store = LmdbStore(tmp_path / "db", capacity=size)
    assert store.commit_track(track_key(0), groups) == size == store.stats()["bytes_used"]
    store.close()


def test_a_byte_counter_that_is_off_heals_on_the_next_commit(tmp_path: Path) -> None:
    """Counted bytes with no track left to evict (a counter written wrong): the commit
    starts again from zero instead of refusing every track."""
    store = LmdbStore(tmp_path, capacity=1 << 20)
    with store._env.begin(write=True) as txn:
        txn.put(b"bytes", (1 << 30).to_bytes(8, "big"))
    size = store.commit_track(track_key(0), full_track([2]))
    assert size > 0 and store.stats()["bytes_used"] == size
    store.close()


def test_max_age_counts_from_the_creation_time_given(tmp_path: Path) -> None:
    clock = Clock()
    store = LmdbStore(tmp_path, capacity=1 << 20, max_age=60.0, clock=clock)
    store.commit_track(track_key(0), full_track([1]), created=clock.now - 50)
    assert store.next_expiry() == clock.now + 10
    clock.now += 10
    assert store.info(track_key(0)) is None
    store.close()


def test_max_age_with_injected_clock(tmp_path: Path) -> None:
    clock = Clock()
    store = LmdbStore(tmp_path, capacity=1 << 20, max_age=60.0, clock=clock)
    store.commit_track(track_key(0), full_track([2]))
    clock.now += 30
    store.commit_track(track_key(1), full_track([2]))
    clock.now += 31  # track 0 is 61 s old, track 1 31 s
    assert not store.info(track_key(0)) and store.info(track_key(1))
    assert store.tracks() == [track_key(1)]
    assert store.expire() == 1
    assert store.stats()["tracks"] == 1
    clock.now += 30
    store.commit_track(track_key(2), full_track([2]))  # a commit purges what expired
    assert store.tracks() == [track_key(2)]
    assert store.stats()["groups"] == 2
    store.close()


def test_expiry_time_committed_with_a_track(tmp_path: Path) -> None:
    """MAX_CACHE_DURATION: a track committed with an expiry time is invisible from then on,
    purged by expire(), and next_expiry() says when the next one is due."""
    clock = Clock()
    store = LmdbStore(tmp_path, capacity=1 << 20, clock=clock)
    assert store.next_expiry() is None
    store.commit_track(track_key(0), full_track([2]), expires_at=clock.now + 10)
    store.commit_track(track_key(1), full_track([2]), expires_at=clock.now + 20)
    store.commit_track(track_key(2), full_track([2]))  # no expiry: stays
    assert store.next_expiry() == clock.now + 10
    clock.now += 10
    assert not store.info(track_key(0)) and store.info(track_key(1))
    assert store.tracks() == [track_key(1), track_key(2)]
    assert store.expire() == 1
    assert store.next_expiry() == clock.now + 10
    store.close()
    store = LmdbStore(tmp_path, capacity=1 << 20, clock=clock)  # the time survives restart
    clock.now += 10
    assert store.expire() == 1 and store.tracks() == [track_key(2)]
    assert store.next_expiry() is None and store.stats()["groups"] == 2
    store.close()


def test_map_grows_then_evicts_then_reports_full(tmp_path: Path) -> None:
    # Capacity far above the map limit: only the map can run out here.
    store = LmdbStore(tmp_path, capacity=1 << 30, map_limit=2 << 20,
                      initial_map_size=256 * KiB)
    groups = full_track([16], size=32 * KiB)  # ~400 KiB per track
    for i in range(12):
        store.commit_track(track_key(i), groups)
    stats = store.stats()
    assert stats["map_size"] == stats["map_limit"] == 2 << 20  # grew to the limit
    assert stats["capacity"] == 1 << 30
    assert stats["evicted_tracks"] > 0  # then made room by evicting least recently used
    kept = store.tracks()
    assert kept and kept[-1] == track_key(11)
    assert stats["evicted_tracks"] == 12 - len(kept)  # each track evicted counted once
    for t in kept:
        assert _stored(store, t) == describe(flat(groups))
    with pytest.raises(StorageFullError):
        store.commit_track(track_key(50), full_track([80], size=48 * KiB))  # > the whole map
    assert not store.info(track_key(50))
    assert store.stats()["bytes_used"] == sum(store.info(t).nbytes for t in store.tracks())  # type: ignore[union-attr]
    store.close()


def test_map_grows_only_once_no_read_session_is_open(tmp_path: Path) -> None:
    """A session held past ``resize_wait`` (here by the committing thread itself) makes a
    commit that needs a larger map fail, retryably, and leaves its views intact; once the
    session is closed the same commit grows the map."""
    store = LmdbStore(tmp_path, capacity=1 << 30, map_limit=4 << 20,
                      initial_map_size=128 * KiB, resize_wait=0.05)
    store.commit_track(track_key(0), full_track([1]))
    with store.session() as s:
        view = s.group(track_key(0), 0)
        assert view is not None
        with pytest.raises(StorageFullError, match="read sessions") as refused:
            store.commit_track(track_key(1), full_track([16], size=32 * KiB))
        assert not isinstance(refused.value, TrackTooLargeError)  # worth a retry
        assert bytes(next(view.objects()).payload) == bytes(full_track([1])[0][0].payload)
        assert store.stats()["map_size"] == 128 * KiB
    store.commit_track(track_key(1), full_track([16], size=32 * KiB))  # now it may grow
    grown = store.stats()["map_size"] // (128 * KiB)
    assert grown > 1 and grown & (grown - 1) == 0  # doubled, as often as needed
    store.close()


def test_a_resize_waits_for_a_read_session_on_another_thread(tmp_path: Path) -> None:
    """The writer thread owns the resize: it waits for the session another thread holds,
    and new sessions wait for the resize, so no view ever points into an unmapped map."""
    store = LmdbStore(tmp_path, capacity=1 << 30, map_limit=4 << 20,
                      initial_map_size=128 * KiB, resize_wait=30.0)
    store.commit_track(track_key(0), full_track([1]))
    expected = bytes(full_track([1])[0][0].payload)
    with store.session() as s:
        view = s.group(track_key(0), 0)
        assert view is not None
        commit = store.submit(store.commit_track, track_key(1),
                              full_track([16], size=32 * KiB))
        with store._gate._cond:  # the writer is now waiting for this session to close
            assert store._gate._cond.wait_for(lambda: store._gate.resizing, 10.0)
        assert not commit.done()
        assert bytes(next(view.objects()).payload) == expected
    assert commit.result(10.0) > 0
    assert store.stats()["map_size"] > 128 * KiB
    assert _stored(store, track_key(1)) == describe(flat(full_track([16], size=32 * KiB)))
    store.close()


def test_a_thread_inside_a_session_opens_another_during_a_pending_resize(
        tmp_path: Path) -> None:
    """A thread already holding a session may open another while the writer waits to
    resize (for that very session): waiting there would deadlock the two."""
    store = LmdbStore(tmp_path, capacity=1 << 30, map_limit=4 << 20,
                      initial_map_size=128 * KiB, resize_wait=2.0)
    store.commit_track(track_key(0), full_track([1]))
    with store.session() as s:
        assert s.info(track_key(0)) is not None
        commit = store.submit(store.commit_track, track_key(1),
                              full_track([16], size=32 * KiB))
        with store._gate._cond:  # the writer is now waiting for this session to close
            assert store._gate._cond.wait_for(lambda: store._gate.resizing, 10.0)
        with store.session() as nested:
            assert nested.info(track_key(0)) is not None
        assert not commit.done()
    assert commit.result(10.0) > 0  # the resize went ahead once both were closed
    assert store.stats()["map_size"] > 128 * KiB
    store.close()


def test_a_new_read_session_waits_for_a_pending_resize(tmp_path: Path) -> None:
    """A session opened while the writer waits to resize (for another thread's session)
    waits for the resize, also on a thread that held and closed sessions before: it then
    sees the grown map, and its views are never remapped under it."""
    import threading
    import time

    store = LmdbStore(tmp_path, capacity=1 << 30, map_limit=4 << 20,
                      initial_map_size=128 * KiB, resize_wait=2.0)
    store.commit_track(track_key(0), full_track([1]))
    gate = store._gate
    holding, release, go, entered = (threading.Event() for _ in range(4))
    seen: list[int] = []

    def holder() -> None:
        with store.session():
            holding.set()
            release.wait(10.0)

    def reader() -> None:
        with store.session() as s:  # an earlier session of this thread, closed
            assert s.info(track_key(0)) is not None
        go.wait(10.0)
        with store.session():
            entered.set()
            seen.append(store._env.info()["map_size"])

    threads = [threading.Thread(target=holder), threading.Thread(target=reader)]
    threads[0].start()
    assert holding.wait(10.0)
    threads[1].start()
    commit = store.submit(store.commit_track, track_key(1), full_track([16], size=32 * KiB))
    with gate._cond:  # the writer is now waiting for the holder's session to close
        assert gate._cond.wait_for(lambda: gate.resizing, 10.0)
    go.set()
    deadline = time.monotonic() + 10.0  # until the reader waits at the gate (or got in)
    while not entered.is_set() and len(gate._cond._waiters) < 2:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline
        entered.wait(0.001)
    release.set()
    assert commit.result(10.0) > 0
    for t in threads:
        t.join(10.0)
    assert seen and seen[0] > 128 * KiB  # it got in only after the map grew
    store.close()


def test_every_write_runs_on_the_one_writer_thread(tmp_path: Path) -> None:
    """Writes called from any thread are performed by the writer thread, one at a time."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    store = LmdbStore(tmp_path, capacity=1 << 30, map_limit=16 << 20,
                      initial_map_size=128 * KiB)
    seen: set[int] = set()
    real = store._writing

    def spy():  # type: ignore[no-untyped-def]
        seen.add(threading.get_ident())
        return real()

    store._writing = spy  # type: ignore[method-assign]
    with ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(lambda i: store.commit_track(
            track_key(i), full_track([8], size=16 * KiB, salt=i)), range(8)))
    assert all(sizes) and len(store.tracks()) == 8
    assert seen == {store._writer_ident} and store._writer_ident != threading.get_ident()
    store.close()


def test_disk_full_becomes_storage_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LmdbStore(tmp_path, capacity=1 << 20)
    store.commit_track(track_key(0), full_track([1]))
    real_begin = store._env.begin

    class FailingTxn:
        def __init__(self, txn: lmdb.Transaction) -> None:
            self._txn = txn

        def __getattr__(self, name: str) -> object:
            return getattr(self._txn, name)

        def __enter__(self) -> FailingTxn:
            self._txn.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self._txn.__exit__(*exc)

        def put(self, *args: object, **kw: object) -> bool:
            raise lmdb.DiskError("No space left on device")

    monkeypatch.setattr(store, "_env", type("Env", (), {
        "begin": staticmethod(lambda **kw: FailingTxn(real_begin(**kw)) if kw.get("write")
                              else real_begin(**kw)),
    })())
    with pytest.raises(StorageFullError, match="disk full"):
        store.commit_track(track_key(1), full_track([2]))
    monkeypatch.undo()
    assert store.tracks() == [track_key(0)]
    assert store.stats()["bytes_used"] == store.info(track_key(0)).nbytes  # type: ignore[union-attr]
    store.close()


def test_a_first_commit_that_fails_leaves_an_empty_store(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing was ever written: after the abort the counters are those of an empty store."""
    store = LmdbStore(tmp_path, capacity=1 << 20)
    real_put = store._put_counters

    def fail(*args: object) -> None:
        raise lmdb.DiskError("No space left on device")

    monkeypatch.setattr(store, "_put_counters", fail)
    with pytest.raises(StorageFullError, match="disk full"):
        store.commit_track(track_key(0), full_track([2]))
    assert store.stats()["bytes_used"] == 0 and store.tracks() == []
    monkeypatch.setattr(store, "_put_counters", real_put)
    assert store.commit_track(track_key(0), full_track([2])) == store.stats()["bytes_used"] > 0
    store.close()


def test_submit_passes_keyword_arguments_to_the_writer(tmp_path: Path) -> None:
    """The relay commits through submit() with keywords (its Track Properties, its expiry)."""
    clock = Clock()
    store = LmdbStore(tmp_path, capacity=1 << 20, clock=clock)
    n = store.submit(store.commit_track, track_key(0), full_track([1]),
                     properties=b"\x0e\x01p", expires_at=clock.now + 5).result(10.0)
    assert n > 0 and store.next_expiry() == clock.now + 5
    with store.session() as s:
        assert s.properties(track_key(0)) == b"\x0e\x01p"
    store.close()


@pytest.mark.parametrize("error", [lmdb.Error("no lock"), StorageFullError("full")])
def test_close_survives_a_use_order_it_cannot_write(tmp_path: Path, error: Exception,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The use order is advisory: failing to persist it never fails a close."""
    store = LmdbStore(tmp_path, capacity=1 << 20)
    store.commit_track(track_key(0), full_track([1]))
    assert store.info(track_key(0)) is not None  # a use to persist

    def fail() -> None:
        raise error

    monkeypatch.setattr(store, "_flush_usage", fail)
    store.close()
    monkeypatch.undo()
    with LmdbStore(tmp_path, capacity=1 << 20) as again:
        assert again.tracks() == [track_key(0)]


def test_read_session_lifetime_is_explicit(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, capacity=1 << 20)
    groups = full_track([3], size=100)
    store.commit_track(track_key(0), groups)
    with store.session() as s:
        objs = list(s.read(track_key(0), Location(0, 0)))
        assert all(isinstance(o.payload, memoryview) for o in objs)  # zero-copy
        kept = [o.copy() for o in objs]
    with pytest.raises(StorageError, match="closed"):
        s.group(track_key(1), 0)
    assert describe(kept) == describe(flat(groups))
    assert all(isinstance(o.payload, bytes) for o in kept)
    store.close()


def test_delete_track(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, capacity=1 << 20)
    store.commit_track(track_key(0), full_track([2]))
    # of another size than the deleted one: what is left is counted, not what was removed
    store.commit_track(track_key(1), full_track([5]))
    assert store.delete_track(track_key(0)) and not store.delete_track(track_key(0))
    assert store.tracks() == [track_key(1)]
    assert store.stats()["bytes_used"] == store.info(track_key(1)).nbytes  # type: ignore[union-attr]
    store.close()


def _rows(store: LmdbStore) -> dict[str, int]:
    """Entries per table: a track removed by any path must leave none of its rows."""
    tables = {"names": store._names, "tracks": store._tracks, "props": store._props,
              "expiry": store._expiry, "groups": store._groups, "lru": store._lru}
    with store._reading() as txn:
        return {name: txn.stat(db)["entries"] for name, db in tables.items()}


def test_a_track_removed_by_delete_eviction_or_expiry_leaves_no_row(tmp_path: Path) -> None:
    clock = Clock()
    groups = full_track([2, 2], size=KiB)
    size = LmdbStore(tmp_path / "probe", capacity=1 << 20).commit_track(track_key(9), groups)
    store = LmdbStore(tmp_path / "db", capacity=2 * size, clock=clock)
    for i in range(3):  # the third evicts the first
        store.commit_track(track_key(i), groups, properties=b"\x0e\x01p",
                           expires_at=clock.now + 10 + i)
    assert store.tracks() == [track_key(1), track_key(2)]
    assert store.delete_track(track_key(1))
    clock.now += 20
    assert store.expire() == 1
    assert _rows(store) == dict.fromkeys(
        ("names", "tracks", "props", "expiry", "groups", "lru"), 0)
    assert store.stats()["bytes_used"] == 0 and store.stats()["evicted_tracks"] == 1
    store.close()


def test_a_read_session_knows_a_committed_tracks_end(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, capacity=1 << 20)
    groups = full_track([3, 1], eot_objects=2)
    store.commit_track(track_key(0), groups)
    with store.session() as s:
        assert s.known_final(track_key(0)) == Location(2, 2) == flat(groups)[-1].location
        assert s.known_final(track_key(1)) is None
        assert s.properties(track_key(1)) == b""
    store.close()


def test_a_committed_tracks_walk_is_the_reference_walk(tmp_path: Path) -> None:
    """Status Objects appear only when asked for; an unknown track walks to nothing."""
    store = LmdbStore(tmp_path, capacity=1 << 20)
    groups = full_track([3, 0, 2], eot_objects=1)
    store.commit_track(track_key(0), groups)
    objects = {o.location: o for o in flat(groups)}
    eot = flat(groups)[-1].location
    with store.session() as s:
        plain = describe(s.walk(track_key(0), Location(0, 0)))
        full = describe(s.walk(track_key(0), Location(0, 0), include_status=True))
        assert list(s.walk(track_key(1), Location(0, 0))) == []
    assert plain == describe(reference_walk(objects, eot, Location(0, 0), eot,
                                            GroupOrder.ASCENDING, None, False))
    assert full == describe(reference_walk(objects, eot, Location(0, 0), eot,
                                           GroupOrder.ASCENDING, None, True))
    assert plain != full
    store.close()


def test_next_expiry_counts_max_age_and_committed_expiry_times(tmp_path: Path) -> None:
    clock = Clock()
    store = LmdbStore(tmp_path, capacity=1 << 20, max_age=60.0, clock=clock)
    store.commit_track(track_key(0), full_track([1]), expires_at=clock.now + 100)
    assert store.next_expiry() == clock.now + 60  # its age ends it before its expiry time
    store.commit_track(track_key(1), full_track([1]), expires_at=clock.now + 30)
    assert store.next_expiry() == clock.now + 30
    store.close()


def test_track_properties_are_kept_with_the_track(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, capacity=1 << 20)
    store.commit_track(track_key(0), full_track([2]), properties=b"\x0e\x07opaque")
    store.commit_track(track_key(1), full_track([2]))
    store.close()
    store = LmdbStore(tmp_path, capacity=1 << 20)
    with store.session() as s:
        assert s.properties(track_key(0)) == b"\x0e\x07opaque"
        assert s.properties(track_key(1)) == b""
    assert store.delete_track(track_key(0))
    store.commit_track(track_key(0), full_track([3]))  # a new track under the same name
    with store.session() as s:
        assert s.properties(track_key(0)) == b""  # nothing left over from the deleted one
    store.close()
