"""The connector's pure parts, without LMCache: its settings, the key mapping and a chunk's
Objects."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from relay.kvcs.errors import KvcsError
from relay.kvcs.manifest import parse_manifest
from relay.kvcs.plan import PlannedObject, PublicationPlan
from relay.peers.errors import PeerError
from relay.peers.lmcache.chunks import ChunkPlan, LayerWriter
from relay.peers.lmcache.mapping import DATA, DATA_TRACK, ChunkNames, EngineShape, KeyMapper
from relay.peers.lmcache.settings import parse_settings

SHAPE = EngineShape(layers=3, kv_heads=2, head_dim=4, chunk_tokens=8)
KEY = bytes(range(32))
KEY_ARGS = ("SmolLM2", 1, 0, "float")


def _files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "scope.key").write_bytes(KEY)
    (tmp_path / "ca.pem").write_text("-")
    return tmp_path / "scope.key", tmp_path / "ca.pem"


def test_url_parameters_win_over_extra_config(tmp_path: Path) -> None:
    key, ca = _files(tmp_path)
    (tmp_path / "token").write_text("secret\n")
    s = parse_settings(f"kvcs://127.0.0.1:4433/?scope_key={key}&timeout=0.5&token="
                       f"{tmp_path / 'token'}",
                       {"kvcs.ca_file": str(ca), "kvcs.timeout_s": 9, "kvcs.confirm": "none"})
    assert s.relay_url == "moqt://127.0.0.1:4433/" and s.scope_key == KEY
    assert (s.timeout, s.confirm, s.access.token) == (0.5, "none", b"secret")
    assert str(s.access.ca_file) == str(ca) and s.access.timeout == 0.5
    plugin = parse_settings("plugin://kvcs", {"kvcs.url": "kvcs://[::1]:7/",
                                              "kvcs.scope_key_file": str(key),
                                              "kvcs.insecure": "true"})
    assert plugin.relay_url == "moqt://[::1]:7/" and plugin.access.insecure


@pytest.mark.parametrize(("url", "extra", "says"), [
    ("plugin://kvcs", {}, "kvcs.url"),
    ("kvcs://127.0.0.1/", {}, "host and a port"),
    ("kvcs://127.0.0.1:1/?color=red", {}, "unknown parameters color"),
    ("kvcs://127.0.0.1:1/", {"kvcs.ca_file": "x"}, "scope key"),
    ("kvcs://127.0.0.1:1/?scope_key=K", {}, "CA file"),
    ("kvcs://127.0.0.1:1/?scope_key=K&ca=C&confirm=maybe", {}, "confirm must be"),
])
def test_settings_name_what_is_wrong(tmp_path: Path, url: str, extra: dict[str, str],
                                     says: str) -> None:
    key, ca = _files(tmp_path)
    with pytest.raises(PeerError, match=says):
        parse_settings(url.replace("=K", f"={key}").replace("=C", f"={ca}"), extra)


def test_names_are_deterministic_per_scope_key_and_chunk() -> None:
    m = KeyMapper(KEY, SHAPE)
    a = m.names(*KEY_ARGS, chunk_hash=-12345)
    assert a == m.names(*KEY_ARGS, chunk_hash=-12345)
    ns = a.namespace
    others = [m.names(*KEY_ARGS, chunk_hash=12345).namespace,
              m.names(*KEY_ARGS, chunk_hash=-12345, tags=(("user", "x"),)).namespace,
              m.names("SmolLM2", 2, 1, "float", chunk_hash=-12345).namespace,
              KeyMapper(bytes(32), SHAPE).names(*KEY_ARGS, chunk_hash=-12345).namespace]
    assert all(o.anchor_key != ns.anchor_key and o.pub_id != ns.pub_id for o in others)
    assert others[3].scope_id != ns.scope_id  # another scope key: another scope
    d = a.descriptor
    assert (d.layers, d.kv_heads, d.head_dim, d.block_tokens, d.dtype_name) == \
        (3, 2, 4, 8, "float32")
    assert d.doc["tp"] == [0, 1] and d.doc["extra"] == {"kvcs_keys": "lmcache-chunk-hash"}
    assert ns.compat_id == d.compat_id and DATA_TRACK == "kv.raw.s0"
    with pytest.raises(ValueError, match="no KVSP dtype"):
        m.names("SmolLM2", 1, 0, "int8", chunk_hash=1)


def _chunk(dtype: str = "float") -> tuple[np.ndarray, list[PlannedObject], ChunkPlan,
                                          ChunkNames]:
    names = KeyMapper(KEY, SHAPE).names(*KEY_ARGS[:3], dtype, chunk_hash=7)
    # [2][L][T][H*D] of the key's dtype
    data = np.arange(2 * 3 * 8 * 2 * 4, dtype=np.float32).astype(names.descriptor.dtype
                                                                 ).tobytes()
    buf = np.frombuffer(bytearray(data), dtype=np.uint8)
    plan = ChunkPlan(buf, names, KEY)
    return buf, plan.objects(), plan, names


@pytest.mark.parametrize("dtype", ["float", "bfloat16"])
def test_a_chunk_is_one_kvcs_publication_and_comes_back_bit_for_bit(dtype: str) -> None:
    buf, objects, plan, names = _chunk(dtype)
    data = [o for o in objects if o.track == DATA_TRACK]
    assert [(o.group, o.object_id) for o in data] == [(0, 0), (1, 0), (2, 0)]
    # written in place, bit for bit what the generic encoder makes (header, digest, Data)
    assert all(o.payload == PublicationPlan._payload(plan, DATA, o.group, 0, 0) for o in data)
    manifests = [o for o in objects if o.track == "manifest"]
    final = parse_manifest(manifests[-1].payload)
    assert final.compat.compat_id == plan.namespace.compat_id
    assert [(s.blocks, s.complete) for s in final.segments] == [(1, True)]
    # the KVCS layout [layers][kv_heads][tokens][head_dim] of LMCache's [2][L][T][H*D]
    k = plan.k
    assert k.shape == (3, 2, 8, 4) and float(k[1, 1, 2, 0]) == (1 * 8 + 2) * 8 + 1 * 4
    out = np.zeros_like(buf)
    w = LayerWriter(out, names)
    for o in reversed(data):  # any order: each layer goes to its place
        w.write(o.group, o.object_id, o.payload)
    assert w.complete and out.tobytes() == buf.tobytes()


def test_a_changed_object_is_refused() -> None:
    buf, objects, _, names = _chunk()
    first = next(o for o in objects if o.track == DATA_TRACK)
    bad = bytearray(first.payload)
    bad[-1] ^= 1
    w = LayerWriter(np.zeros_like(buf), names)
    with pytest.raises(KvcsError):
        w.write(0, 0, bytes(bad))
    with pytest.raises(KvcsError):
        w.write(1, 0, first.payload)  # layer 0's Object offered as layer 1
    assert not w.complete
