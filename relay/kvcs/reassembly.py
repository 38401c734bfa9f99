"""Consumer side: verified Objects of one segment back into K/V arrays (kvcs-draft 5.2-5.4).

A layer is usable when every needed Object of its Group has arrived, verified, in every
selected track; the reassembler records when (injected clock) so a consumer can start
computing layer l while later layers are still arriving. Objects of different publications
are combined in one segment only if both manifests say "deterministic": true.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .codecs import copy_into, decode_data
from .errors import MixedPublicationError, ReassemblyError
from .manifest import Manifest
from .payload import VerifiedObject
from .registry import Component
from .track_names import DataTrackName, data_track, parse_track_name


@dataclass(frozen=True)
class Source:
    """Where an Object came from: its publication and that publication's latest manifest."""

    pub_id: bytes
    manifest: Manifest


def select_tracks(segment: int, codec: str, *, joint: bool = False) -> list[str]:
    """The pair k.<codec>.sN + v.<codec>.sN, or the single kv.<codec>.sN (3.2)."""
    if joint:
        return [str(data_track(Component.KV, codec, segment))]
    return [str(data_track(Component.K, codec, segment)),
            str(data_track(Component.V, codec, segment))]


class SegmentReassembler:
    """Rebuilds ``k`` and ``v`` ([layers][kv_heads][blocks*B][head_dim], tokens relative to
    the segment's first block) from the Objects of one segment.

    ``blocks`` limits it to a prefix of the segment (5.3: Objects beyond are discarded);
    ``layers`` to a subset of layers (a partial retrieval); ``out_dtype`` is the dtype of the
    arrays (default: the descriptor's; lossy codecs decode into it). ``out`` = (k, v) are
    arrays of that shape to fill instead of new ones, e.g. views into a consumer's output
    covering every segment, so that the whole prefix is never held twice.
    """

    def __init__(self, manifest: Manifest, segment: int, tracks: Sequence[str], *,
                 blocks: int | None = None, layers: Iterable[int] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 out_dtype: np.dtype[Any] | type | None = None,
                 out: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        if not 0 <= segment < len(manifest.segments):
            raise ReassemblyError(f"segment {segment} is not in the manifest")
        self.entry = manifest.segments[segment]
        self.segment = segment
        self.manifest = manifest
        names = [parse_track_name(t) for t in tracks]
        self.tracks = self._check_selection(names)
        for name in self.tracks:
            if str(name) not in self.entry.tracks:
                raise ReassemblyError(f"track {name} is not offered in segment {segment}")
        self.blocks = self.entry.blocks if blocks is None else blocks
        if not 1 <= self.blocks <= self.entry.blocks:
            raise ReassemblyError(f"blocks must be 1..{self.entry.blocks}, not {self.blocks}")
        d = manifest.compat
        self.layers = sorted(set(range(d.layers) if layers is None else layers))
        if not self.layers or self.layers[0] < 0 or self.layers[-1] >= d.layers:
            raise ReassemblyError(f"layers must be a non-empty subset of 0..{d.layers - 1}")
        self.clock = clock
        dtype = np.dtype(out_dtype) if out_dtype is not None else d.dtype
        shape = (d.layers, d.kv_heads, self.blocks * d.block_tokens, d.head_dim)
        if out is not None:
            if any(a.shape != shape or a.dtype != dtype for a in out):
                raise ReassemblyError(f"out arrays must be {shape} of {dtype}")
            self.k, self.v = out
        else:
            # np.zeros leaves untouched layers as unbacked pages: a layer subset costs little.
            self.k = np.zeros(shape, dtype)
            self.v = np.zeros(shape, dtype)
        self._have: dict[tuple[str, int], set[int]] = {
            (str(t), g): set() for t in self.tracks for g in self.layers}
        self.layer_ready_at: dict[int, float] = {}
        self._sources: dict[bytes, bool] = {}

    @staticmethod
    def _check_selection(names: list[Any]) -> list[DataTrackName]:
        if not all(isinstance(n, DataTrackName) for n in names):
            raise ReassemblyError("only data tracks can be selected")
        comps = sorted(n.component for n in names)
        codecs = {n.codec for n in names}
        segments = {n.segment for n in names}
        if comps not in ([Component.K, Component.V], [Component.KV]) or len(codecs) != 1 \
                or len(segments) != 1:
            raise ReassemblyError("select either the k and v tracks of one codec or one kv "
                                  f"track of one segment, not {[str(n) for n in names]}")
        if names[0].codec_value is None:
            raise ReassemblyError(f"codec {names[0].codec!r} is not implemented")
        return names

    def _check_source(self, source: Source) -> None:
        if source.pub_id in self._sources:
            return
        entry = source.manifest.segments[self.segment] \
            if self.segment < len(source.manifest.segments) else None
        if source.manifest.compat != self.manifest.compat or entry is None or (
                entry.first_block, entry.blocks, entry.block_keys_sha256) != (
                self.entry.first_block, self.entry.blocks, self.entry.block_keys_sha256):
            raise ReassemblyError("the publication's segment covers other content")
        det = source.manifest.deterministic
        if self._sources and not (det and all(self._sources.values())):
            raise MixedPublicationError(
                f"segment {self.segment} already holds Objects of another publication; "
                "mixing needs \"deterministic\": true in both manifests"
            )
        self._sources[source.pub_id] = det

    def accept(self, track: str, obj: VerifiedObject, source: Source, *,
               checked: bool = False) -> list[int]:
        """Place one verified Object; return the layers that became usable (0 or 1 of them).

        Objects outside the selected blocks/layers and duplicates are ignored. The header is
        checked against the source's manifest (including its listed digest, if any), unless
        ``checked`` says the caller already did (``source.manifest.check_object``).
        """
        name = parse_track_name(track)
        h = obj.header
        key = (str(name), h.layer)
        if key not in self._have or h.block_index >= self.blocks:
            if not isinstance(name, DataTrackName) or name not in self.tracks:
                raise ReassemblyError(f"track {track} is not selected")
            return []
        if h.block_index in self._have[key]:
            return []
        self._check_source(source)
        if not checked:
            source.manifest.check_object(name, obj)
        assert isinstance(name, DataTrackName) and name.codec_value is not None
        k, v = decode_data(name.codec_value, name.component, obj.data,
                           self.manifest.compat, out_dtype=self.k.dtype)
        B = self.manifest.block_tokens
        tokens = slice(h.block_index * B, (h.block_index + 1) * B)
        if k is not None:
            copy_into(self.k[h.layer, :, tokens, :], k)
        if v is not None:
            copy_into(self.v[h.layer, :, tokens, :], v)
        self._have[key].add(h.block_index)
        if self._layer_done(h.layer) and h.layer not in self.layer_ready_at:
            self.layer_ready_at[h.layer] = self.clock()
            return [h.layer]
        return []

    def _layer_done(self, layer: int) -> bool:
        return all(len(self._have[(str(t), layer)]) == self.blocks for t in self.tracks)

    def usable(self, layer: int) -> bool:
        return layer in self.layer_ready_at

    @property
    def complete(self) -> bool:
        return len(self.layer_ready_at) == len(self.layers)

    def missing(self) -> dict[int, dict[str, list[int]]]:
        """Per layer not yet usable, per track, the Object IDs still missing (for recovery)."""
        out: dict[int, dict[str, list[int]]] = {}
        for g in self.layers:
            if g in self.layer_ready_at:
                continue
            out[g] = {str(t): [b for b in range(self.blocks) if b not in self._have[(str(t), g)]]
                      for t in self.tracks}
        return out
