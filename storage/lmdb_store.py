"""LMDB tier: completed tracks only, one value per (track, Group), zero-copy reads.

INVARIANT: **a track appears in LMDB whole or not at all.** A track is written only when its
End of Track is known and it has no gap (`check_complete`), in a single write transaction that
also writes its metadata and name; eviction removes a track, again in one transaction. A
partially received track, or one whose publisher failed, never reaches this module (the tiered
store refuses to commit it). A process killed at any point leaves either the old or the new
committed state (LMDB's copy-on-write commit), proved by tests/storage/test_storage_crash.py.

Layout (named databases in one environment):

    names   sha256(Full Track Name)        -> track id (u64 BE)
    tracks  track id                       -> meta (bytes, use seq, created, last used,
                                              End of Track, Group count) + Full Track Name
    expiry  track id                       -> f64 time it expires (only tracks that do)
    groups  track id | Group ID (u64 BE)   -> Group value (storage.blob: index + data)
    lru     use seq | track id             -> ""   (eviction order, oldest first)
    (main)  b"next_id", b"seq", b"bytes"   -> u64 counters

One value per Group, never one key per Object (the layer x block key explosion): a KVCS layer
is one B-tree lookup and one sequential read; an Object-ID range is a slice of it. Track ids
only grow, so Group keys are appended (MDB_APPEND) in key order.

ONE WRITER: every write transaction and every map resize of a store runs on its one writer
thread (`submit`; the blocking methods `commit_track`, `delete_track`, `expire` and
`flush_usage` hand their work to it and wait). Write transactions never contend inside the
process, and a resize never meets a write transaction of its own process. Several processes
may share the directory: LMDB serialises their write transactions, and each re-reads the
counters in every one.

Reads go through `LmdbReadSession` (a context manager holding one read transaction opened with
buffers=True): every memoryview it returns points into the memory map and is valid only until
the session ends. Copy (`StoredObject.copy()`) anything kept longer. Sessions may be opened on
any thread (py-lmdb uses MDB_NOTLS), but **a session must not stay open across an await or
any other wait on someone else**: growing the map remaps it, which LMDB allows only while no
transaction of the process is open, so the writer waits for open sessions to close (`_ReadGate`,
at most `resize_wait` seconds, then the write fails with a retryable `StorageFullError`). The
relay copies what one write to the network needs and closes the session before it awaits.

Capacity: `capacity` bytes of Group values; committing evicts least-recently-used tracks first
(use order is in the `lru` table, so it survives restart; reads are batched in memory and
written with the next write or `flush_usage()`). Tracks older than `max_age`, and tracks past
the expiry time committed with them (the MOQT MAX_CACHE_DURATION of their Objects), are
invisible to reads and purged on the next write or `expire()`. The memory map starts at
`initial_map_size` and doubles up to `map_limit` (once no read session is open: remapping would
invalidate their views); when LMDB or the disk is full a `StorageFullError` is raised and
nothing is written. `TrackTooLargeError` (a track above the capacity or its scope's quota) is
the one that no retry can cure.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from storage.blob import (
    GroupView,
    decode_track_name,
    encode_group_into,
    encode_track_name,
    group_size,
    track_name_key,
)
from storage.interface import (
    GroupOrder,
    IdRanges,
    IncompleteTrackError,
    Location,
    ObjectStatus,
    StorageError,
    StorageFullError,
    StoredObject,
    TrackInfo,
    TrackKey,
    TrackTooLargeError,
    WalkItem,
    normalize_ranges,
)
from storage.quota import LMDB, ScopeBooks, ScopeQuotas
from storage.walk import read_objects, walk_range

_META = struct.Struct("<QQddQQQ")  # bytes, use seq, created, last used, eot group/object, groups
_TIME = struct.Struct("<d")
_MiB = 1 << 20
_T = TypeVar("_T")


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def check_complete(groups: Sequence[Sequence[StoredObject]]) -> Location:
    """The End of Track Location of a whole, gap-free track; `IncompleteTrackError` otherwise.

    Groups 0..L-1 must hold Objects 0..N-1 plus End of Group at N; Group L holds Objects
    0..k-1 and End of Track at k (KVCS: k = 0).
    """
    if not groups:
        raise IncompleteTrackError("no Groups")
    last = len(groups) - 1
    for g, objs in enumerate(groups):
        if not objs:
            raise IncompleteTrackError(f"Group {g} is empty")
        want_end = ObjectStatus.END_OF_TRACK if g == last else ObjectStatus.END_OF_GROUP
        for i, obj in enumerate(objs):
            if obj.group != g or obj.object_id != i:
                raise IncompleteTrackError(f"gap or disorder at Group {g}, Object {i}")
            expected = want_end if i == len(objs) - 1 else ObjectStatus.NORMAL
            if obj.status != expected:
                raise IncompleteTrackError(f"Object {obj.location} has status {obj.status}")
    return Location(last, len(groups[last]) - 1)


class _Meta:
    __slots__ = ("created", "end_of_track", "groups", "last_used", "name", "nbytes", "seq")

    def __init__(self, raw: bytes | memoryview) -> None:
        (self.nbytes, self.seq, self.created, self.last_used, eg, eo,
         self.groups) = _META.unpack_from(raw, 0)
        self.end_of_track = Location(eg, eo)
        self.name = bytes(raw[_META.size:])

    def pack(self) -> bytes:
        eot = self.end_of_track
        return _META.pack(self.nbytes, self.seq, self.created, self.last_used, eot.group,
                          eot.object, self.groups) + self.name


class _ReadGate:
    """This process's read transactions against a map resize.

    `mdb_env_set_mapsize` may run only while no transaction of the process is open: it remaps
    the file and every view a reader holds would point into freed memory. Readers enter and
    leave; the writer takes the gate exclusively for a resize: new readers wait (a resize is
    quick), open ones are waited for, for at most ``timeout``. A thread already inside may
    enter again without waiting, so nested sessions cannot deadlock against a resize.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._depth = threading.local()
        self.readers = 0
        self.resizing = False

    def enter(self) -> None:
        depth = getattr(self._depth, "n", 0)
        with self._cond:
            if depth == 0:
                while self.resizing:
                    self._cond.wait()
            self.readers += 1
        self._depth.n = depth + 1

    def leave(self) -> None:
        self._depth.n -= 1
        with self._cond:
            self.readers -= 1
            if self.readers == 0:
                self._cond.notify_all()

    @contextmanager
    def exclusive(self, timeout: float) -> Iterator[None]:
        with self._cond:
            self.resizing = True
            self._cond.notify_all()  # for whoever watches for a pending resize
            try:
                if not self._cond.wait_for(lambda: self.readers == 0, timeout):
                    raise StorageFullError("LMDB map must grow but read sessions are open; "
                                           "retry")
                yield
            finally:
                self.resizing = False
                self._cond.notify_all()


