"""KV cache files (safetensors) and the synthetic generator."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from relay.kvcs.codecs import raw_section
from relay.kvcs.descriptor import DTYPES
from relay.kvcs.errors import KvFileError
from relay.kvcs.kvfile import KvFile, read_kvfile, write_kvfile
from relay.kvcs.registry import Component
from relay.kvcs.synthetic import (
    synthetic_descriptor,
    synthetic_kv,
    synthetic_layers,
    synthetic_tokens,
)

L, H, D, B, T = 3, 2, 8, 4, 13


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_round_trip_and_lazy_sections(tmp_path: Path, dtype: str) -> None:
    d = synthetic_descriptor(L, H, D, dtype, block_tokens=B)
    k, v = synthetic_kv(L, H, D, T, dtype, seed=5)
    tokens = synthetic_tokens(T)
    path = tmp_path / "cache.safetensors"
    write_kvfile(path, k, v, d, tokens)
    f = read_kvfile(path)
    assert isinstance(f.k, np.memmap) and isinstance(f.v, np.memmap)
    assert f.descriptor == d and f.tokens == tokens
    assert f.token_count == T and f.full_blocks == 3
    assert f.k.tobytes() == k.tobytes() and f.v.tobytes() == v.tobytes()
    for layer in range(L):
        for block in range(3):
            assert f.raw_section(Component.K, layer, block) == raw_section(k, layer, block, B)
            assert f.raw_section(Component.V, layer, block) == raw_section(v, layer, block, B)


def test_safetensors_layout(tmp_path: Path) -> None:
    d = synthetic_descriptor(L, H, D, "bfloat16", block_tokens=B)
    k, v = synthetic_kv(L, H, D, T, "bfloat16", seed=1)
    path = tmp_path / "c.safetensors"
    write_kvfile(path, k, v, d)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8:8 + n])
    size = L * H * T * D * 2
    assert header["k"] == {"dtype": "BF16", "shape": [L, H, T, D], "data_offsets": [0, size]}
    assert header["v"]["data_offsets"] == [size, 2 * size]
    assert json.loads(header["__metadata__"]["kvcs.compat"]) == d.doc
    assert "kvcs.tokens" not in header["__metadata__"]
    assert raw[8 + n:8 + n + size] == k.tobytes()
    assert len(raw) == 8 + n + 2 * size
    assert read_kvfile(path).tokens is None


def test_reads_are_lazy(tmp_path: Path) -> None:
    """Data is read from the file on demand, not copied at open: a change on disk after
    opening is visible."""
    d = synthetic_descriptor(L, H, D, "float32", block_tokens=B)
    k, v = synthetic_kv(L, H, D, T, "float32", seed=2)
    path = tmp_path / "c.safetensors"
    write_kvfile(path, k, v, d)
    f = KvFile(path)
    # Overwrite V's data on disk after opening: K sections are unaffected, V is mapped live,
    # which shows reads go to the file on demand rather than to a copy made at open.
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    with open(path, "r+b") as fh:
        fh.seek(8 + n + k.nbytes)
        fh.write(bytes(v.nbytes))
    assert f.raw_section(Component.K, 0, 0) == raw_section(k, 0, 0, B)
    assert f.raw_section(Component.V, 2, 1) == bytes(H * B * D * 4)


def test_large_sparse_file_opens_without_reading_it(tmp_path: Path) -> None:
    """A 4 GiB cache (sparse on disk) opens and serves one section at once."""
    big = (64, 8, 16384, 128)
    d = synthetic_descriptor(big[0], big[1], big[3], "bfloat16", block_tokens=16)
    size = int(np.prod(big)) * 2
    entry = {"dtype": "BF16", "shape": list(big), "data_offsets": [0, size]}
    header = {"__metadata__": {"kvcs.compat": d.canonical_json().decode()}, "k": entry,
              "v": {**entry, "data_offsets": [size, 2 * size]}}
    path = tmp_path / "big.safetensors"
    write_raw(path, header, b"")
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size + 2 * size)
    f = KvFile(path)
    assert f.raw_section(Component.V, 63, 1023) == bytes(8 * 16 * 128 * 2)


def test_writer_checks(tmp_path: Path) -> None:
    d = synthetic_descriptor(L, H, D, "float16", block_tokens=B)
    k, v = synthetic_kv(L, H, D, T, "float16")
    with pytest.raises(KvFileError, match="dtype"):
        write_kvfile(tmp_path / "x", k.astype(np.float32), v, d)
    with pytest.raises(KvFileError, match="shape"):
        write_kvfile(tmp_path / "x", k[:, :1], v, d)
    with pytest.raises(KvFileError, match="differ"):
        write_kvfile(tmp_path / "x", k, v[:, :, :5], d)


def write_raw(path: Path, header: dict[str, object], data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize("case", ["short", "huge", "json", "nometa", "dtype", "offsets",
                                  "missing_v", "tokens"])
def test_malformed_files(tmp_path: Path, case: str) -> None:
    d = synthetic_descriptor(1, 1, 2, "float32", block_tokens=1)
    entry = {"dtype": "F32", "shape": [1, 1, 2, 2], "data_offsets": [0, 16]}
    header: dict[str, object] = {"__metadata__": {"kvcs.compat": d.canonical_json().decode()},
                                 "k": entry, "v": {**entry, "data_offsets": [16, 32]}}
    path = tmp_path / "bad"
    write_raw(path, header, bytes(32))
    KvFile(path)  # the baseline is valid
    if case == "short":
        path.write_bytes(b"\x01")
    elif case == "huge":
        path.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    elif case == "json":
        path.write_bytes(struct.pack("<Q", 2) + b"{x")
    elif case == "nometa":
        write_raw(path, {"k": entry}, bytes(32))
    elif case == "dtype":
        write_raw(path, {**header, "k": {**entry, "dtype": "F16"}}, bytes(32))
    elif case == "offsets":
        write_raw(path, {**header, "k": {**entry, "data_offsets": [0, 17]}}, bytes(32))
    elif case == "missing_v":
        write_raw(path, {k: val for k, val in header.items() if k != "v"}, bytes(32))
    elif case == "tokens":
        meta = {"kvcs.compat": d.canonical_json().decode(), "kvcs.tokens": "[1,2,3]"}
        write_raw(path, {**header, "__metadata__": meta}, bytes(32))
    with pytest.raises(KvFileError):
        KvFile(path)


def test_synthetic_is_deterministic_and_shaped() -> None:
    k1, v1 = synthetic_kv(2, 3, 4, 5, "bfloat16", seed=9)
    k2, v2 = synthetic_kv(2, 3, 4, 5, "bfloat16", seed=9)
    k3, _ = synthetic_kv(2, 3, 4, 5, "bfloat16", seed=10)
    assert k1.shape == (2, 3, 5, 4) and k1.dtype == DTYPES["bfloat16"]
    assert k1.tobytes() == k2.tobytes() and v1.tobytes() == v2.tobytes()
    assert k1.tobytes() != k3.tobytes() and k1.tobytes() != v1.tobytes()
    f = k1.astype(np.float32)
    assert np.all(np.abs(f) <= 4) and np.abs(f[:, 0]).max() <= 0.5
    # Pinned so that a numpy upgrade changing the stream would show.
    assert synthetic_kv(1, 1, 4, 1, "float32", seed=0)[0].ravel().tolist() == \
        pytest.approx(PINNED)
    assert synthetic_tokens(3, seed=1) == synthetic_tokens(3, seed=1)
    with pytest.raises(ValueError, match="dtype"):
        synthetic_kv(1, 1, 1, 1, "int8")


@pytest.mark.parametrize("shape", [(3, 2, 5, 7, "float16"), (2, 3, 3, 3, "float32"),
                                   (3, 2, 4, 3, "bfloat16"), (2, 1, 1, 1, "float8_e4m3fn")])
def test_synthetic_layers_are_synthetic_kv_layer_by_layer(
        shape: tuple[int, int, int, int, str], tmp_path: Path) -> None:
    # odd element counts per layer too: a layer can start in the middle of a 64-bit word
    k, v = synthetic_kv(*shape, seed=4)
    lk, lv = synthetic_layers(*shape, seed=4)
    assert (lk.shape, lk.dtype, lk.nbytes) == (k.shape, k.dtype, k.nbytes)
    for layer in reversed(range(shape[0])):  # any order: each layer is made on its own
        assert lk[layer].tobytes() == k[layer].tobytes()
        assert lv[layer, :, 1:].tobytes() == v[layer, :, 1:].tobytes()
    d = synthetic_descriptor(*shape[:3], shape[4])
    write_kvfile(tmp_path / "a.kv", k, v, d)
    write_kvfile(tmp_path / "b.kv", lk, lv, d)
    assert (tmp_path / "a.kv").read_bytes() == (tmp_path / "b.kv").read_bytes()
    with pytest.raises(IndexError):
        lk[shape[0]]
    with pytest.raises(ValueError, match="dtype"):
        synthetic_layers(1, 1, 1, 1, "int8")


PINNED = [0.3506242036819458, 0.13696163892745972, 0.011136472225189209, -0.23021334409713745]
