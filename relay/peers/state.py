"""What one retrieval holds: the verified manifest, one reassembly target per segment it
reuses, and the per-layer statistics of the report. Shared by live and completed retrieval
and by recovery, so Objects from any relay land in the same place."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relay.kvcs.descriptor import Descriptor
from relay.kvcs.errors import KvcsError
from relay.kvcs.identifiers import block_keys_sha256
from relay.kvcs.manifest import Manifest, SegmentEntry
from relay.kvcs.namespace import KvcsNamespace
from relay.kvcs.reassembly import Source, select_tracks
from relay.kvcs.registry import Codec

from .verification import ManifestVerifier, Reassembler, check_object

# (relay URL, track, Group, Object, payload) -> payload: a test-only hook that stands for
# corruption in flight.
Tamper = Callable[[str, str, int, int, bytes], bytes]


@dataclass
class LayerStats:
    bytes: int = 0
    verified: int = 0
    discarded: int = 0


@dataclass
class Target:
    """One reused segment: its first ``blocks`` blocks from ``tracks``."""

    entry: SegmentEntry
    blocks: int
    tracks: list[str]
    reasm: Reassembler
    pub_id: bytes


def choose_tracks(entry: SegmentEntry, codec: str, joint: bool) -> list[str]:
    """The preferred selection if offered, else raw k+v, else any implemented selection."""
    options = [select_tracks(entry.segment, codec, joint=joint),
               select_tracks(entry.segment, "raw"),
               *(select_tracks(entry.segment, c.label, joint=j) for c in Codec
                 for j in (False, True))]
    for tracks in options:
        if all(t in entry.tracks for t in tracks):
            return tracks
    raise KvcsError(f"segment {entry.segment} offers no selection this consumer can decode")


@dataclass
class RetrievalState:
    descriptor: Descriptor
    keys: Sequence[bytes]  # the prompt's Block Keys (at most the blocks wanted)
    codec: str = "raw"
    joint: bool = False
    tamper: Tamper | None = None
    trusted_blocks: int | None = None  # an index record vouches for this many blocks
    # --require-cose: an Object counts only once a verified signed manifest version lists
    # its digest, so a self-consistent forgery cannot slip in before the manifest catches up.
    require_listed: bool = False
    t0: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # time.monotonic() past which the retrieval gives up
    deadline_passed: bool = False
    namespace: KvcsNamespace | None = None
    verifier: ManifestVerifier | None = None
    manifest_final: bool = False
    stop_segments: bool = False  # a later segment does not match the prompt
    targets: dict[int, Target] = field(default_factory=dict)
    layers: dict[int, LayerStats] = field(default_factory=dict)
    unlisted: dict[tuple[int, str, int, int], bytes] = field(default_factory=dict)
    discard_reasons: list[str] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    retries: int = 0
    duplicates: int = 0  # Objects received again (ignored): exactly-once is checkable
    # Objects and payload bytes each connection's layer FETCHes carried ("url#n": the n-th
    # connection this retrieval made to that relay): with --connections, that each one
    # carried its part is checkable, and a connection that died shows as one that stopped.
    carried: dict[str, list[int]] = field(default_factory=dict)
    # The shortest request round trip seen (SETUP, FETCH_OK, SUBSCRIBE_OK), in seconds: what
    # one more request on this path costs at least, so recovery is never given less.
    rtt: float | None = None
    # K and V of every reused block, in prompt order; each segment's reassembler fills its
    # own token range (allocated at the first segment: np.zeros leaves untouched pages
    # unbacked, so a prompt longer than what is reused costs nothing).
    _out: tuple[np.ndarray, np.ndarray] | None = None
    # Makes those two arrays, given their shape (default np.zeros): e.g. the mapped K and V
    # of the output file, which then fills as Objects arrive (peers/output.py).
    allocate: Callable[[tuple[int, int, int, int]], tuple[np.ndarray, np.ndarray]] | None = None
    _progress: asyncio.Event = field(default_factory=asyncio.Event)
    on_progress: Callable[[RetrievalState], None] | None = None  # e.g. a progress line

    # -- progress -------------------------------------------------------------------------------

    def bump(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self)
        self._progress.set()
        self._progress = asyncio.Event()

    async def wait_progress(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._progress.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def carry(self, connection: str, nbytes: int) -> None:
        c = self.carried.setdefault(connection, [0, 0])
        c[0] += 1
        c[1] += nbytes

    def decide(self, action: str, **detail: Any) -> None:
        self.decisions.append({"t_ms": round(self.elapsed_ms(), 2), "action": action, **detail})

    def note_rtt(self, seconds: float) -> None:
        """One request's round trip (request sent to its first answer). The minimum is kept:
        a longer one includes the relay's own work (an upstream fill), not the path."""
        if self.rtt is None or seconds < self.rtt:
            self.rtt = seconds

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.t0) * 1000

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def fill_timeout_ms(self) -> int | None:
        """FILL_TIMEOUT for a request sent now: a relay must not search upstream for longer
        than the consumer is willing to wait (MOQT-PROFILE FILL_TIMEOUT, kvcs-draft 5.4)."""
        left = self.remaining()
        return None if left is None else int(left * 1000)

    # -- manifest -------------------------------------------------------------------------------

    def use_publication(self, ns: KvcsNamespace, verifier: ManifestVerifier) -> None:
        self.namespace, self.verifier = ns, verifier
        self.manifest_final = False
        self.stop_segments = False

    @property
    def manifest(self) -> Manifest | None:
        return self.verifier.current if self.verifier is not None else None

    def on_manifest(self, track: str, group: int, payload: bytes | memoryview) -> list[Target]:
        """Verify a manifest version (raises ManifestRefused); return the new targets."""
        assert self.verifier is not None and self.namespace is not None
        manifest = self.verifier.accept(track, group, payload)
        if manifest is None:
            return []
        self._recheck(manifest)
        new = self._extend_targets(manifest)
        self.bump()
        return new

    def _extend_targets(self, manifest: Manifest) -> list[Target]:
        assert self.namespace is not None
        new: list[Target] = []
        covered = sum(t.blocks for t in self.targets.values())
        for entry in manifest.segments:
            if entry.segment in self.targets:
                t = self.targets[entry.segment]
                if t.pub_id != self.namespace.pub_id:
                    self._check_same_layout(t, entry)
                continue
            if self.stop_segments or entry.first_block != covered:
                break
            use = self._usable_blocks(entry)
            if use <= 0:
                self.stop_segments = True
                break
            tracks = choose_tracks(entry, self.codec, self.joint)
            reasm = self.reassembler(manifest, entry, tracks, use)
            target = Target(entry, use, tracks, reasm, self.namespace.pub_id)
            self.targets[entry.segment] = target
            new.append(target)
            covered += use
            if use < entry.blocks:
                self.stop_segments = True  # the prompt diverges inside this segment
                break
        return new

    def reassembler(self, manifest: Manifest, entry: SegmentEntry, tracks: list[str],
                    blocks: int) -> Reassembler:
        """A segment's reassembler writing into its token range of the output arrays."""
        d = self.descriptor
        if self._out is None:
            shape = (d.layers, d.kv_heads, len(self.keys) * d.block_tokens, d.head_dim)
            self._out = self.allocate(shape) if self.allocate is not None else (
                np.zeros(shape, d.dtype), np.zeros(shape, d.dtype))
        span = slice(entry.first_block * d.block_tokens,
                     (entry.first_block + blocks) * d.block_tokens)
        out = (self._out[0][:, :, span], self._out[1][:, :, span])
        return Reassembler(manifest, entry.segment, tracks, blocks=blocks,
                           clock=time.monotonic, out=out)

    def _usable_blocks(self, entry: SegmentEntry) -> int:
        first, n = entry.first_block, entry.blocks
        if first + n <= len(self.keys) and \
                block_keys_sha256(self.keys[first:first + n]) == entry.block_keys_sha256:
            return n
        if self.trusted_blocks is not None and first < self.trusted_blocks:
            return min(n, self.trusted_blocks - first, len(self.keys) - first)
        return 0

    @staticmethod
    def _check_same_layout(t: Target, entry: SegmentEntry) -> None:
        old = t.entry
        if (old.first_block, old.blocks, old.block_keys_sha256) != (
                entry.first_block, entry.blocks, entry.block_keys_sha256):
            raise KvcsError(f"segment {entry.segment} covers other blocks in this publication")

    def wants_more_segments(self) -> bool:
        if self.manifest_final or self.stop_segments:
            return False
        covered = sum(t.blocks for t in self.targets.values())
        limit = len(self.keys)
        return covered < limit

    # -- Objects --------------------------------------------------------------------------------

    def on_object(self, relay: str, target: Target, track: str, group: int, object_id: int,
                  payload: bytes | memoryview) -> None:
        if group >= self.descriptor.layers:
            return  # Group L holds only End of Track
        stats = self.layers.setdefault(group, LayerStats())
        if object_id >= target.blocks:
            stats.discarded += 1  # the prompt diverges before this block (5.3)
            return
        if target.reasm.has(track, group, object_id):
            self.duplicates += 1
            return
        if self.tamper is not None:
            payload = self.tamper(relay, track, group, object_id, bytes(payload))
        manifest = self.manifest
        assert manifest is not None and self.namespace is not None
        try:
            obj, listed = check_object(manifest, track, group, object_id, payload)
            # Mixing publications in one segment raises MixedPublicationError (5.4).
            target.reasm.accept(track, obj, Source(self.namespace.pub_id, manifest),
                                checked=True)
        except KvcsError as e:
            stats.discarded += 1
            if len(self.discard_reasons) < 50:
                self.discard_reasons.append(f"{relay} {track} {group}/{object_id}: {e}")
            self.bump()
            return
        if not listed:
            self.unlisted[(target.entry.segment, track, group, object_id)] = \
                obj.header.data_digest
        stats.verified += 1
        stats.bytes += len(payload)
        self.bump()

    def _recheck(self, manifest: Manifest) -> None:
        for key, digest in list(self.unlisted.items()):
            segment, track, group, obj = key
            listed = manifest.expected_digest(track, group, obj)
            if listed is None:
                continue
            del self.unlisted[key]
            if listed != digest:
                self.targets[segment].reasm.forget(track, group, obj)
                stats = self.layers.setdefault(group, LayerStats())
                stats.verified -= 1
                stats.discarded += 1
                self.discard_reasons.append(f"{track} {group}/{obj}: digest not the listed one")

    # -- results --------------------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        return bool(self.targets) and not self.wants_more_segments() and all(
            t.reasm.complete for t in self.targets.values()) and not self.unverified_layers()

    def unverified_layers(self) -> set[int]:
        """Layers holding Objects no signed manifest version has listed yet (only when
        listing is required: otherwise 3.5 suffices until a version says otherwise)."""
        if not self.require_listed:
            return set()
        return {group for _, _, group, _ in self.unlisted}

    def unverified_objects(self) -> list[str]:
        return [f"s{seg} {track} {group}/{obj}"
                for seg, track, group, obj in sorted(self.unlisted)] \
            if self.require_listed else []

    def usable_layers(self) -> dict[int, float]:
        """Layer -> ms since start when it became usable in every reused segment."""
        out: dict[int, float] = {}
        if not self.targets:
            return out
        unverified = self.unverified_layers()
        for g in range(self.descriptor.layers):
            if g in unverified:
                continue
            times = [t.reasm.layer_ready_at.get(g) for t in self.targets.values()]
            if all(x is not None for x in times):
                out[g] = (max(x for x in times if x is not None) - self.t0) * 1000
        return out

    def missing_layers(self) -> list[int]:
        usable = self.usable_layers()
        return [g for g in range(self.descriptor.layers) if g not in usable]

    def reused_blocks(self) -> int:
        return sum(t.blocks for t in self.targets.values())

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """K and V of the reused prefix; layers that are not usable are zero, so that
        nothing unverified (or withdrawn) ever reaches the output."""
        d = self.descriptor
        if not self.targets or self._out is None:
            shape = (d.layers, d.kv_heads, 0, d.head_dim)
            return np.zeros(shape, d.dtype), np.zeros(shape, d.dtype)
        # Views, not a copy: the targets cover blocks 0..reused-1 in order (_extend_targets).
        tokens = slice(0, self.reused_blocks() * d.block_tokens)
        k, v = self._out[0][:, :, tokens], self._out[1][:, :, tokens]
        for g in self.missing_layers():
            k[g] = 0
            v[g] = 0
        return k, v
