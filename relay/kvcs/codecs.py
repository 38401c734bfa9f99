"""KVSP codecs (KVSP-PROFILE 4) and raw sections / layer digest (KVSP-PROFILE 5).

Tensors are numpy arrays. A cache is K and V arrays shaped [layers][kv_heads][tokens][head_dim];
a section is one block of one layer, [kv_heads][block_tokens][head_dim], serialized in C order
with little-endian elements.

int8 (lossy). The profile fixes the decoding (value = q x scale); this encoder is:

    amax  = max |x| over head_dim, per (head, token), in float32
    scale = float16(amax / 127)                 (round to nearest even)
    q     = clip(rint(x / float32(scale)), -127, 127), and 0 where scale == 0

Bound, per element, with s = float32(scale) and t = amax / 127 (exact):
|x - q*s| <= s/2 + 127*|t - s|. For t in float16's normal range (amax >= 127 * 2^-14)
|t - s| <= 2^-11 t, so the error is at most about t/2 * (1 + 2^-10) + 127 * 2^-11 * t: "half
a quantization step, plus the rounding of the scale to float16". Below that range the scale's
absolute rounding error is at most 2^-25, so the error is at most s/2 + 127 * 2^-25. Values with
amax / 127 beyond float16's maximum (65504) or non-finite values are refused rather than
silently clipped. Decoding computes q*scale in float32 and then casts to the requested dtype,
which adds that dtype's own rounding.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import zstandard

from .descriptor import Descriptor
from .errors import CodecError
from .layered import KvArray
from .registry import Codec, Component

ZSTD_LEVEL = 3
_F16_MAX = float(np.finfo(np.float16).max)
_ZSTD_FEED = 16 * 1024  # input fed per step, so a hostile frame cannot expand unboundedly


# -- raw sections ------------------------------------------------------------------------------


def raw_view(arr: np.ndarray) -> np.ndarray:
    """``arr`` viewed as unsigned integers of its element size, for moving elements without
    reading them: numpy copies an ml_dtypes array (bfloat16, float8) element by element
    through the type's own functions, about 20x slower than the same octets as integers."""
    if arr.dtype.kind in "biufc" or arr.dtype.itemsize not in (1, 2, 4, 8):
        return arr
    return arr.view(np.dtype(f"u{arr.dtype.itemsize}").newbyteorder(arr.dtype.byteorder))


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src``: as raw elements when both have one dtype (see ``raw_view``)."""
    if dst.dtype == src.dtype:
        raw_view(dst)[...] = raw_view(src)
    else:
        dst[...] = src


def le_bytes(arr: np.ndarray) -> bytes:
    """C-order little-endian octets of ``arr`` (ml_dtypes types are native-order)."""
    if arr.dtype.itemsize > 1 and (arr.dtype.byteorder == ">" or (
            arr.dtype.byteorder in "=|" and sys.byteorder == "big")):
        arr = arr.byteswap()
    return np.ascontiguousarray(raw_view(arr)).tobytes()


def from_le_bytes(data: bytes | memoryview, dtype: np.dtype[Any], shape: Sequence[int]
                  ) -> np.ndarray:
    """Zero-copy (on little-endian hosts) read-only array over little-endian octets."""
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    if dtype.itemsize > 1 and sys.byteorder == "big" and dtype.byteorder != "<":
        arr = arr.byteswap()
    return arr


def section(cache: KvArray, layer: int, block: int, block_tokens: int) -> np.ndarray:
    """K[l][:, i*B:(i+1)*B, :] as a view, [kv_heads][B][head_dim]."""
    if cache.ndim != 4:
        raise CodecError(f"a cache is [layers][kv_heads][tokens][head_dim], got {cache.shape}")
    start = block * block_tokens
    if not 0 <= layer < cache.shape[0] or start < 0 or start + block_tokens > cache.shape[2]:
        raise CodecError(f"layer {layer} block {block} is outside a cache shaped {cache.shape}")
    return cache[layer, :, start:start + block_tokens, :]


def raw_section(cache: KvArray, layer: int, block: int, block_tokens: int) -> bytes:
    """The raw K (or V) section of block ``block`` in layer ``layer`` (KVSP-PROFILE 5)."""
    return le_bytes(section(cache, layer, block, block_tokens))


# -- int8 ----------------------------------------------------------------------------------------


def int8_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scales float16 [..., B], q int8 [..., B, D]) for x [..., B, D]; see module docstring."""
    xf = np.asarray(x, dtype=np.float32)
    amax = np.max(np.abs(xf), axis=-1) if xf.shape[-1] else np.zeros(xf.shape[:-1], np.float32)
    if not np.all(np.isfinite(amax)):
        raise CodecError("int8 cannot encode NaN or infinite values")
    t = amax / np.float32(127)
    if np.any(t > _F16_MAX):
        raise CodecError(f"int8 scale max|x|/127 exceeds float16's maximum {_F16_MAX}")
    scales = t.astype(np.float16)
    s = scales.astype(np.float32)[..., None]
    q = np.divide(xf, s, out=np.zeros_like(xf), where=s > 0)
    q = np.clip(np.rint(q), -127, 127).astype(np.int8)
    return scales, q


