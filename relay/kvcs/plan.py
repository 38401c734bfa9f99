"""Producer side: what to publish, in which order (kvcs-draft 3.3-3.6).

A PublicationPlan turns a computed KV cache into plain data: the namespace, and a stream of
PlannedObjects in production order that a network publisher sends as they come:

* per segment (one per prefill pass), layer by layer; within a layer, track by track, each
  Group's Objects in Object order in Subgroup 0 (Group = layer, Object = block index within
  the segment), Publisher Priority floor(128 * g / L);
* manifest versions (Group m, Object 0, priority 0) when a segment is added, after every
  ``manifest_every`` completed layers, and when a segment completes.

``ends_group`` / ``ends_track`` tell the publisher when to follow an Object with the End of
Group / End of Track status. Each manifest version is a one-Object Group; the last version
ends the manifest track, because the plan knows that no segment follows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .codecs import encode_data, section
from .cose import PrivateKey, sign_manifest
from .descriptor import Descriptor
from .identifiers import (
    anchor_key,
    block_keys,
    block_keys_sha256,
    new_pub_id,
    scope_id,
)
from .layered import KvArray
from .manifest import Manifest, SegmentEntry
from .namespace import KvcsNamespace
from .payload import encode_object
from .registry import Codec, Component
from .track_names import MANIFEST, MANIFEST_COSE, data_track

MANIFEST_EVERY = 8


@dataclass(frozen=True)
class TrackSpec:
    component: Component
    codec: Codec

    def name(self, segment: int) -> str:
        return str(data_track(self.component, self.codec, segment))


SPLIT_RAW = (TrackSpec(Component.K, Codec.RAW), TrackSpec(Component.V, Codec.RAW))


@dataclass(frozen=True)
class PlannedObject:
    track: str
    group: int
    object_id: int
    priority: int
    payload: bytes
    subgroup: int = 0
    ends_group: bool = False
    ends_track: bool = False
    # Makes ``payload`` again, bit for bit, from the cache (data Objects): a publisher that
    # answers a relay's FETCH later needs no copy of what it sent (peers/serving.py).
    reload: Callable[[], bytes] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class SegmentLayout:
    segment: int
    first_block: int
    blocks: int


def publisher_priority(group: int, layers: int) -> int:
    """floor(128 * g / L): earlier layers first under contention."""
    return (128 * group) // layers


class PublicationPlan:
    """Everything one publication sends. ``k``/``v`` are [layers][kv_heads][tokens][head_dim]
    arrays (numpy, memmaps from kvfile, or LayeredArrays made per layer); only full blocks
    are published. Objects are made as they are iterated, so the plan holds no payloads.

    ``segment_blocks`` splits the blocks into prefill passes (default: one segment with every
    full block). ``signer`` = (private key, kid) publishes "manifest.cose" instead of
    "manifest".
    """

    def __init__(self, k: KvArray, v: KvArray, descriptor: Descriptor, scope_key: bytes,
                 tokens: Sequence[int] | np.ndarray, *, pub_id: bytes | None = None,
                 segment_blocks: Sequence[int] | None = None,
                 tracks: Sequence[TrackSpec] = SPLIT_RAW, deterministic: bool = False,
                 manifest_every: int = MANIFEST_EVERY,
                 signer: tuple[PrivateKey, bytes] | None = None) -> None:
        d = descriptor
        if k.shape != v.shape or k.ndim != 4 \
                or (k.shape[0], k.shape[1], k.shape[3]) != (d.layers, d.kv_heads, d.head_dim):
            raise ValueError(f"K {k.shape} / V {v.shape} do not fit the descriptor")
        if k.dtype != d.dtype or v.dtype != d.dtype:
            raise ValueError(f"K/V dtype must be the descriptor's {d.dtype_name}")
        if not tracks or len(set(tracks)) != len(tracks):
            raise ValueError("tracks must be a non-empty list without repeats")
        if manifest_every < 1:
            raise ValueError("manifest_every must be at least 1")
        B = d.block_tokens
        available = min(k.shape[2], len(tokens)) // B
        if segment_blocks is None:
            segment_blocks = [available]
        if not segment_blocks or any(n < 1 for n in segment_blocks):
            raise ValueError("every segment needs at least one full block")
        if sum(segment_blocks) > available:
            raise ValueError(f"segments cover {sum(segment_blocks)} blocks, only {available} "
                             "full blocks have both tokens and K/V")
        self.k, self.v, self.descriptor = k, v, d
        self.tracks = tuple(tracks)
        self.deterministic = deterministic
        self.manifest_every = manifest_every
        self.signer = signer
        self.segments: list[SegmentLayout] = []
        first = 0
        for s, n in enumerate(segment_blocks):
            self.segments.append(SegmentLayout(s, first, n))
            first += n
        self.block_keys = block_keys(scope_key, d.compat_id, list(tokens)[:first * B], B)
        self.namespace = KvcsNamespace(
            scope_id=scope_id(scope_key), compat_id=d.compat_id,
            anchor_key=anchor_key(self.block_keys[:segment_blocks[0]]),
            pub_id=pub_id if pub_id is not None else new_pub_id())
        self.manifest_track = MANIFEST_COSE if signer is not None else MANIFEST
        self.manifest = Manifest(d, [], deterministic)  # the latest version produced so far
        self._manifest_group = 0

    # -- plain data -----------------------------------------------------------------------------

    def track_names(self, segment: int) -> list[str]:
        return [t.name(segment) for t in self.tracks]

    def objects(self) -> list[PlannedObject]:
        """Every Object in production order (materialized; use iteration for big caches)."""
        return list(self)

    def __iter__(self) -> Iterator[PlannedObject]:
        # Each iteration replays the same publication from its first manifest version.
        self.manifest = Manifest(self.descriptor, [], self.deterministic)
        self._manifest_group = 0
        for layout in self.segments:
            yield from self.segment_objects(layout.segment)

    # -- production -------------------------------------------------------------------------------

    def segment_objects(self, segment: int) -> Iterator[PlannedObject]:
        """One prefill pass: its manifest versions and data Objects (call in segment order)."""
        layout = self.segments[segment]
        if len(self.manifest.segments) != segment:
            raise RuntimeError(f"segment {segment} must follow segments 0..{segment - 1}")
        d = self.descriptor
        L = d.layers
        names = self.track_names(segment)
        keys = self.block_keys[layout.first_block:layout.first_block + layout.blocks]
        entry = SegmentEntry(segment, layout.first_block, layout.blocks, block_keys_sha256(keys),
                             names, complete=False, object_digests={n: [] for n in names})
        self.manifest.segments.append(entry)
        yield self._manifest_version(last=False)
        assert entry.object_digests is not None
        last_segment = segment == len(self.segments) - 1
        for g in range(L):
            priority = publisher_priority(g, L)
            for spec, name in zip(self.tracks, names, strict=True):
                digests: list[str] = []
                for obj in range(layout.blocks):
                    payload = self._payload(spec, g, layout.first_block, obj)
                    digests.append(payload[36:68].hex())  # the header's Data Digest
                    yield PlannedObject(name, g, obj, priority, payload,
                                        ends_group=obj == layout.blocks - 1,
                                        ends_track=obj == layout.blocks - 1 and g == L - 1,
                                        reload=functools.partial(
                                            self._payload, spec, g, layout.first_block, obj))
                entry.object_digests[name].append(digests)
            if g == L - 1:
                entry.complete = True
                yield self._manifest_version(last=last_segment)
            elif (g + 1) % self.manifest_every == 0:
                yield self._manifest_version(last=False)

    def _payload(self, spec: TrackSpec, layer: int, first_block: int, obj: int) -> bytes:
        d = self.descriptor
        block = first_block + obj
        sections: dict[str, Any] = {}
        if spec.component in (Component.K, Component.KV):
            sections["k"] = section(self.k, layer, block, d.block_tokens)
        if spec.component in (Component.V, Component.KV):
            sections["v"] = section(self.v, layer, block, d.block_tokens)
        data = encode_data(spec.codec, spec.component, **sections)
        return encode_object(component=spec.component, layer=layer, block_index=obj,
                             token_start=block * d.block_tokens, token_count=d.block_tokens,
                             codec=int(spec.codec), data=data)

    def _manifest_version(self, *, last: bool) -> PlannedObject:
        body = self.manifest.to_json()
        if self.signer is not None:
            key, kid = self.signer
            body = sign_manifest(body, key, kid)
        group = self._manifest_group
        self._manifest_group += 1
        return PlannedObject(self.manifest_track, group, 0, 0, body, ends_group=True,
                             ends_track=last)
