"""The Track registry: one `RelayTrack` per Full Track Name the relay is dealing with,
created on first use (loading the Track Properties LMDB kept), found by name or by
namespace, and forgotten once nothing is left of a Track (``sweep``), so a long-running
relay's registry does not outlive the publications that came and went."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from relay.moqt.kvp import kvps_from_bytes
from relay.moqt.primitives import FullTrackName, TrackNamespace
from storage.tiered import TieredStore

from .counters import Counters
from .ingest_pacing import IngestPacer
from .namespaces import NamespaceTable, PublisherEntry
from .track import RelayTrack

# seconds between two looks at whether a pushed Track is committed yet, when nothing changes
LISTED_RECHECK = 5.0

CommitFn = Callable[[RelayTrack], Awaitable[bool]]  # Persistence.commit


class TrackRegistry:
    def __init__(self, store: TieredStore, commit: CommitFn, counters: Counters,
                 namespaces: NamespaceTable,
                 on_available: Callable[[TrackNamespace], None]) -> None:
        self.store = store
        self._commit = commit
        self._counters = counters
        self._namespaces = namespaces
        self._on_available = on_available  # the rendezvous: SUBSCRIBEs held for a source
        self.tracks: dict[FullTrackName, RelayTrack] = {}
        # the same Tracks by namespace: what the relay holds of a namespace is looked up
        # without a scan (a session with 10,000 learned namespaces ends at once)
        self.by_namespace: dict[TrackNamespace, dict[FullTrackName, RelayTrack]] = {}
        # told of every Track that gains a live upstream (SUBSCRIBE_TRACKS, track_offers.py)
        self.listeners: set[Callable[[RelayTrack], None]] = set()
        self._created = 0
        self.sweep_every = 1024  # new Tracks between two sweeps of the registry
        # called after each sweep (what was kept of learned namespaces follows the registry)
        self.on_sweep: Callable[[], None] | None = None
        self._listing: set[asyncio.Task[None]] = set()  # list_until_committed
        # each Track's ingest waits for its subscribers past this (ingest_pacing.py); 0: never
        self.ingest_hold_bytes = 0

    def track(self, name: FullTrackName) -> RelayTrack:
        t = self.tracks.get(name)
        if t is None:
            self._created += 1
            if self._created % self.sweep_every == 0:
                self.sweep()
            t = self.tracks[name] = RelayTrack(name, self.store, self._commit)
            self.by_namespace.setdefault(name.namespace, {})[name] = t
            t.counters = self._counters
            if self.ingest_hold_bytes:
                t.pacer = IngestPacer(self.ingest_hold_bytes, self._counters)
            t.on_available = self._track_available
            stored = self.store.track_properties(t.key)
            if stored:  # a Track held in LMDB keeps its Track Properties across restarts
                t.set_properties(kvps_from_bytes(stored))
        return t

    def holds(self, namespace: TrackNamespace) -> bool:
        """Objects of a Track of ``namespace`` are cached here (memory or LMDB)."""
        return any(t.largest() is not None
                   for t in self.by_namespace.get(namespace, {}).values())

    def _track_available(self, track: RelayTrack) -> None:
        self._on_available(track.full_name.namespace)
        for listener in list(self.listeners):
            listener(track)

    def sweep(self) -> int:
        """Forget Tracks that have nothing left: no upstream, no subscriber, nothing cached
        in either tier. A long-running relay sees many publications come and go; their
        registry entries must not outlive their Objects. Returns how many were dropped."""
        dropped = 0
        for t in list(self.tracks.values()):
            if t.establishing is None and not t.upstreams and not t.forwarders and \
                    t.pending_commit is None and \
                    self.store.largest_object(t.key) is None:
                self._forget(t)
                dropped += 1
        if self.on_sweep is not None:
            self.on_sweep()
        return dropped

    def forget_if_idle(self, track: RelayTrack) -> None:
        """Drop the registry entry of a Track the relay knows nothing about (a refused
        SUBSCRIBE or FETCH for a name nobody publishes), so such requests cannot grow it."""
        if track.establishing is None and not track.upstreams and not track.forwarders and \
                track.largest() is None and self.tracks.get(track.full_name) is track:
            self._forget(track)

    def remove(self, name: FullTrackName) -> RelayTrack | None:
        """Take the Track out of the registry whatever it holds (an admin purge: the caller
        ends what it serves), by name and by namespace alike."""
        track = self.tracks.get(name)
        if track is not None:
            self._forget(track)
        return track

    def _forget(self, track: RelayTrack) -> None:
        name = track.full_name
        del self.tracks[name]
        same = self.by_namespace[name.namespace]
        del same[name]
        if not same:
            del self.by_namespace[name.namespace]
        self.store.memory.set_cache_duration(track.key, None)

    # -- a pushed Track's namespace ------------------------------------------------------------

    def list_until_committed(self, track: RelayTrack, entry: PublisherEntry) -> None:
        """``entry`` listed the namespace of a Track pushed here with PUBLISH, whose push has
        ended: it stays until LMDB holds the Track (the namespace is then listed for LMDB's
        sake, with no gap between), or until the Track can never be committed (it did not
        end with End of Track, its publisher failed, the registry forgot it). A first
        commit attempt can come before the last Group is whole; the namespace must not be
        withdrawn in between (the relay above would forget it and route nothing there)."""
        task = asyncio.ensure_future(self._listed(track, entry))
        self._listing.add(task)
        task.add_done_callback(self._listing.discard)

    async def _listed(self, track: RelayTrack, entry: PublisherEntry) -> None:
        try:
            while not track.committed and self.tracks.get(track.full_name) is track and \
                    track.store.known_final(track.key) is not None and \
                    not self.store.memory.is_aborted(track.key):
                await track.wait_change(LISTED_RECHECK)
        finally:
            self._namespaces.remove_publisher(entry)

    def close(self) -> None:
        for task in list(self._listing):
            task.cancel()


__all__ = ["TrackRegistry"]