def int8_dequantize(scales: np.ndarray, q: np.ndarray, out_dtype: np.dtype[Any] | type
                    ) -> np.ndarray:
    return (q.astype(np.float32) * scales.astype(np.float32)[..., None]).astype(out_dtype)


def _int8_len(desc: Descriptor) -> int:
    h, b, d = desc.kv_heads, desc.block_tokens, desc.head_dim
    return 2 * h * b + h * b * d


def _int8_encode(x: np.ndarray) -> bytes:
    scales, q = int8_quantize(x)
    return le_bytes(scales) + q.tobytes()


def _int8_decode(data: memoryview, desc: Descriptor, out_dtype: np.dtype[Any]) -> np.ndarray:
    h, b, d = desc.kv_heads, desc.block_tokens, desc.head_dim
    scales = from_le_bytes(data[:2 * h * b], np.dtype("<f2"), (h, b))
    q = np.frombuffer(data[2 * h * b:], dtype=np.int8).reshape(h, b, d)
    return int8_dequantize(scales, q, out_dtype)


# -- zstd ----------------------------------------------------------------------------------------


def _zstd_compress(parts: Sequence[bytes]) -> bytes:
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return cctx.compress(b"".join(parts))


def _zstd_decompress(data: memoryview, expected: int) -> bytes:
    """Exactly one frame whose content is ``expected`` octets; nothing after it."""
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise CodecError(f"zstd Data is not a Zstandard frame: {exc}") from None
    if declared >= 0 and declared != expected:
        raise CodecError(f"zstd frame declares {declared} octets, expected {expected}")
    dobj = zstandard.ZstdDecompressor().decompressobj()
    out: list[bytes] = []
    total = 0
    end = 0
    try:
        while end < len(data) and not dobj.eof:
            chunk = dobj.decompress(data[end:end + _ZSTD_FEED])
            end += _ZSTD_FEED
            total += len(chunk)
            if total > expected:
                raise CodecError(f"zstd frame expands beyond the expected {expected} octets")
            out.append(chunk)
    except zstandard.ZstdError as exc:
        raise CodecError(f"zstd Data does not decompress: {exc}") from None
    if not dobj.eof:
        raise CodecError("zstd frame is truncated")
    if dobj.unused_data or end < len(data):
        raise CodecError("zstd Data has octets after its frame")
    if total != expected:
        raise CodecError(f"zstd frame holds {total} octets, expected {expected}")
    return b"".join(out)


# -- Data of k / v / kv Objects -----------------------------------------------------------------


def encode_data(codec: Codec, component: Component, k: np.ndarray | None = None,
                v: np.ndarray | None = None) -> bytes:
    """Data of one Object from section arrays [kv_heads][B][head_dim] (K, V or both)."""
    sections: list[np.ndarray] = []
    if component in (Component.K, Component.KV):
        if k is None:
            raise CodecError(f"component {component.label} needs the K section")
        sections.append(k)
    if component in (Component.V, Component.KV):
        if v is None:
            raise CodecError(f"component {component.label} needs the V section")
        sections.append(v)
    if codec is Codec.RAW:
        return b"".join(le_bytes(s) for s in sections)
    if codec is Codec.ZSTD:
        # For kv: one frame over the concatenated raw K and V sections.
        return _zstd_compress([le_bytes(s) for s in sections])
    if codec is Codec.INT8:
        return b"".join(_int8_encode(s) for s in sections)
    raise CodecError(f"codec {codec!r} has no encoder")


def decode_data(codec: Codec, component: Component, data: bytes | memoryview,
                desc: Descriptor, *, out_dtype: np.dtype[Any] | type | None = None
                ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(K, V) section arrays from one Object's Data; the absent component is None.

    raw and zstd return the descriptor's dtype (raw: a zero-copy view of ``data`` on
    little-endian hosts); int8 returns ``out_dtype`` (default: the descriptor's dtype).
    """
    view = memoryview(data).cast("B")
    count = 2 if component is Component.KV else 1
    shape = (desc.kv_heads, desc.block_tokens, desc.head_dim)
    sec = desc.section_bytes
    if codec in (Codec.RAW, Codec.ZSTD):
        if codec is Codec.ZSTD:
            view = memoryview(_zstd_decompress(view, count * sec))
        elif view.nbytes != count * sec:
            raise CodecError(f"raw Data has {view.nbytes} octets, expected {count * sec}")
        arrays = [from_le_bytes(view[i * sec:(i + 1) * sec], desc.dtype, shape)
                  for i in range(count)]
    elif codec is Codec.INT8:
        n = _int8_len(desc)
        if view.nbytes != count * n:
            raise CodecError(f"int8 Data has {view.nbytes} octets, expected {count * n}")
        dtype = np.dtype(out_dtype) if out_dtype is not None else desc.dtype
        arrays = [_int8_decode(view[i * n:(i + 1) * n], desc, dtype) for i in range(count)]
    else:
        raise CodecError(f"codec {codec!r} has no decoder")
    if component is Component.K:
        return arrays[0], None
    if component is Component.V:
        return None, arrays[0]
    return arrays[0], arrays[1]
