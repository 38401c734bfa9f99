"""Object payload of kvcs-draft 3.5: encoder and one test per verification failure."""

from __future__ import annotations

import hashlib
import struct

import pytest

from relay.kvcs.errors import (
    BadMagicError,
    BadVersionError,
    BlockIndexMismatchError,
    DigestMismatchError,
    LayerMismatchError,
    LengthMismatchError,
    PayloadError,
    PayloadTooShortError,
    UnknownComponentError,
)
from relay.kvcs.payload import HEADER_LEN, encode_object, parse_header, verify_object
from relay.kvcs.registry import Component

DATA = bytes(range(256)) * 3


def make(**kw: object) -> bytes:
    args: dict[str, object] = dict(component=Component.V, layer=5, block_index=7,
                                   token_start=2**40 + 3, token_count=16, codec=0xFF01,
                                   data=DATA)
    args.update(kw)
    return encode_object(**args)  # type: ignore[arg-type]


def test_header_layout_is_big_endian_68_octets() -> None:
    p = make()
    assert HEADER_LEN == 68 and len(p) == 68 + len(DATA)
    assert p[:4] == b"KVO1"
    assert p[4:8] == bytes([1, 2, 0, 0])           # version, component v, flags
    assert p[8:12] == (5).to_bytes(4, "big")        # layer
    assert p[12:16] == (7).to_bytes(4, "big")       # block index
    assert p[16:24] == (2**40 + 3).to_bytes(8, "big")
    assert p[24:28] == (16).to_bytes(4, "big")
    assert p[28:32] == bytes([0xFF, 0x01, 0, 0])    # codec, reserved
    assert p[32:36] == len(DATA).to_bytes(4, "big")
    assert p[36:68] == hashlib.sha256(DATA).digest()
    assert p[68:] == DATA


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_round_trip_zero_copy(wrap: type) -> None:
    payload = wrap(make())
    obj = verify_object(payload, 5, 7)
    h = obj.header
    assert (h.component, h.layer, h.block_index, h.token_start, h.token_count, h.codec) == (
        Component.V, 5, 7, 2**40 + 3, 16, 0xFF01)
    assert h.data_length == len(DATA) and bytes(obj.data) == DATA
    assert isinstance(obj.data, memoryview)
    if wrap is bytearray:  # the view aliases the caller's buffer: no copy was made
        payload[HEADER_LEN] ^= 0xFF
        assert obj.data[0] == DATA[0] ^ 0xFF


def test_multi_part_data_equals_concatenation() -> None:
    assert make(data=[DATA[:10], memoryview(DATA[10:])]) == make()


def test_flags_and_reserved_ignored_on_receipt() -> None:
    p = bytearray(make())
    p[6:8] = b"\xab\xcd"
    p[30:32] = b"\x12\x34"
    assert verify_object(p, 5, 7).header.flags == 0xABCD


def test_empty_data_is_valid() -> None:
    assert bytes(verify_object(make(data=b""), 5, 7).data) == b""


def corrupt(offset: int, value: bytes) -> bytearray:
    p = bytearray(make())
    p[offset:offset + len(value)] = value
    return p


@pytest.mark.parametrize(("payload", "group", "obj", "error"), [
    (make()[:67], 5, 7, PayloadTooShortError),
    (b"", 5, 7, PayloadTooShortError),
    (corrupt(0, b"KVO2"), 5, 7, BadMagicError),
    (corrupt(4, b"\x02"), 5, 7, BadVersionError),
    (corrupt(5, b"\x04"), 5, 7, UnknownComponentError),
    (corrupt(5, b"\x00"), 5, 7, UnknownComponentError),
    (make(), 6, 7, LayerMismatchError),
    (make(), 5, 8, BlockIndexMismatchError),
    (make()[:-1], 5, 7, LengthMismatchError),
    (make() + b"\x00", 5, 7, LengthMismatchError),
    (corrupt(32, struct.pack(">I", 2**32 - 1)), 5, 7, LengthMismatchError),
    (corrupt(100, b"\x00"), 5, 7, DigestMismatchError),
    (corrupt(40, b"\x00"), 5, 7, DigestMismatchError),
])
def test_each_failure_has_its_error(payload: bytes, group: int, obj: int,
                                    error: type[PayloadError]) -> None:
    with pytest.raises(error):
        verify_object(payload, group, obj)


def test_parse_header_does_not_verify_digest() -> None:
    assert parse_header(corrupt(100, b"\x00")).layer == 5
