"""Deterministic synthetic KV caches for tests and benchmarks.

Values come from PCG64's raw 64-bit output (whose stream numpy keeps stable across versions,
unlike its distribution samplers), so a (shape, dtype, seed) always gives the same octets.
Each 32-bit half becomes a uniform value in [-1, 1) with 24-bit resolution, scaled per head
to mimic the uneven magnitudes of real caches. The stream fills K then V, each layer by
layer; ``synthetic_layers`` jumps to a layer's place in it (PCG64.advance), so a layer can
be made on its own, bit for bit as ``synthetic_kv`` makes it.
"""

from __future__ import annotations

import numpy as np

from .descriptor import DTYPES, Descriptor, make_descriptor
from .layered import LayeredArray


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")


def _values(seed: int, first: int, count: int, kv_heads: int, head_len: int, dtype: str
            ) -> np.ndarray:
    """Elements first..first+count-1 of the stream as [layers][kv_heads][head_len] (one head
    of one layer is tokens x head_dim elements; ``first`` and ``count`` are whole layers)."""
    bg = np.random.PCG64(seed)
    bg.advance(first // 2)  # two 32-bit elements per raw 64-bit output
    skip = first % 2
    raw = bg.random_raw((skip + count + 1) // 2)
    bits = np.asarray(raw, dtype="<u8").view("<u4")[skip:skip + count]
    bits >>= np.uint32(8)  # 24 random bits: exact in float32
    values = bits.astype(np.float32).reshape(-1, kv_heads, head_len)
    del raw, bits
    # Head magnitudes 0.5 .. 4, so int8 scales differ between heads:
    # value = (u * 2^-23 - 1) * m, in place to keep big caches fast.
    m = np.float32(0.5) * np.float32(2.0) ** (np.arange(kv_heads, dtype=np.float32) % 4)
    values *= (m * np.float32(2.0**-23))[:, None]
    values -= m[:, None]
    return values.astype(DTYPES[dtype])


def synthetic_kv(layers: int, kv_heads: int, head_dim: int, tokens: int, dtype: str,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(K, V), each [layers][kv_heads][tokens][head_dim] in ``dtype``."""
    _check_dtype(dtype)
    n = 2 * layers * kv_heads * tokens * head_dim
    out = _values(seed, 0, n, kv_heads, tokens * head_dim, dtype)
    out = out.reshape(2, layers, kv_heads, tokens, head_dim)
    return out[0], out[1]


def synthetic_layers(layers: int, kv_heads: int, head_dim: int, tokens: int, dtype: str,
                     seed: int = 0) -> tuple[LayeredArray, LayeredArray]:
    """synthetic_kv's (K, V), each made one layer at a time when a layer is read: a
    publisher holds a few layers, not the cache."""
    _check_dtype(dtype)
    per_layer = kv_heads * tokens * head_dim
    shape = (layers, kv_heads, tokens, head_dim)

    def component(c: int) -> LayeredArray:
        def load(layer: int) -> np.ndarray:
            first = (c * layers + layer) * per_layer
            return _values(seed, first, per_layer, kv_heads, tokens * head_dim,
                           dtype).reshape(shape[1:])
        return LayeredArray(shape, DTYPES[dtype], load)

    return component(0), component(1)


def synthetic_tokens(count: int, seed: int = 0, vocab: int = 128_256) -> list[int]:
    """``count`` deterministic token IDs below ``vocab``."""
    raw = np.random.Generator(np.random.PCG64(seed ^ 0x70C3)).bit_generator.random_raw(count)
    return [int(x) for x in np.asarray(raw, dtype=np.uint64) % np.uint64(vocab)]


def synthetic_descriptor(layers: int, kv_heads: int, head_dim: int, dtype: str,
                         block_tokens: int = 16, model: str = "synthetic/kvcs-test"
                         ) -> Descriptor:
    """A descriptor matching synthetic_kv's shape (the model name marks it as synthetic)."""
    return make_descriptor(model=model, revision="0", layers=layers, kv_heads=kv_heads,
                           head_dim=head_dim, dtype=dtype, block_tokens=block_tokens)
