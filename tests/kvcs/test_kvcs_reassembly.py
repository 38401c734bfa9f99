"""Consumer side: reassembly, per-layer readiness, publication mixing (kvcs-draft 5.2-5.4)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from relay.kvcs.errors import (
    ManifestDigestMismatchError,
    MixedPublicationError,
    ReassemblyError,
)
from relay.kvcs.manifest import Manifest, parse_manifest
from relay.kvcs.payload import encode_object, verify_object
from relay.kvcs.plan import PlannedObject, PublicationPlan, TrackSpec
from relay.kvcs.reassembly import SegmentReassembler, Source, select_tracks
from relay.kvcs.registry import Codec, Component
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens

L, H, D, B, T = 4, 2, 4, 2, 12
SCOPE_KEY = bytes(32)
TRACKS = [TrackSpec(c, codec) for codec in (Codec.RAW, Codec.ZSTD, Codec.INT8)
          for c in (Component.K, Component.V)] + [TrackSpec(Component.KV, Codec.ZSTD)]
K, V = synthetic_kv(L, H, D, T, "bfloat16", seed=11)


def produce(deterministic: bool = False, pub_id: bytes | None = None
            ) -> tuple[PublicationPlan, list[PlannedObject], Manifest]:
    d = synthetic_descriptor(L, H, D, "bfloat16", block_tokens=B)
    p = PublicationPlan(K, V, d, SCOPE_KEY, synthetic_tokens(T), segment_blocks=[4, 2],
                        tracks=TRACKS, deterministic=deterministic, pub_id=pub_id)
    objs = p.objects()
    return p, objs, parse_manifest([o for o in objs if o.track == "manifest"][-1].payload)


P, OBJS, MANIFEST = produce()
SRC = Source(P.namespace.pub_id, MANIFEST)


def feed(r: SegmentReassembler, tracks: list[str], source: Source = SRC,
         objs: list[PlannedObject] = OBJS) -> Iterator[list[int]]:
    for o in objs:
        if o.track in tracks:
            yield r.accept(o.track, verify_object(o.payload, o.group, o.object_id), source)


def u16(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16)


@pytest.mark.parametrize(("codec", "joint"), [("raw", False), ("zstd", False), ("zstd", True)])
def test_lossless_rebuild_bit_exact(codec: str, joint: bool) -> None:
    tracks = select_tracks(0, codec, joint=joint)
    clock = iter(range(100, 200))
    r = SegmentReassembler(MANIFEST, 0, tracks, clock=lambda: float(next(clock)))
    ready = [g for step in feed(r, tracks) for g in step]
    assert ready == [0, 1, 2, 3] and r.complete and r.missing() == {}
    assert np.array_equal(u16(r.k), u16(K[:, :, :8])) and np.array_equal(u16(r.v), u16(V[:, :, :8]))
    times = [r.layer_ready_at[g] for g in range(L)]
    assert times == sorted(times) and all(r.usable(g) for g in range(L))


def test_int8_rebuild_within_bound() -> None:
    r = SegmentReassembler(MANIFEST, 1, select_tracks(1, "int8"), out_dtype=np.float32)
    list(feed(r, select_tracks(1, "int8")))
    x = K[:, :, 8:12].astype(np.float32)
    step = np.abs(x).max(axis=-1, keepdims=True) / 127
    assert r.complete and np.all(np.abs(r.k - x) <= step / 2 * 1.001 + 1e-7)


def test_layer_usable_only_when_all_selected_tracks_arrived() -> None:
    tracks = select_tracks(0, "raw")
    r = SegmentReassembler(MANIFEST, 0, tracks, clock=lambda: 7.0)
    k_only = [o for o in OBJS if o.track == "k.raw.s0"]
    assert all(step == [] for step in feed(r, tracks, objs=k_only))
    assert not r.usable(0) and r.missing()[0] == {"k.raw.s0": [], "v.raw.s0": [0, 1, 2, 3]}
    v0 = [o for o in OBJS if o.track == "v.raw.s0" and o.group == 0]
    assert [g for step in feed(r, tracks, objs=v0) for g in step] == [0]
    assert r.layer_ready_at == {0: 7.0} and not r.complete


def test_prefix_and_layer_subset() -> None:
    tracks = select_tracks(0, "raw")
    r = SegmentReassembler(MANIFEST, 0, tracks, blocks=2, layers=[1, 2])
    ready = [g for step in feed(r, tracks) for g in step]
    assert ready == [1, 2] and r.complete
    assert r.k.shape == (L, H, 2 * B, D)
    assert np.array_equal(u16(r.k[1:3]), u16(K[1:3, :, :4]))
    assert not r.k[0].any()  # layer 0 was not requested


def test_duplicates_ignored_and_bad_digest_rejected() -> None:
    tracks = select_tracks(0, "raw")
    r = SegmentReassembler(MANIFEST, 0, tracks)
    o = next(o for o in OBJS if o.track == "k.raw.s0")
    obj = verify_object(o.payload, 0, 0)
    assert r.accept(o.track, obj, SRC) == [] and r.accept(o.track, obj, SRC) == []
    forged = encode_object(component=Component.K, layer=0, block_index=1, token_start=B,
                           token_count=B, codec=0, data=bytes(H * B * D * 2))
    with pytest.raises(ManifestDigestMismatchError):
        r.accept("k.raw.s0", verify_object(forged, 0, 1), SRC)


def test_mixing_publications() -> None:
    tracks = select_tracks(0, "raw")
    _, objs2, m2 = produce()
    r = SegmentReassembler(MANIFEST, 0, tracks)
    first = next(o for o in OBJS if o.track == "k.raw.s0")
    r.accept(first.track, verify_object(first.payload, 0, 0), SRC)
    other = next(o for o in objs2 if o.track == "k.raw.s0" and o.object_id == 1)
    src2 = Source(b"\x02" * 16, m2)
    with pytest.raises(MixedPublicationError):
        r.accept(other.track, verify_object(other.payload, 0, 1), src2)
    # Both deterministic: allowed (the synthetic cache is bit-identical, as promised).
    _, d1, dm1 = produce(deterministic=True)
    _, d2, dm2 = produce(deterministic=True)
    r = SegmentReassembler(dm1, 0, tracks)
    half = [o for o in d1 if o.track in tracks and o.object_id < 2]
    rest = [o for o in d2 if o.track in tracks and o.object_id >= 2]
    list(feed(r, tracks, Source(b"\x01" * 16, dm1), half))
    list(feed(r, tracks, Source(b"\x02" * 16, dm2), rest))
    assert r.complete and np.array_equal(u16(r.k), u16(K[:, :, :8]))
    # One deterministic, one not: refused.
    r = SegmentReassembler(dm1, 0, tracks)
    list(feed(r, tracks, Source(b"\x01" * 16, dm1), half))
    with pytest.raises(MixedPublicationError):
        list(feed(r, tracks, Source(b"\x03" * 16, m2), rest))


@pytest.mark.parametrize(("tracks", "kw"), [
    (["k.raw.s0"], {}),
    (["k.raw.s0", "v.zstd.s0"], {}),
    (["k.raw.s0", "v.raw.s1"], {}),
    (["kv.raw.s0"], {}),                 # not offered
    (["manifest"], {}),
    (["k.raw.s0", "v.raw.s0"], {"blocks": 5}),
    (["k.raw.s0", "v.raw.s0"], {"layers": [L]}),
])
def test_bad_selection(tracks: list[str], kw: dict[str, object]) -> None:
    with pytest.raises(ReassemblyError):
        SegmentReassembler(MANIFEST, 0, tracks, **kw)  # type: ignore[arg-type]


def test_unselected_track_rejected() -> None:
    r = SegmentReassembler(MANIFEST, 0, select_tracks(0, "raw"))
    o = next(o for o in OBJS if o.track == "k.zstd.s0")
    with pytest.raises(ReassemblyError, match="not selected"):
        r.accept(o.track, verify_object(o.payload, 0, 0), SRC)
