"""Producer side: the publication plan (kvcs-draft 3.3-3.6)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from relay.kvcs.cose import KeyStore, verify_manifest_cose
from relay.kvcs.identifiers import anchor_key, block_keys, block_keys_sha256, scope_id
from relay.kvcs.manifest import parse_manifest
from relay.kvcs.payload import verify_object
from relay.kvcs.plan import PublicationPlan, TrackSpec, publisher_priority
from relay.kvcs.registry import Codec, Component
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens
from relay.kvcs.track_names import parse_track_name

H, D, B = 2, 4, 2
SCOPE_KEY = bytes(range(32))


def make(layers: int = 20, tokens: int = 9, **kw: Any) -> PublicationPlan:
    d = synthetic_descriptor(layers, H, D, "float16", block_tokens=B)
    k, v = synthetic_kv(layers, H, D, tokens, "float16", seed=1)
    return PublicationPlan(k, v, d, SCOPE_KEY, synthetic_tokens(tokens), **kw)


def test_namespace_and_identifiers() -> None:
    p = make(pub_id=b"p" * 16)
    toks = synthetic_tokens(9)
    keys = block_keys(SCOPE_KEY, p.descriptor.compat_id, toks, B)
    assert len(keys) == 4 and p.block_keys == keys
    ns = p.namespace
    assert ns.fields[0] == b"kvcs-1" and ns.scope_id == scope_id(SCOPE_KEY)
    assert ns.compat_id == p.descriptor.compat_id and ns.anchor_key == anchor_key(keys)
    assert ns.pub_id == b"p" * 16
    assert make().namespace.pub_id != make().namespace.pub_id  # fresh by default


def test_single_segment_order_priorities_and_status_flags() -> None:
    p = make()
    objs = p.objects()
    data = [o for o in objs if o.track != "manifest"]
    assert len(data) == 20 * 2 * 4
    # Layer by layer, track by track, Objects ascending, all in Subgroup 0.
    expected = [(t, g, i) for g in range(20) for t in ("k.raw.s0", "v.raw.s0") for i in range(4)]
    assert [(o.track, o.group, o.object_id) for o in data] == expected
    assert all(o.subgroup == 0 for o in objs)
    assert all(o.priority == 128 * o.group // 20 for o in data)
    assert [publisher_priority(g, 20) for g in (0, 1, 19)] == [0, 6, 121]
    assert [o.ends_group for o in data] == [i == 3 for (_, _, i) in expected]
    assert [o.object_id for o in data if o.ends_track] == [3, 3]
    assert all(o.group == 19 for o in data if o.ends_track)
    for o in data:
        obj = verify_object(o.payload, o.group, o.object_id)
        name = parse_track_name(o.track)
        assert obj.header.component is name.component  # type: ignore[union-attr]
        assert obj.header.token_start == o.object_id * B and obj.header.token_count == B


def test_manifest_schedule() -> None:
    p = make()
    objs = p.objects()
    positions = [i for i, o in enumerate(objs) if o.track == "manifest"]
    manifests = [objs[i] for i in positions]
    assert [m.group for m in manifests] == [0, 1, 2, 3]
    assert all(m.priority == 0 and m.object_id == 0 and m.ends_group for m in manifests)
    assert [m.ends_track for m in manifests] == [False, False, False, True]
    parsed = [parse_manifest(m.payload) for m in manifests]
    # Added (0 layers), after 8 and 16 completed layers, complete (20).
    assert [len((p.segments[0].object_digests or {}).get("k.raw.s0", ()))
            for p in parsed] == [0, 8, 16, 20]
    assert [p.segments[0].complete for p in parsed] == [False, False, False, True]
    assert positions[0] == 0
    # Each version follows the last Object of the layer it reports.
    for idx, layers_done in zip(positions[1:], (8, 16, 20), strict=True):
        assert objs[idx - 1].group == layers_done - 1 and objs[idx - 1].ends_group
    for older, newer in itertools.pairwise(parsed):
        older.check_successor(newer)
    m = parsed[-1]
    assert m.segments[0].block_keys_sha256 == block_keys_sha256(p.block_keys)
    for o in objs:
        if o.track != "manifest":
            assert m.check_object(o.track, verify_object(o.payload, o.group, o.object_id))
    assert p.objects() == objs  # iterating again replays the same publication


def test_manifest_every_layer() -> None:
    objs = make(layers=3, manifest_every=1).objects()
    assert sum(o.track == "manifest" for o in objs) == 4


def test_chunked_prefill_segments() -> None:
    p = make(layers=3, tokens=11, segment_blocks=[2, 3])
    objs = p.objects()
    tracks = {o.track for o in objs}
    assert tracks == {"manifest", "k.raw.s0", "v.raw.s0", "k.raw.s1", "v.raw.s1"}
    # Segment 1 starts after segment 0 completed; Group IDs increase with time per track.
    last_s0 = max(i for i, o in enumerate(objs) if o.track.endswith("s0"))
    first_s1 = min(i for i, o in enumerate(objs) if o.track.endswith("s1"))
    assert last_s0 < first_s1
    for t in tracks - {"manifest"}:
        groups = [o.group for o in objs if o.track == t]
        assert groups == sorted(groups)
    s1 = [o for o in objs if o.track == "k.raw.s1"]
    assert [verify_object(o.payload, o.group, o.object_id).header.token_start
            for o in s1[:3]] == [4, 6, 8]
    assert p.namespace.anchor_key == p.block_keys[1]  # last block of segment 0
    manifests = [parse_manifest(o.payload) for o in objs if o.track == "manifest"]
    # s0 added, s0 complete, s1 added, s1 complete
    assert [(len(m.segments), m.segments[-1].complete) for m in manifests] == [
        (1, False), (1, True), (2, False), (2, True)]
    assert [o.ends_track for o in objs if o.track == "manifest"] == [False] * 3 + [True]
    seg1 = manifests[-1].segments[1]
    assert (seg1.first_block, seg1.blocks) == (2, 3)
    assert seg1.block_keys_sha256 == block_keys_sha256(p.block_keys[2:5])


def test_codec_tracks_and_kv() -> None:
    p = make(layers=2, tracks=[TrackSpec(Component.KV, Codec.ZSTD),
                               TrackSpec(Component.K, Codec.INT8),
                               TrackSpec(Component.V, Codec.INT8)])
    objs = p.objects()
    assert {o.track for o in objs} == {"manifest", "kv.zstd.s0", "k.int8.s0", "v.int8.s0"}
    m = parse_manifest(objs[-1].payload)
    assert m.segments[0].tracks == ["kv.zstd.s0", "k.int8.s0", "v.int8.s0"]


def test_signed_manifest_track() -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    p = make(layers=2, signer=(key, b"prod"))
    manifests = [o for o in p.objects() if o.track == "manifest.cose"]
    assert len(manifests) == 2 and p.manifest_track == "manifest.cose"
    keys = KeyStore({b"prod": key.public_key()})
    for o in manifests:
        parse_manifest(verify_manifest_cose(o.payload, keys).payload).check_namespace(
            p.namespace)


@pytest.mark.parametrize(("kw", "message"), [
    ({"segment_blocks": [5]}, "only 4"),
    ({"segment_blocks": [0]}, "at least one"),
    ({"tracks": []}, "tracks"),
    ({"manifest_every": 0}, "manifest_every"),
])
def test_plan_rejections(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(**kw)


def test_array_mismatch() -> None:
    d = synthetic_descriptor(2, H, D, "float16", block_tokens=B)
    k, v = synthetic_kv(2, H, D, 4, "float32")
    with pytest.raises(ValueError, match="dtype"):
        PublicationPlan(k, v, d, SCOPE_KEY, [1, 2, 3, 4])
