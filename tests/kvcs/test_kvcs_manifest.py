"""Manifest JSON of kvcs-draft 3.6 and per-Object checks against it."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import pytest

from relay.kvcs.errors import (
    CompatMismatchError,
    ManifestDigestMismatchError,
    ManifestError,
    ObjectContextError,
)
from relay.kvcs.identifiers import generate_scope_key
from relay.kvcs.manifest import Manifest, manifest_for_namespace, parse_manifest
from relay.kvcs.namespace import KvcsNamespace
from relay.kvcs.payload import encode_object, verify_object
from relay.kvcs.plan import PlannedObject, PublicationPlan
from relay.kvcs.registry import Component
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens

L, H, D, B = 4, 2, 4, 2


def plan(**kw: Any) -> PublicationPlan:
    d = synthetic_descriptor(L, H, D, "float16", block_tokens=B)
    k, v = synthetic_kv(L, H, D, 5 * B + 1, "float16", seed=3)
    kw.setdefault("segment_blocks", [3, 2])
    return PublicationPlan(k, v, d, generate_scope_key(), synthetic_tokens(5 * B + 1), **kw)


@pytest.fixture(scope="module")
def produced() -> tuple[PublicationPlan, list[PlannedObject]]:
    p = plan()
    return p, p.objects()


def final_manifest(produced: tuple[PublicationPlan, list[PlannedObject]]) -> Manifest:
    _, objs = produced
    return parse_manifest([o for o in objs if o.track == "manifest"][-1].payload)


def doc_of(produced: tuple[PublicationPlan, list[PlannedObject]]) -> dict[str, Any]:
    return json.loads(final_manifest(produced).to_json())


def test_round_trip_and_shape(produced: tuple[PublicationPlan, list[PlannedObject]]) -> None:
    p, _ = produced
    m = final_manifest(produced)
    assert parse_manifest(m.to_json()).to_json() == m.to_json()
    doc = json.loads(m.to_json())
    assert list(doc) == ["kvcs", "compat", "layers", "block_tokens", "deterministic",
                         "segments"]
    assert doc["kvcs"] == 1 and doc["layers"] == L and doc["block_tokens"] == B
    s0, s1 = doc["segments"]
    assert (s0["segment"], s0["first_block"], s0["blocks"], s0["complete"]) == (0, 0, 3, True)
    assert (s1["segment"], s1["first_block"], s1["blocks"]) == (1, 3, 2)
    assert s0["tracks"] == ["k.raw.s0", "v.raw.s0"]
    assert len(s0["object_digests"]["k.raw.s0"]) == L
    assert len(s0["object_digests"]["k.raw.s0"][0]) == 3
    manifest_for_namespace(m.to_json(), p.namespace)


def test_compat_mismatch_discards(produced: tuple[PublicationPlan, list[PlannedObject]]
                                  ) -> None:
    p, _ = produced
    other = KvcsNamespace(p.namespace.scope_id, b"\x01" * 32, p.namespace.anchor_key,
                          p.namespace.pub_id)
    with pytest.raises(CompatMismatchError):
        manifest_for_namespace(final_manifest(produced).to_json(), other)


def mutate(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    target: Any = doc
    keys = path.split("/")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    if value is KeyError:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


@pytest.mark.parametrize(("path", "value", "message"), [
    ("kvcs", 2, "kvcs"),
    ("kvcs", True, "kvcs"),
    ("compat/dtype", "int4", "compat"),
    ("layers", L + 1, "layers"),
    ("block_tokens", 4, "block_tokens"),
    ("deterministic", "no", "deterministic"),
    ("segments", [], "segments"),
    ("segments/0/segment", 1, "numbered"),
    ("segments/1/first_block", 4, "contiguous"),
    ("segments/0/blocks", 0, "blocks"),
    ("segments/0/block_keys_sha256", "AB" * 32, "hex"),
    ("segments/0/tracks", [], "tracks"),
    ("segments/0/tracks", [7], "tracks"),
    ("segments/0/tracks", "k.raw.s0", "tracks"),
    ("segments/0/blocks", True, "blocks"),                 # a bool is not an integer
    ("segments/0/tracks", ["k.raw.s1", "v.raw.s0"], "segment 0"),
    ("segments/0/tracks", ["k.raw.s0", "k.raw.s0"], "twice"),
    ("segments/0/tracks", ["k.raw.s00"], "tracks"),
    ("segments/0/tracks", ["manifest"], "data track"),
    ("segments/0/complete", KeyError, "complete"),
    ("segments/0/object_digests/k.raw.s0/0", ["00" * 32], "digests"),
    ("segments/0/object_digests/k.raw.s0", [], "all 4 groups"),
    ("segments/0/object_digests/kv.raw.s0", [], "not listed"),
])
def test_invalid_manifests(produced: tuple[PublicationPlan, list[PlannedObject]], path: str,
                           value: Any, message: str) -> None:
    doc = mutate(doc_of(produced), path, value)
    with pytest.raises(ManifestError, match=message):
        parse_manifest(json.dumps(doc).encode())


@pytest.mark.parametrize(("text", "message"), [
    (b"\xff", "UTF-8"), (b"{", "not JSON"), (b"[]", "object"),
    (b'{"kvcs":1,"kvcs":1}', "duplicate"), (b'{"kvcs":NaN}', "NaN"),
])
def test_not_a_manifest(text: bytes, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifest(text)


def test_unknown_members_ignored(produced: tuple[PublicationPlan, list[PlannedObject]]) -> None:
    doc = doc_of(produced)
    doc["future"] = {"x": 1}
    doc["segments"][0]["hint"] = "y"
    assert parse_manifest(json.dumps(doc)).to_json() == final_manifest(produced).to_json()


def test_every_object_verifies_and_partial_retrieval(
        produced: tuple[PublicationPlan, list[PlannedObject]]) -> None:
    _, objs = produced
    m = final_manifest(produced)
    data = [o for o in objs if o.track != "manifest"]
    for o in data:
        m.verify(o.track, o.group, o.object_id, o.payload, require_listed=True)
    # A range of layers and blocks only: each Object is checked on its own.
    for o in data:
        if o.track == "v.raw.s0" and 1 <= o.group <= 2 and o.object_id < 2:
            assert m.check_object(o.track, verify_object(o.payload, o.group, o.object_id))


def test_unlisted_groups_return_false(produced: tuple[PublicationPlan, list[PlannedObject]]
                                      ) -> None:
    _, objs = produced
    first = parse_manifest(objs[0].payload)  # version 0: segment 0 added, nothing complete
    o = next(o for o in objs if o.track == "k.raw.s0")
    assert not first.check_object(o.track, verify_object(o.payload, 0, 0))
    with pytest.raises(ManifestError, match="no listed digest"):
        first.verify(o.track, 0, 0, o.payload, require_listed=True)


def resign(payload: bytes, **kw: Any) -> bytes:
    obj = verify_object(payload, int.from_bytes(payload[8:12], "big"),
                        int.from_bytes(payload[12:16], "big"))
    h = obj.header
    args: dict[str, Any] = dict(component=h.component, layer=h.layer, block_index=h.block_index,
                                token_start=h.token_start, token_count=h.token_count,
                                codec=h.codec, data=bytes(obj.data))
    args.update(kw)
    return encode_object(**args)


@pytest.mark.parametrize(("track", "change", "error"), [
    ("k.raw.s0", {"data": b"\x00" * (H * B * D * 2)}, ManifestDigestMismatchError),
    ("k.raw.s0", {"component": Component.V}, ObjectContextError),
    ("k.raw.s0", {"codec": 1}, ObjectContextError),
    ("k.raw.s0", {"token_count": B + 1}, ObjectContextError),
    ("k.raw.s0", {"token_start": 1}, ObjectContextError),
    ("k.raw.s1", {}, ObjectContextError),           # Object of s0 presented as s1
    ("kv.raw.s0", {}, ObjectContextError),          # track not offered
    ("k.raw.s7", {}, ObjectContextError),           # no such segment
])
def test_object_context_failures(produced: tuple[PublicationPlan, list[PlannedObject]],
                                 track: str, change: dict[str, Any], error: type) -> None:
    _, objs = produced
    m = final_manifest(produced)
    o = next(o for o in objs if o.track == "k.raw.s0" and o.group == 1 and o.object_id == 1)
    payload = resign(o.payload, **change)
    with pytest.raises(error):
        m.check_object(track, verify_object(payload, 1, 1))


def test_object_beyond_segment_or_layers(produced: tuple[PublicationPlan, list[PlannedObject]]
                                         ) -> None:
    m = final_manifest(produced)
    for layer, block in ((L, 0), (0, 3)):
        p = encode_object(component=Component.K, layer=layer, block_index=block,
                          token_start=block * B, token_count=B, codec=0, data=b"")
        with pytest.raises(ObjectContextError):
            m.check_object("k.raw.s0", verify_object(p, layer, block))


def test_successor_rules(produced: tuple[PublicationPlan, list[PlannedObject]]) -> None:
    _, objs = produced
    versions = [parse_manifest(o.payload) for o in objs if o.track == "manifest"]
    for older, newer in itertools.pairwise(versions):
        older.check_successor(newer)
    with pytest.raises(ManifestError, match=r"incomplete|dropped|changed"):
        versions[-1].check_successor(versions[0])
    tampered = versions[-1].copy()
    assert tampered.segments[0].object_digests is not None
    tampered.segments[0].object_digests["k.raw.s0"][0][0] = "00" * 32
    with pytest.raises(ManifestError, match="digests"):
        versions[-1].check_successor(tampered)


def test_successor_may_change_neither_compat_nor_deterministic(
        produced: tuple[PublicationPlan, list[PlannedObject]]) -> None:
    last = final_manifest(produced)
    other_compat = replace(last.copy(), compat=synthetic_descriptor(L, 2, 8, "float16", 4,
                                                                    model="other/model"))
    other_flag = replace(last.copy(), deterministic=not last.deterministic)
    for newer in (other_compat, other_flag):
        with pytest.raises(ManifestError, match="compat or deterministic"):
            last.check_successor(newer)


def test_to_json_is_compact_utf8_and_canonical(
        produced: tuple[PublicationPlan, list[PlannedObject]]) -> None:
    # The same Manifest always gives the same octets: no spaces, UTF-8 as is, no NaN.
    m = replace(final_manifest(produced).copy(),
                compat=synthetic_descriptor(L, 2, 8, "float16", 4, model="modèle/ü"))
    out = m.to_json()
    assert out == json.dumps(json.loads(out), separators=(",", ":"),
                             ensure_ascii=False).encode("utf-8")
    assert "modèle/ü".encode() in out and b", " not in out and b": " not in out
    assert parse_manifest(out).to_json() == out
