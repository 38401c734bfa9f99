"""Codecs raw / zstd / int8 for k, v, kv (KVSP-PROFILE 4-5)."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from relay.kvcs.codecs import (
    copy_into,
    decode_data,
    encode_data,
    int8_dequantize,
    int8_quantize,
    le_bytes,
    raw_section,
    raw_view,
    section,
)
from relay.kvcs.descriptor import DTYPES, Descriptor
from relay.kvcs.errors import CodecError, UnknownCodecError
from relay.kvcs.registry import Codec, Component, codec_by_name
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv

H, D, B = 3, 8, 4


def desc(dtype: str) -> Descriptor:
    return synthetic_descriptor(2, H, D, dtype, block_tokens=B)


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD])
@pytest.mark.parametrize("component", list(Component))
def test_lossless_round_trip_bit_exact(dtype: str, codec: Codec, component: Component) -> None:
    k, v = synthetic_kv(2, H, D, 3 * B, dtype, seed=7)
    ks, vs = section(k, 1, 2, B), section(v, 1, 2, B)
    data = encode_data(codec, component, ks, vs)
    dk, dv = decode_data(codec, component, data, desc(dtype))
    if component is not Component.V:
        assert dk is not None and dk.dtype == DTYPES[dtype] and bits(dk) == bits(ks)
    if component is not Component.K:
        assert dv is not None and bits(dv) == bits(vs)
    assert (dk is None) == (component is Component.V)
    assert (dv is None) == (component is Component.K)


def test_raw_data_is_the_raw_section_and_kv_raw_digest_is_layer_digest() -> None:
    k, v = synthetic_kv(2, H, D, 2 * B, "bfloat16", seed=1)
    rk, rv = raw_section(k, 0, 1, B), raw_section(v, 0, 1, B)
    assert len(rk) == H * B * D * 2
    assert rk == bytes(np.ascontiguousarray(k[0, :, B:2 * B, :]).view(np.uint8))
    assert encode_data(Codec.RAW, Component.K, k=section(k, 0, 1, B)) == rk
    assert encode_data(Codec.RAW, Component.KV, section(k, 0, 1, B), section(v, 0, 1, B)) \
        == rk + rv


def test_zstd_kv_is_one_frame_over_both_sections() -> None:
    k, v = synthetic_kv(1, H, D, B, "float16", seed=2)
    data = encode_data(Codec.ZSTD, Component.KV, section(k, 0, 0, B), section(v, 0, 0, B))
    assert zstandard.ZstdDecompressor().decompress(data) == \
        raw_section(k, 0, 0, B) + raw_section(v, 0, 0, B)


@pytest.mark.parametrize("bad", [
    b"",                                                           # not a frame
    b"garbage",
    zstandard.ZstdCompressor().compress(b"x" * 10),                 # wrong size
    zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * (3 * H * B * D * 4)),
])
def test_zstd_rejects_wrong_frames(bad: bytes) -> None:
    with pytest.raises(CodecError):
        decode_data(Codec.ZSTD, Component.KV, bad, desc("float32"))


def test_zstd_accepts_frame_without_content_size_and_rejects_trailing_data() -> None:
    raw = bytes(H * B * D * 4)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    k, _ = decode_data(Codec.ZSTD, Component.K, frame, desc("float32"))
    assert k is not None and bits(k) == raw
    with pytest.raises(CodecError, match="after its frame"):
        decode_data(Codec.ZSTD, Component.K, frame + frame, desc("float32"))
    with pytest.raises(CodecError, match=r"truncated|not a Zstandard|decompress"):
        decode_data(Codec.ZSTD, Component.K, frame[:-3], desc("float32"))


@pytest.mark.parametrize("codec", [Codec.RAW, Codec.INT8])
def test_wrong_lengths_rejected(codec: Codec) -> None:
    k, _ = synthetic_kv(1, H, D, B, "float32", seed=3)
    data = encode_data(codec, Component.K, k=section(k, 0, 0, B))
    for bad in (data[:-1], data + b"\0"):
        with pytest.raises(CodecError):
            decode_data(codec, Component.K, bad, desc("float32"))


def test_missing_section_and_unknown_codec() -> None:
    with pytest.raises(CodecError, match="needs the V"):
        encode_data(Codec.RAW, Component.KV, k=np.zeros((H, B, D), np.float32))
    with pytest.raises(UnknownCodecError):
        codec_by_name("brotli")
    with pytest.raises(CodecError, match="outside"):
        section(np.zeros((1, H, B, D)), 0, 1, B)


def test_int8_layout() -> None:
    x = np.zeros((H, B, D), np.float32)
    x[1, 2, :] = np.linspace(-2, 1, D)
    data = encode_data(Codec.INT8, Component.V, v=x)
    assert len(data) == 2 * H * B + H * B * D
    scales = np.frombuffer(data[:2 * H * B], "<f2").reshape(H, B)
    q = np.frombuffer(data[2 * H * B:], np.int8).reshape(H, B, D)
    assert scales[1, 2] == np.float16(2 / 127) and scales.sum() == scales[1, 2]
    assert q[1, 2, 0] == -127 and np.count_nonzero(q[0]) == 0
    _, dv = decode_data(Codec.INT8, Component.V, data, desc("float32"))
    assert dv is not None and np.allclose(dv, x, atol=float(scales[1, 2]) / 2 + 1e-6)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_int8_round_trip_every_component_and_dtype(dtype: str) -> None:
    k, v = synthetic_kv(2, H, D, 2 * B, dtype, seed=4)
    ks, vs = section(k, 1, 1, B), section(v, 1, 1, B)
    data = encode_data(Codec.INT8, Component.KV, ks, vs)
    dk, dv = decode_data(Codec.INT8, Component.KV, data, desc(dtype), out_dtype=np.float32)
    for orig, got in ((ks, dk), (vs, dv)):
        assert got is not None and got.dtype == np.float32
        x = orig.astype(np.float32)
        step = np.abs(x).max(axis=-1, keepdims=True) / 127
        assert np.all(np.abs(got - x) <= step / 2 * (1 + 2**-9) + 1e-7)
    dk2, _ = decode_data(Codec.INT8, Component.KV, data, desc(dtype))
    assert dk2 is not None and dk2.dtype == DTYPES[dtype]


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.integers(1, 4),
                                        st.integers(1, 16)),
                  elements=st.floats(-8.0e6, 8.0e6, width=32, allow_subnormal=True)))
def test_int8_error_bound(x: np.ndarray) -> None:
    """|x - q*s| <= s/2 + 127*|t - s| with t = max|x|/127 and s its float16 (module doc)."""
    scales, q = int8_quantize(x)
    y = int8_dequantize(scales, q, np.float32).astype(np.float64)
    xd = x.astype(np.float64)
    t = np.abs(xd).max(axis=-1, keepdims=True) / 127
    s = scales.astype(np.float64)[..., None]
    # float32 arithmetic in division and product: a few ulps of max|x|
    slack = 127 * t * 2.0**-22
    assert np.all(np.abs(y - xd) <= s / 2 + 127 * np.abs(t - s) + slack)
    # In float16's normal range this is "half a step plus the scale's rounding".
    normal = t >= 2.0**-14
    bound = t / 2 * (1 + 2.0**-10) + 127 * 2.0**-11 * t + slack
    assert np.all((np.abs(y - xd) <= bound) | ~normal)


@pytest.mark.parametrize("value", [np.nan, np.inf, 1e7 * 127])
def test_int8_refuses_unrepresentable(value: float) -> None:
    x = np.zeros((1, 1, 4), np.float32)
    x[0, 0, 1] = value
    with pytest.raises(CodecError):
        int8_quantize(x)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float16", "float32"])
def test_raw_moves_keep_every_element_bit_for_bit(dtype: str) -> None:
    # raw_view moves ml_dtypes elements as integers; a wrong width or byte order would show
    # here as different octets or values
    dt = DTYPES[dtype]
    src = np.arange(2 * 6 * 4, dtype=np.float32).reshape(2, 6, 4).astype(dt)
    strided = src[:, 1:5, :]
    assert le_bytes(strided) == np.ascontiguousarray(strided).tobytes()
    assert raw_view(src).dtype.itemsize == src.dtype.itemsize
    dst = np.zeros((2, 8, 4), dt)
    copy_into(dst[:, 2:6, :], strided)
    assert dst[:, 2:6, :].tobytes() == np.ascontiguousarray(strided).tobytes()
    assert not dst[:, :2, :].any() and not dst[:, 6:, :].any()
    widened = np.zeros((2, 4, 4), np.float32)
    copy_into(widened, strided)  # another dtype: a conversion, not a move of octets
    assert (widened == strided.astype(np.float32)).all()
