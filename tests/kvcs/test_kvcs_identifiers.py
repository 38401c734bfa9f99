"""Compatibility Descriptor, scope key, Block Keys, namespace (KVSP-PROFILE 1-3, 3.1)."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import Any

import pytest

from relay.kvcs.descriptor import Descriptor, make_descriptor
from relay.kvcs.errors import DescriptorError, NamespaceError, ScopeKeyError, TokenError
from relay.kvcs.identifiers import (
    anchor_key,
    block_keys,
    generate_scope_key,
    load_scope_key,
    new_pub_id,
    scope_id,
    write_scope_key,
)
from relay.kvcs.namespace import (
    KvcsNamespace,
    content_prefix,
    parse_namespace,
    scope_prefix,
)


def base() -> dict[str, Any]:
    return make_descriptor(model="m", layers=4, kv_heads=2, head_dim=8, dtype="float16",
                           block_tokens=4).doc


def test_descriptor_members_and_canonical_order() -> None:
    d = Descriptor(base())
    assert (d.layers, d.kv_heads, d.head_dim, d.block_tokens) == (4, 2, 8, 4)
    assert d.section_bytes == 2 * 4 * 8 * 2
    shuffled = dict(reversed(list(base().items())))
    assert Descriptor(shuffled).compat_id == d.compat_id == Descriptor(base()).compat_id
    assert d.canonical_json().startswith(b'{"adapters":[],"block_tokens":4,')


def test_unknown_members_are_hashed() -> None:
    doc = base()
    doc["engine_flag"] = "x"
    assert Descriptor(doc).compat_id != Descriptor(base()).compat_id


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("model"), "lacks required member"),
    (lambda d: d.update(kvsp=2), "kvsp"),
    (lambda d: d.update(kvsp=True), "kvsp"),
    (lambda d: d.update(model=3), "model"),
    (lambda d: d.update(layers=0), "layers"),
    (lambda d: d.update(layers=True), "layers"),
    (lambda d: d.update(head_dim=2**53), r"2\^53"),
    (lambda d: d.update(extra={"n": -(2**53)}), r"2\^53"),
    (lambda d: d.update(extra={"ratio": 0.5}), "not an integer"),
    (lambda d: d.update(position={"theta": 1e4}), "not an integer"),
    (lambda d: d.update(dtype="int4"), "dtype"),
    (lambda d: d.update(adapters=["b", "a"]), "sorted"),
    (lambda d: d.update(adapters="a"), "adapters"),
    (lambda d: d.update(tp=[0]), "tp"),
    (lambda d: d.update(tp=[2, 2]), "rank < size"),
    (lambda d: d.update(tp=[0, 0]), "rank < size"),
    (lambda d: d.update(position="rope"), "position"),
    (lambda d: d.update(extra=[]), "extra"),
    (lambda d: d.update(extra={"näme": 1}), "ASCII"),
    (lambda d: d.update(extra={"s": "\ud800"}), "Unicode"),
    (lambda d: d.update(extra={"b": b"x"}), "JSON type"),
])
def test_descriptor_rejections(change: Any, message: str) -> None:
    doc = base()
    change(doc)
    with pytest.raises(DescriptorError, match=message):
        Descriptor(doc)


def test_descriptor_from_json_errors() -> None:
    with pytest.raises(DescriptorError, match="JSON"):
        Descriptor.from_json(b"{")
    with pytest.raises(DescriptorError, match="object"):
        Descriptor.from_json(b"[]")


def test_scope_key_file_forms(tmp_path: Path) -> None:
    key = generate_scope_key()
    assert len(key) == 32 and key != generate_scope_key()
    raw, hexed = tmp_path / "raw.key", tmp_path / "hex.key"
    write_scope_key(raw, key)
    write_scope_key(hexed, key, hex_form=True)
    assert os.stat(raw).st_mode & 0o777 == 0o600
    assert load_scope_key(raw) == load_scope_key(hexed) == key
    upper = tmp_path / "upper.key"
    upper.write_bytes(b"  " + key.hex().upper().encode() + b"\r\n")
    assert load_scope_key(upper) == key
    for bad in (b"\x00" * 31, b"zz" * 32, key.hex().encode()[:-1]):
        (tmp_path / "bad.key").write_bytes(bad)
        with pytest.raises(ScopeKeyError):
            load_scope_key(tmp_path / "bad.key")
    with pytest.raises(ScopeKeyError):
        scope_id(b"short")


def test_block_key_chain_matches_the_definition() -> None:
    key, compat = bytes(range(32)), hashlib.sha256(b"c").digest()
    tokens = [1, 2, 3, 4, 5, 6, 7]
    keys = block_keys(key, compat, tokens, 3)
    assert len(keys) == 2  # the trailing partial block has no key
    bk0 = hmac.digest(key, b"KVSP-block-v1" + compat + bytes(32)
                      + b"".join(t.to_bytes(4, "big") for t in tokens[:3]), "sha256")
    assert keys[0] == bk0
    # Continuing the chain from BK[0] gives the same BK[1] (chunked prefill).
    assert block_keys(key, compat, tokens[3:6], 3, previous=keys[0]) == keys[1:]
    # Each key depends on the whole prefix.
    assert block_keys(key, compat, [9, *tokens[1:]], 3)[1] != keys[1]
    assert anchor_key(keys) == keys[-1]
    with pytest.raises(ValueError, match="Anchor"):
        anchor_key([])
    assert block_keys(key, compat, [1, 2], 3) == []


@pytest.mark.parametrize("tokens", [[-1], [2**32], [1.5]])
def test_tokens_must_be_u32(tokens: list[Any]) -> None:
    with pytest.raises(TokenError):
        block_keys(bytes(32), bytes(32), tokens, 1)


def test_pub_id_is_random_16() -> None:
    a, b = new_pub_id(), new_pub_id()
    assert len(a) == 16 and a != b


def test_namespace_build_parse_prefixes() -> None:
    sid, cid, ak, pid = b"s" * 32, b"c" * 32, b"a" * 32, b"p" * 16
    ns = KvcsNamespace(sid, cid, ak, pid)
    assert ns.fields == (b"kvcs-1", sid, cid, ak, pid)
    assert parse_namespace(list(ns.fields)) == ns
    assert ns.scope_prefix == scope_prefix(sid) == (b"kvcs-1", sid)
    assert ns.content_prefix == content_prefix(sid, cid, ak) == ns.fields[:4]


@pytest.mark.parametrize(("fields", "message"), [
    ((b"kvcs-1", b"s" * 32, b"c" * 32, b"a" * 32), "exactly 5"),
    ((b"kvcs-2", b"s" * 32, b"c" * 32, b"a" * 32, b"p" * 16), "field 0"),
    ((b"kvcs-1", b"s" * 31, b"c" * 32, b"a" * 32, b"p" * 16), "scope_id must be 32"),
    ((b"kvcs-1", b"s" * 32, b"c" * 64, b"a" * 32, b"p" * 16), "compat_id must be 32"),
    ((b"kvcs-1", b"s" * 32, b"c" * 32, b"a" * 33, b"p" * 16), "anchor_key must be 32"),
    ((b"kvcs-1", b"s" * 32, b"c" * 32, b"a" * 32, b"p" * 32), "pub_id must be 16"),
])
def test_namespace_rejections(fields: tuple[bytes, ...], message: str) -> None:
    with pytest.raises(NamespaceError, match=message):
        parse_namespace(fields)
