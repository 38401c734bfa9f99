"""vi64 (§2.1): the examples table, non-minimal forms, short reads, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.moqt import MAX_VI64, decode_vi64, encode_vi64
from relay.moqt.vi64 import NeedMoreData

TABLE = [
    (37, "25"),
    (64, "40"),
    (127, "7f"),
    (128, "80 80"),
    (300, "81 2c"),
    (5000, "93 88"),
    (0x2F00, "af 00"),
    (16384, "c0 40 00"),
    (32836, "c0 80 44"),
    (0x132B3E28, "f0 13 2b 3e 28"),
    (2**56, "ff 01 00 00 00 00 00 00 00"),
    (2**64 - 1, "ff ff ff ff ff ff ff ff ff"),
]


@pytest.mark.parametrize(("value", "hexed"), TABLE)
def test_profile_examples_both_directions(value: int, hexed: str) -> None:
    raw = bytes.fromhex(hexed)
    assert encode_vi64(value) == raw
    assert decode_vi64(raw) == (value, len(raw))


@pytest.mark.parametrize(
    "raw", ["25", "80 25", "c0 00 25", "e0 00 00 25", "ff 00 00 00 00 00 00 00 25"]
)
def test_non_minimal_encodings_accepted(raw: str) -> None:
    assert decode_vi64(bytes.fromhex(raw))[0] == 37


def test_zero_in_every_length() -> None:
    for n in range(1, 10):
        first = (0xFF << (9 - n)) & 0xFF if n < 9 else 0xFF
        raw = bytes([first]) + bytes(n - 1)
        assert decode_vi64(raw) == (0, n)


def test_short_reads_raise_index_error() -> None:
    for v in (128, 16384, 2**40, 2**64 - 1):
        raw = encode_vi64(v)
        for cut in range(len(raw)):
            with pytest.raises(IndexError):
                decode_vi64(raw[:cut])
    with pytest.raises(NeedMoreData):
        decode_vi64(b"\xc0\x00")


def test_out_of_range_rejected_on_encode() -> None:
    for v in (-1, 2**64):
        with pytest.raises(ValueError):
            encode_vi64(v)


def test_boundaries_round_trip() -> None:
    for n in range(1, 10):
        for v in ((1 << (7 * n)) - 1, 1 << (7 * n)):
            if v <= MAX_VI64:
                raw = encode_vi64(v)
                assert decode_vi64(raw) == (v, len(raw))
                # the shortest encoding: n bytes hold 7n bits, and 9 bytes all 64
                assert len(raw) == min(9, n if v < 1 << (7 * n) else n + 1)


@settings(max_examples=300)
@given(st.integers(0, MAX_VI64), st.binary(max_size=3))
def test_round_trip_with_offset_and_trailer(v: int, junk: bytes) -> None:
    raw = encode_vi64(v)
    assert decode_vi64(junk + raw + junk, len(junk)) == (v, len(junk) + len(raw))
    assert decode_vi64(memoryview(raw)) == (v, len(raw))