class LmdbStore:
    """The durable tier. One instance per directory per process; several processes may share
    one directory (LMDB locks it; every write transaction re-reads the counters)."""

    def __init__(self, path: str | os.PathLike[str], capacity: int, *,
                 max_age: float | None = None, clock: Callable[[], float] = time.time,
                 map_limit: int | None = None, initial_map_size: int | None = None,
                 sync: bool = True, quotas: ScopeQuotas | None = None,
                 resize_wait: float = 2.0) -> None:
        self.path = Path(path)
        self.capacity = capacity
        self.quotas = quotas if quotas is not None and quotas.active(LMDB) else None
        self.scopes = ScopeBooks()
        self.max_age = max_age
        self._clock = clock
        # B-tree pages, page rounding and pages freed while readers still need them.
        self.map_limit = map_limit if map_limit is not None else 2 * capacity + 16 * _MiB
        self.path.mkdir(parents=True, exist_ok=True)
        size = min(initial_map_size or self.map_limit, self.map_limit)
        data = self.path / "data.mdb"
        if data.exists():  # a map written by an earlier run may already be larger
            size = max(size, data.stat().st_size)
        self._map_size = size
        # metasync=False keeps integrity (ACI) and may lose the last commits on an OS crash:
        # fine for a cache of derivable data.
        self._env = lmdb.open(str(self.path), map_size=self._map_size, max_dbs=8,
                              metasync=False, sync=sync, readahead=False)
        self._names = self._env.open_db(b"names")
        self._tracks = self._env.open_db(b"tracks")
        self._groups = self._env.open_db(b"groups")
        self._lru = self._env.open_db(b"lru")
        # Track Properties (opaque bytes, as the relay received them) by track id
        self._props = self._env.open_db(b"props")
        self._expiry = self._env.open_db(b"expiry")
        self._gate = _ReadGate()
        self.resize_wait = resize_wait  # bound on waiting for read sessions before a resize
        # uses recorded by readers (any thread), persisted by the writer
        self._touched: dict[int, float] = {}
        self._touched_lock = threading.Lock()
        self._writer_ident: int | None = None
        self._writer = ThreadPoolExecutor(1, "lmdb-writer", initializer=self._mark_writer)
        with self._reading() as txn:
            self._next_id = self._counter(txn, b"next_id", 1)
            self._seq = self._counter(txn, b"seq", 0)
            self._bytes = self._counter(txn, b"bytes", 0)
        self.evicted_tracks = 0
        self._count_scopes()
        self._scratch = bytearray()  # Group values are encoded here, then copied by LMDB

    # -- the writer thread -----------------------------------------------------------------

    def _mark_writer(self) -> None:
        self._writer_ident = threading.get_ident()

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kw: Any) -> Future[_T]:
        """Run ``fn`` on the writer thread (after the writes submitted before it); the relay
        awaits the future (``asyncio.wrap_future``) instead of blocking its event loop."""
        return self._writer.submit(fn, *args, **kw)

    def _on_writer(self, fn: Callable[..., _T], /, *args: Any, **kw: Any) -> _T:
        if threading.get_ident() == self._writer_ident:
            return fn(*args, **kw)
        return self._writer.submit(fn, *args, **kw).result()

    # -- writing ---------------------------------------------------------------------------

    def commit_track(self, track: TrackKey, groups: Sequence[Sequence[StoredObject]], *,
                     created: float | None = None, properties: bytes = b"",
                     expires_at: float | None = None) -> int:
        """Write a whole track in one transaction; returns bytes written (0 if already held).
        ``expires_at`` (clock time): from then on the track is invisible and purged.

        Raises `IncompleteTrackError` (never written), `StorageFullError` (nothing written;
        `TrackTooLargeError` if it can never fit).
        """
        return self._on_writer(self._commit_track, track, groups, created=created,
                               properties=properties, expires_at=expires_at)

    def _commit_track(self, track: TrackKey, groups: Sequence[Sequence[StoredObject]], *,
                      created: float | None, properties: bytes,
                      expires_at: float | None) -> int:
        eot = check_complete(groups)
        sizes = [group_size(objs) for objs in groups]
        size = sum(sizes)
        if size > self.capacity:
            raise TrackTooLargeError(f"track of {size} bytes exceeds capacity {self.capacity}")
        scope = self.quotas.scope_of(track) if self.quotas is not None else None
        limit = self.quotas.limit(scope, LMDB) if self.quotas and scope is not None else None
        if limit is not None and size > limit:
            raise TrackTooLargeError(f"track of {size} bytes exceeds its scope's quota {limit}")
        name = encode_track_name(track)
        nkey = track_name_key(name)
        now = self._clock()
        while True:
            try:
                with self._writing() as txn:
                    self._purge_expired(txn, now)
                    if txn.get(nkey, db=self._names) is not None:
                        return 0  # Objects never change: the stored copy is this track
                    if limit is not None and scope is not None:
                        self._evict_scope(txn, scope, limit - size)
                    self._evict(txn, self.capacity - size, scope)
                    tid = self._next_id
                    scratch = self._scratch
                    for g, objs in enumerate(groups):
                        n = encode_group_into(scratch, objs)
                        with memoryview(scratch) as view, view[:n] as value:
                            txn.put(_u64(tid) + _u64(g), value, db=self._groups, append=True)
                    meta = _Meta(bytes(_META.size) + name)
                    meta.nbytes, meta.last_used = size, now
                    meta.created = now if created is None else created
                    meta.end_of_track, meta.groups = eot, len(groups)
                    self._seq += 1
                    meta.seq = self._seq
                    txn.put(_u64(tid), meta.pack(), db=self._tracks)
                    txn.put(nkey, _u64(tid), db=self._names)
                    if properties:
                        txn.put(_u64(tid), bytes(properties), db=self._props)
                    if expires_at is not None:
                        txn.put(_u64(tid), _TIME.pack(expires_at), db=self._expiry)
                    txn.put(_u64(meta.seq) + _u64(tid), b"", db=self._lru)
                    self._next_id = tid + 1
                    self._bytes += size
                if scope is not None:
                    self.scopes.add(scope, size)
                return size
            except lmdb.MapFullError:
                try:
                    made_room = self._make_room()
                except lmdb.MapFullError:
                    made_room = False
                if not made_room:
                    raise StorageFullError(
                        f"LMDB map full at {self._map_size} bytes (limit {self.map_limit})"
                    ) from None

    def delete_track(self, track: TrackKey) -> bool:
        """Remove a track (whole); False if it was not held."""
        return self._on_writer(self._delete_track, track)

    def _delete_track(self, track: TrackKey) -> bool:
        nkey = track_name_key(encode_track_name(track))
        with self._writing() as txn:
            raw = txn.get(nkey, db=self._names)
            if raw is not None:
                self._bytes -= self._remove(txn, int.from_bytes(raw, "big"))
        return raw is not None

    def expire(self) -> int:
        """Purge expired tracks now; returns how many were removed."""
        return self._on_writer(self._expire)

    def _expire(self) -> int:
        with self._writing() as txn:
            removed = self._purge_expired(txn, self._clock())
        return removed

    def next_expiry(self) -> float | None:
        """The clock time at which the next held track expires (None: none will)."""
        times: list[float] = []
        with self._reading() as txn:
            if self.max_age is not None:
                times += [_Meta(raw).created + self.max_age
                          for _, raw in txn.cursor(db=self._tracks)]
            times += [_TIME.unpack(raw)[0] for _, raw in txn.cursor(db=self._expiry)]
        return min(times) if times else None

    def flush_usage(self) -> None:
        """Persist the use order recorded by reads since the last write."""
        if self._touched:
            self._on_writer(self._flush_usage)

    def _flush_usage(self) -> None:
        with self._writing():
            pass

    def close(self) -> None:
        """Persist the use order, let the writes already submitted finish, close."""
        with suppress(lmdb.Error, StorageError):  # use order is advisory: never fail a close
            self.flush_usage()
        self._writer.shutdown(wait=True)
        self._env.close()

    def __enter__(self) -> LmdbStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------

    def session(self) -> LmdbReadSession:
        """A read session; use as a context manager (views die with it)."""
        return LmdbReadSession(self)

    def info(self, track: TrackKey) -> TrackInfo | None:
        with self.session() as s:
            return s.info(track)

    def tracks(self) -> list[TrackKey]:
        """Every visible committed track, least recently used first."""
        out = []
        with self._reading() as txn:
            for key, _ in txn.cursor(db=self._lru):
                raw = txn.get(key[8:], db=self._tracks)
                if raw is not None:
                    meta = _Meta(raw)
                    if not self._expired(txn, key[8:], meta, self._clock()):
                        out.append(decode_track_name(meta.name))
        return out

    def stats(self) -> dict[str, Any]:
        info = self._env.info()
        with self._reading() as txn:
            tracks = txn.stat(self._tracks)["entries"]
            groups = txn.stat(self._groups)["entries"]
        return {"bytes_used": self._bytes, "capacity": self.capacity, "tracks": tracks,
                "groups": groups, "map_size": info["map_size"], "map_limit": self.map_limit,
                "evicted_tracks": self.evicted_tracks}

    # -- internals -------------------------------------------------------------------------

    @contextmanager
    def _reading(self, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        """A read transaction counted by the gate (a resize waits for it to end)."""
        self._gate.enter()
        try:
            with self._env.begin(buffers=buffers) as txn:
                yield txn
        finally:
            self._gate.leave()

    def _touch(self, tid: int, when: float) -> None:
        with self._touched_lock:
            self._touched[tid] = when

    def _expired(self, txn: lmdb.Transaction, tid_key: bytes, meta: _Meta, now: float) -> bool:
        if self.max_age is not None and now - meta.created >= self.max_age:
            return True
        raw = txn.get(tid_key, db=self._expiry)
        return raw is not None and now >= _TIME.unpack(raw)[0]

    @staticmethod
    def _counter(txn: lmdb.Transaction, key: bytes, default: int) -> int:
        raw = txn.get(key)
        return int.from_bytes(raw, "big") if raw is not None else default

    def _put_counters(self, txn: lmdb.Transaction, next_id: int, seq: int,
                      nbytes: int) -> None:
        txn.put(b"next_id", _u64(next_id))
        txn.put(b"seq", _u64(seq))
        txn.put(b"bytes", _u64(nbytes))

    @contextmanager
    def _writing(self) -> Iterator[lmdb.Transaction]:
        """A write transaction that also persists pending uses and the counters.

        Counters are updated in memory as the transaction goes; if it fails they are reloaded
        from LMDB, and full-map / full-disk errors become `StorageFullError` (except
        MapFullError itself, which `commit_track` handles by growing or evicting).
        """
        try:
            with self._env.begin(write=True) as txn:
                # Another process (a relay worker, docs/workers.md) may have written since
                # our last transaction: write transactions are serialised across processes,
                # so the counters read here are the truth for this one.
                self._next_id = self._counter(txn, b"next_id", 1)
                self._seq = self._counter(txn, b"seq", 0)
                self._bytes = self._counter(txn, b"bytes", 0)
                self._write_usage(txn)
                yield txn
                self._put_counters(txn, self._next_id, self._seq, self._bytes)
        except BaseException as exc:
            self._reload_counters()
            if isinstance(exc, lmdb.DiskError) or (
                    isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
                raise StorageFullError(f"disk full: {exc}") from exc
            raise

    def _reload_counters(self) -> None:
        # An aborted transaction may have advanced the in-memory copies; LMDB is the truth.
        with self._reading() as txn:
            self._next_id = self._counter(txn, b"next_id", 1)
            self._seq = self._counter(txn, b"seq", 0)
            self._bytes = self._counter(txn, b"bytes", 0)
        self._count_scopes()

    # -- per-scope quotas (storage/quota.py) -----------------------------------------------

    def _count_scopes(self) -> None:
        """Bytes held per scope, from the tracks table (at open, and after an abort)."""
        if self.quotas is None:
            return
        held: dict[bytes, int] = {}
        with self._reading() as txn:
            for _, raw in txn.cursor(db=self._tracks):
                meta = _Meta(raw)
                scope = self.quotas.scope_of(decode_track_name(meta.name))
                held[scope] = held.get(scope, 0) + int(meta.nbytes)
        self.scopes.held = held

    def _scope_of(self, txn: lmdb.Transaction, tid: int) -> bytes | None:
        if self.quotas is None:
            return None
        raw = txn.get(_u64(tid), db=self._tracks)
        if raw is None:
            return None
        return self.quotas.scope_of(decode_track_name(_Meta(raw).name))

    def _lru_first(self, txn: lmdb.Transaction, scope: bytes | None) -> int | None:
        """The least recently used track of ``scope`` (any scope when None)."""
        with txn.cursor(db=self._lru) as cur:
            for key, _ in cur:
                tid = int.from_bytes(key[8:], "big")
                if scope is None or self._scope_of(txn, tid) == scope:
                    return tid
        return None

    def _evict_one(self, txn: lmdb.Transaction, tid: int) -> None:
        scope = self._scope_of(txn, tid)
        self._bytes -= self._remove(txn, tid)
        self.evicted_tracks += 1
        if scope is not None:
            self.scopes.evicted(scope)

    def _evict_scope(self, txn: lmdb.Transaction, scope: bytes, budget: int) -> None:
        """Remove the scope's own least recently used tracks until it holds <= budget."""
        while self.scopes.held.get(scope, 0) > budget:
            tid = self._lru_first(txn, scope)
            if tid is None:
                return
            self._evict_one(txn, tid)

    def _write_usage(self, txn: lmdb.Transaction) -> None:
        with self._touched_lock:
            touched, self._touched = self._touched, {}
        for tid, when in sorted(touched.items(), key=lambda kv: kv[1]):
            raw = txn.get(_u64(tid), db=self._tracks)
            if raw is None:
                continue
            meta = _Meta(raw)
            txn.delete(_u64(meta.seq) + _u64(tid), db=self._lru)
            self._seq += 1
            meta.seq, meta.last_used = self._seq, when
            txn.put(_u64(tid), meta.pack(), db=self._tracks)
            txn.put(_u64(meta.seq) + _u64(tid), b"", db=self._lru)

    def _remove(self, txn: lmdb.Transaction, tid: int) -> int:
        raw = txn.get(_u64(tid), db=self._tracks)
        if raw is None:
            return 0
        meta = _Meta(raw)
        if self.quotas is not None:
            self.scopes.add(self.quotas.scope_of(decode_track_name(meta.name)),
                            -int(meta.nbytes))
        txn.delete(_u64(meta.seq) + _u64(tid), db=self._lru)
        txn.delete(_u64(tid), db=self._tracks)
        txn.delete(_u64(tid), db=self._props)
        txn.delete(_u64(tid), db=self._expiry)
        txn.delete(track_name_key(meta.name), db=self._names)
        prefix = _u64(tid)
        with txn.cursor(db=self._groups) as cur:
            if cur.set_range(prefix):
                while cur.key()[:8] == prefix:
                    if not cur.delete():
                        break
        with self._touched_lock:
            self._touched.pop(tid, None)
        return int(meta.nbytes)

    def _evict(self, txn: lmdb.Transaction, budget: int, scope: bytes | None = None) -> None:
        """Remove least-recently-used tracks until at most `budget` bytes remain; with a
        `scope`, that scope's own tracks first (see storage/quota.py)."""
        while self._bytes > budget:
            tid = self._lru_first(txn, scope) if scope is not None else None
            if tid is None:
                with txn.cursor(db=self._lru) as cur:
                    if not cur.first():
                        self._bytes = 0  # nothing left to hold bytes: the counter was off
                        return
                    tid = int.from_bytes(cur.key()[8:], "big")
            self._evict_one(txn, tid)

    def _purge_expired(self, txn: lmdb.Transaction, now: float) -> int:
        old = []
        if self.max_age is not None:
            for key, raw in txn.cursor(db=self._tracks):
                if self._expired(txn, key, _Meta(raw), now):
                    old.append(int.from_bytes(key, "big"))
        else:  # only tracks with an expiry time can expire: visit those alone
            for key, raw in txn.cursor(db=self._expiry):
                if now >= _TIME.unpack(raw)[0]:
                    old.append(int.from_bytes(key, "big"))
        for tid in old:
            self._bytes -= self._remove(txn, tid)
        return len(old)

    def _make_room(self) -> bool:
        """After MapFullError: grow the map, else evict the LRU track. False if neither."""
        if self._map_size < self.map_limit:
            size = min(self._map_size * 2, self.map_limit)
            with self._gate.exclusive(self.resize_wait):
                self._env.set_mapsize(size)
            self._map_size = size
            return True
        with self._writing() as txn:
            with txn.cursor(db=self._lru) as cur:
                if not cur.first():
                    return False
                tid = int.from_bytes(cur.key()[8:], "big")
            self._bytes -= self._remove(txn, tid)
        self.evicted_tracks += 1
        return True


class LmdbReadSession:
    """One read transaction; memoryviews it returns are valid until `close()` / `with` exit."""

    def __init__(self, store: LmdbStore) -> None:
        self._store = store
        store._gate.enter()
        try:
            self._txn: lmdb.Transaction | None = store._env.begin(buffers=True)
        except BaseException:
            store._gate.leave()
            raise
        self._ids: dict[TrackKey, int | None] = {}
        self._metas: dict[int, _Meta] = {}

    def __enter__(self) -> LmdbReadSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
            self._store._gate.leave()

    def _live_txn(self) -> lmdb.Transaction:
        if self._txn is None:
            raise StorageError("read session is closed")
        return self._txn

    def properties(self, track: TrackKey) -> bytes:
        """The Track Properties committed with the track (b"" if none, or not held)."""
        tid = self.track_id(track)
        if tid is None:
            return b""
        raw = self._live_txn().get(_u64(tid), db=self._store._props)
        return bytes(raw) if raw is not None else b""

    def track_id(self, track: TrackKey) -> int | None:
        """The compact id of a visible committed track (records a use for LRU)."""
        if track in self._ids:
            return self._ids[track]
        txn, st = self._live_txn(), self._store
        raw = txn.get(track_name_key(encode_track_name(track)), db=st._names)
        tid = int.from_bytes(raw, "big") if raw is not None else None
        if tid is not None:
            meta = _Meta(txn.get(_u64(tid), db=st._tracks))
            now = st._clock()
            if st._expired(txn, _u64(tid), meta, now):
                tid = None
            else:
                self._metas[tid] = meta
                st._touch(tid, now)
        self._ids[track] = tid
        return tid

    def info(self, track: TrackKey) -> TrackInfo | None:
        tid = self.track_id(track)
        if tid is None:
            return None
        meta = self._metas[tid]
        return TrackInfo(meta.end_of_track, meta.end_of_track, True, int(meta.nbytes),
                         int(meta.groups))

    def known_final(self, track: TrackKey) -> Location | None:
        tid = self.track_id(track)
        return self._metas[tid].end_of_track if tid is not None else None

    def group(self, track: TrackKey, group: int) -> GroupView | None:
        """Zero-copy view of one stored Group."""
        tid = self.track_id(track)
        if tid is None:
            return None
        return self._group(tid, group)

    def _group(self, tid: int, group: int) -> GroupView | None:
        if group >= self._metas[tid].groups:
            return None
        buf = self._live_txn().get(_u64(tid) + _u64(group), db=self._store._groups)
        return GroupView(group, buf) if buf is not None else None

    def read(self, track: TrackKey, start: Location, end: Location | None = None,
             order: GroupOrder = GroupOrder.ASCENDING,
             object_ids: IdRanges | None = None) -> Iterator[StoredObject]:
        """Stored Objects of [start, end] (end None = End of Track), views into the map."""
        tid = self.track_id(track)
        if tid is None:
            return iter(())
        meta = self._metas[tid]
        return read_objects(start, end or meta.end_of_track, order,
                            normalize_ranges(object_ids), range(meta.groups),
                            lambda g: self._group(tid, g))

    def walk(self, track: TrackKey, start: Location, end: Location | None = None,
             order: GroupOrder = GroupOrder.ASCENDING, object_ids: IdRanges | None = None,
             include_status: bool = False) -> Iterator[WalkItem]:
        """A committed track is whole: every Span of its walk is NON_EXISTENT."""
        tid = self.track_id(track)
        if tid is None:
            return iter(())
        meta = self._metas[tid]
        return walk_range(start, end or meta.end_of_track, order, normalize_ranges(object_ids),
                          range(meta.groups), lambda g: self._group(tid, g),
                          meta.end_of_track, include_status)
