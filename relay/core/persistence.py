"""Complete Tracks into LMDB, and what follows from what LMDB holds: the namespaces it holds
Tracks of stay announced (also after a restart) until eviction, expiry or a purge takes the
last of them, and Tracks expire (``lmdb_max_age``, MAX_CACHE_DURATION §12) on a timer.

One commit at a time, on the store's writer thread; a purge holds the same `lock` so that
no commit in flight writes a purged Track back (relay/core/purge.py).

Write-behind: a complete Track waits for a quiet moment before its commit (no Object taken
in or sent for ``QUIET`` seconds), at most ``commit_delay`` seconds, and not at all while the
memory tier is three quarters full or the relay is closing. Writing LMDB beside a burst of
ingest halved the burst's rate here (docs/performance.md, "Where an LMCache put goes"): the
burst goes at memory speed and the writes follow it. Meanwhile the Track is served from
memory; a relay killed then loses what completed in the last ``commit_delay`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from relay.moqt.kvp import encode_kvps
from relay.moqt.primitives import TrackNamespace
from storage.interface import IncompleteTrackError, StorageFullError, TrackTooLargeError
from storage.lmdb_store import LmdbStore
from storage.tiered import TieredStore

from .counters import Counters
from .namespaces import CACHE, NamespaceTable, PublisherEntry
from .track import RelayTrack

log = logging.getLogger("kvcs.relay")

QUIET = 0.05  # seconds with no Object in or out that make a moment to write LMDB in


class Persistence:
    def __init__(self, store: TieredStore, namespaces: NamespaceTable, counters: Counters,
                 clock: Callable[[], float], commit_delay: float = 0.0) -> None:
        self.store = store
        self.commit_delay = commit_delay  # seconds a commit may wait for a quiet moment
        self._flush = asyncio.Event()  # set: closing, every commit goes at once
        self._seen = -1  # the data path's byte count when last looked at
        self._seen_at = 0.0  # and since when it has been that
        self._deferred = 0  # commits waiting for a moment (or the lock) now
        self._none_deferred = asyncio.Event()
        self._none_deferred.set()
        self.namespaces = namespaces
        self.counters = counters
        self.lock = asyncio.Lock()
        # namespaces announced because LMDB holds a Track of them (routes nothing upstream)
        self.cached: dict[TrackNamespace, PublisherEntry] = {}
        self._clock = clock  # the stores' clock: expiry times are in its terms
        durable = store.durable
        self._evictions_seen = durable.evicted_tracks if durable is not None else 0
        self._expiry_at: float | None = None
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiry_task: asyncio.Future[None] | None = None
        if durable is not None:
            for ns, _ in durable.tracks():
                self.announce_cached(tuple(ns))
            self._arm_expiry(durable.next_expiry())

    def announce_cached(self, namespace: TrackNamespace) -> None:
        """The relay holds a complete Track of ``namespace`` in LMDB: it stays discoverable
        with SUBSCRIBE_NAMESPACE after its publisher has gone (and after a restart), since
        FETCH can serve it."""
        if namespace not in self.cached:
            entry = PublisherEntry(namespace, CACHE)
            self.cached[namespace] = entry
            self.namespaces.add_publisher(entry)

    def forget_namespace(self, namespace: TrackNamespace) -> None:
        """A purge took the namespace's Tracks: no longer announced for LMDB's sake."""
        self.cached.pop(namespace, None)

    @property
    def waiting(self) -> int:
        """Complete Tracks waiting for their LMDB write, or being written, now."""
        return self._deferred

    def _traffic(self) -> int:
        c = self.counters
        return c.bytes_received + c.bytes_sent + c.fill.bytes + c.fetch.bytes

    def _may_write(self, deadline: float) -> bool:
        """Now is a moment to write LMDB in: nothing in or out for ``QUIET`` seconds, the
        Track has waited long enough, memory is getting full, or the relay is closing."""
        now = asyncio.get_running_loop().time()
        if self._flush.is_set() or now >= deadline:
            return True
        memory = self.store.memory
        if 4 * memory.bytes_used >= 3 * memory.capacity:
            return True
        traffic = self._traffic()
        if traffic != self._seen:
            self._seen, self._seen_at = traffic, now
            return False
        return now - self._seen_at >= QUIET

    async def _moment(self, deadline: float) -> None:
        """Until ``_may_write``, looking every ``QUIET`` seconds (or woken by closing)."""
        loop = asyncio.get_running_loop()
        while not self._may_write(deadline):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush.wait(),
                                       min(QUIET, max(0.0, deadline - loop.time())))

    async def commit(self, track: RelayTrack) -> bool:
        """Persist a complete Track to LMDB (at a quiet moment: write-behind, above).
        Returns True when LMDB could not take it *now* (full map or disk, read sessions in
        the way of a resize): the Track asks again later (``RelayTrack``)."""
        durable = self.store.durable
        if durable is None:
            return False
        deadline = asyncio.get_running_loop().time() + self.commit_delay
        self._deferred += 1
        self._none_deferred.clear()
        try:
            while True:
                await self._moment(deadline)
                async with self.lock:
                    # traffic may have come back while another commit held the lock
                    if self._may_write(deadline):
                        return await self._commit_now(track, durable)
        finally:
            self._deferred -= 1
            if not self._deferred:
                self._none_deferred.set()

    async def _commit_now(self, track: RelayTrack, durable: LmdbStore) -> bool:
        if track.committed:
            return False
        groups = self.store.memory.complete_track(track.key)
        if groups is None:
            return False  # a gap, aborted, or no longer whole in memory: never persisted
        # MAX_CACHE_DURATION (§12) counts from when the Objects arrived, not from the
        # commit: the oldest Group's time bounds the whole Track in LMDB
        expires_at = None
        duration = track.cache_duration
        first = self.store.memory.first_received(track.key)
        if duration is not None and first is not None:
            expires_at = first + duration
            if expires_at <= self._clock():
                return False  # already too old to be served: not worth a write
        try:
            n = await asyncio.wrap_future(durable.submit(
                durable.commit_track, track.key, groups,
                properties=encode_kvps(track.properties), expires_at=expires_at))
        except TrackTooLargeError as e:
            log.warning("%r stays in memory only: %s", track, e)
            self.counters.lmdb_full += 1
            return False
        except StorageFullError as e:
            log.warning("LMDB cannot take %r now, retrying: %s", track, e)
            self.counters.lmdb_full += 1
            return True
        except IncompleteTrackError:
            return False
        track.committed = True
        self.announce_cached(track.full_name.namespace)
        if durable.evicted_tracks != self._evictions_seen:
            # LMDB made room by evicting Tracks (a commit also purges expired ones)
            self._evictions_seen = durable.evicted_tracks
            await self._withdraw_unheld()
        if expires_at is not None:
            self._arm_expiry(expires_at)
        elif durable.max_age is not None:
            self._arm_expiry(self._clock() + durable.max_age)
        if n:  # 0: another worker had committed it already (docs/workers.md)
            self.counters.lmdb_committed_tracks += 1
            self.counters.lmdb_committed_bytes += n
        return False

    async def _withdraw_unheld(self) -> None:
        """Namespaces LMDB no longer holds any Track of are done (NAMESPACE_DONE, unless a
        live publisher still announces them)."""
        durable = self.store.durable
        if durable is None:
            return
        # on the writer thread: after the write that evicted, and off the event loop
        held = {tuple(ns) for ns, _ in await asyncio.wrap_future(durable.submit(durable.tracks))}
        for ns in [ns for ns in self.cached if ns not in held]:
            self.namespaces.remove_publisher(self.cached.pop(ns))

    async def wait_committed(self, track: RelayTrack, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not track.committed and loop.time() < end:
            task = track.pending_commit
            if task is not None:
                await asyncio.wait_for(asyncio.shield(task), end - loop.time())
            if not track.committed:
                await track.wait_change(end - loop.time())
        return track.committed

    # -- expiry (lmdb_max_age, MAX_CACHE_DURATION) ------------------------------------------------

    def _arm_expiry(self, at: float | None) -> None:
        """Wake up when the next LMDB Track expires (``at``, store clock), unless already
        due to wake up sooner."""
        if at is None or (self._expiry_at is not None and self._expiry_at <= at):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # built outside an event loop (a tool, not a server): no timer
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        self._expiry_at = at
        self._expiry_timer = loop.call_later(max(0.0, at - self._clock()), self._expiry_due)

    def _expiry_due(self) -> None:
        self._expiry_task = asyncio.ensure_future(self._expire_logged())

    async def _expire_logged(self) -> None:
        try:
            await self.expire()
        except Exception as e:  # e.g. LMDB closed under it at shutdown; retried next time
            log.warning("LMDB expiry failed: %s", e)

    async def expire(self) -> int:
        """Purge the LMDB Tracks whose time is up; their namespaces, if LMDB held nothing
        else of them, are done — expiry is a withdrawal like eviction. Returns how many
        Tracks went."""
        durable = self.store.durable
        self._expiry_at = self._expiry_timer = None
        if durable is None:
            return 0
        removed = await asyncio.wrap_future(durable.submit(durable.expire))
        if removed:
            self.counters.lmdb_expired_tracks += removed
            await self._withdraw_unheld()
        self._arm_expiry(await asyncio.wrap_future(durable.submit(durable.next_expiry)))
        return removed

    def flush(self) -> None:
        """Commits stop waiting for a quiet moment (a drain, then closing)."""
        self._flush.set()

    async def close(self, tracks: list[RelayTrack]) -> None:
        """Write what waits for a quiet moment (at most 5 s), stop the expiry timer, let an
        expiry in its thread finish, cancel ``tracks``' commits still pending (waiting to
        retry): a write the writer thread has begun finishes anyway before the store
        closes (LmdbStore.close)."""
        self.flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_deferred.wait(), 5.0)
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        if self._expiry_task is not None and not self._expiry_task.done():
            await asyncio.wait({self._expiry_task}, timeout=5.0)
        pending = pending_commits(tracks)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)


def pending_commits(tracks: list[RelayTrack]) -> list[asyncio.Future[None]]:
    """The LMDB commits of ``tracks`` not finished yet."""
    return [t.pending_commit for t in tracks if t.pending_commit is not None]


__all__ = ["Persistence", "pending_commits"]
