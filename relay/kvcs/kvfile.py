"""KV cache files in the safetensors format, read lazily.

Layout (https://huggingface.co/docs/safetensors): an 8-octet little-endian header length N,
N octets of JSON header, then the tensor data. The header maps "k" and "v" to
{"dtype", "shape": [layers, kv_heads, tokens, head_dim], "data_offsets": [begin, end]}
(offsets relative to the data area) and "__metadata__" (string values only) holds:

    "kvcs.compat"  the Compatibility Descriptor, canonical JSON
    "kvcs.tokens"  the token IDs as a JSON array (optional; omitted when unknown)

The reader maps the file (np.memmap): opening reads only the header, and a raw section
touches only the pages of that section.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .codecs import le_bytes, raw_section
from .descriptor import DTYPES, Descriptor
from .errors import DescriptorError, KvFileError, TokenError
from .identifiers import tokens_be
from .layered import KvArray
from .registry import Component

# safetensors dtype names for the descriptor's dtypes
ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3"}
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit
_ALIGN = 8


def _head(shape: tuple[int, ...], descriptor: Descriptor,
          tokens: Sequence[int] | np.ndarray | None) -> bytes:
    """Length and JSON header of a file holding K and V shaped ``shape``."""
    metadata = {"kvcs.compat": descriptor.canonical_json().decode("utf-8")}
    if tokens is not None:
        tokens_be(tokens)  # range check
        metadata["kvcs.tokens"] = json.dumps([int(t) for t in tokens], separators=(",", ":"))
    st = ST_DTYPES[descriptor.dtype_name]
    size = int(np.prod(shape)) * descriptor.dtype.itemsize
    header: dict[str, Any] = {
        "__metadata__": metadata,
        "k": {"dtype": st, "shape": list(shape), "data_offsets": [0, size]},
        "v": {"dtype": st, "shape": list(shape), "data_offsets": [size, 2 * size]},
    }
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Pad with spaces so the data area starts 8-aligned, as safetensors writers do.
    text += b" " * (-(8 + len(text)) % _ALIGN)
    return struct.pack("<Q", len(text)) + text


def write_kvfile(path: str | os.PathLike[str], k: KvArray, v: KvArray,
                 descriptor: Descriptor, tokens: Sequence[int] | np.ndarray | None = None
                 ) -> None:
    """Write K and V ([layers][kv_heads][tokens][head_dim], descriptor's dtype)."""
    _check_arrays(k, v, descriptor)
    head = _head(k.shape, descriptor, tokens)
    with open(path, "wb") as f:
        f.write(head)
        for arr in (k, v):
            # One layer at a time keeps the temporary copy small for big caches.
            for layer in range(arr.shape[0]):
                f.write(le_bytes(arr[layer]))


def map_new_kvfile(path: str | os.PathLike[str], shape: tuple[int, int, int, int],
                   descriptor: Descriptor, tokens: Sequence[int] | np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """Create a KV file of zeros for K and V shaped ``shape`` and map its K and V for
    writing: what is written into them is the file (write_kvfile's octets, without a
    final copy). None on a big-endian host, whose arrays are not the file's octets."""
    if sys.byteorder != "little":
        return None
    head = _head(shape, descriptor, tokens)
    size = int(np.prod(shape)) * descriptor.dtype.itemsize
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + 2 * size)  # sparse: zeros cost nothing until written
    if size == 0:
        return np.zeros(shape, descriptor.dtype), np.zeros(shape, descriptor.dtype)
    return (np.memmap(path, descriptor.dtype, "r+", offset=len(head), shape=shape),
            np.memmap(path, descriptor.dtype, "r+", offset=len(head) + size, shape=shape))


def _check_arrays(k: KvArray, v: KvArray, d: Descriptor) -> None:
    for name, arr in (("k", k), ("v", v)):
        if arr.ndim != 4:
            raise KvFileError(f"{name} must be [layers][kv_heads][tokens][head_dim]")
        if (arr.shape[0], arr.shape[1], arr.shape[3]) != (d.layers, d.kv_heads, d.head_dim):
            raise KvFileError(f"{name} shape {arr.shape} does not fit the descriptor "
                              f"(layers {d.layers}, kv_heads {d.kv_heads}, "
                              f"head_dim {d.head_dim})")
        if arr.dtype != d.dtype:
            raise KvFileError(f"{name} dtype {arr.dtype} is not the descriptor's {d.dtype_name}")
    if k.shape != v.shape:
        raise KvFileError(f"k {k.shape} and v {v.shape} differ in shape")


class KvFile:
    """A KV cache file opened for lazy reading; ``k`` and ``v`` are read-only memmaps.

    The mapping is released when the object and every array taken from it are gone.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        file_size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise KvFileError(f"{self.path} is too short for a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > file_size:
                raise KvFileError(f"{self.path}: header length {n} is not plausible")
            raw_header = f.read(n)
        try:
            header = json.loads(raw_header)
        except (ValueError, UnicodeDecodeError) as exc:
            raise KvFileError(f"{self.path}: header is not JSON: {exc}") from None
        if not isinstance(header, dict):
            raise KvFileError(f"{self.path}: header is not a JSON object")
        meta = header.get("__metadata__") or {}
        if not isinstance(meta, dict) or "kvcs.compat" not in meta:
            raise KvFileError(f"{self.path}: __metadata__ lacks kvcs.compat")
        try:
            self.descriptor = Descriptor.from_json(meta["kvcs.compat"])
        except DescriptorError as exc:
            raise KvFileError(f"{self.path}: kvcs.compat: {exc}") from None
        self.tokens: list[int] | None = None
        if "kvcs.tokens" in meta:
            try:
                tokens = json.loads(meta["kvcs.tokens"])
                tokens_be(tokens)
            except (ValueError, TypeError, TokenError) as exc:
                raise KvFileError(f"{self.path}: kvcs.tokens: {exc}") from None
            self.tokens = [int(t) for t in tokens]
        data_start = 8 + n
        data_size = file_size - data_start
        self.k = self._tensor(header, "k", data_start, data_size)
        self.v = self._tensor(header, "v", data_start, data_size)
        _check_arrays(self.k, self.v, self.descriptor)
        if self.tokens is not None and len(self.tokens) != self.k.shape[2]:
            raise KvFileError(f"{self.path}: {len(self.tokens)} token IDs for "
                              f"{self.k.shape[2]} tokens of K/V")

    def _tensor(self, header: dict[str, Any], name: str, data_start: int, data_size: int
                ) -> np.ndarray:
        entry = header.get(name)
        if not isinstance(entry, dict):
            raise KvFileError(f"{self.path}: no tensor {name!r}")
        expected = ST_DTYPES[self.descriptor.dtype_name]
        if entry.get("dtype") != expected:
            raise KvFileError(f"{self.path}: tensor {name} has dtype {entry.get('dtype')!r}, "
                              f"the descriptor says {expected}")
        shape = entry.get("shape")
        offsets = entry.get("data_offsets")
        if (not isinstance(shape, list) or len(shape) != 4
                or not all(isinstance(x, int) and x >= 0 for x in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(x, int) for x in offsets)):
            raise KvFileError(f"{self.path}: tensor {name} has a malformed entry")
        begin, end = offsets
        dtype = DTYPES[self.descriptor.dtype_name]
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if not 0 <= begin <= end <= data_size or end - begin != nbytes:
            raise KvFileError(f"{self.path}: tensor {name} offsets {offsets} do not fit "
                              f"shape {shape} in {data_size} data octets")
        if end == begin:
            return np.zeros(shape, dtype=dtype)
        # safetensors data is little-endian; see codecs.from_le_bytes for big-endian hosts.
        return np.memmap(self.path, dtype=dtype, mode="r", offset=data_start + begin,
                         shape=tuple(shape))

    @property
    def token_count(self) -> int:
        return int(self.k.shape[2])

    @property
    def full_blocks(self) -> int:
        return self.token_count // self.descriptor.block_tokens

    def array(self, component: Component) -> np.ndarray:
        if component is Component.K:
            return self.k
        if component is Component.V:
            return self.v
        raise KvFileError("a file holds k and v tensors; kv is the pair of them")

    def raw_section(self, component: Component, layer: int, block: int) -> bytes:
        """The raw K or V section of one block in one layer, reading only that section."""
        return raw_section(self.array(component), layer, block, self.descriptor.block_tokens)


def read_kvfile(path: str | os.PathLike[str]) -> KvFile:
    return KvFile(path)
