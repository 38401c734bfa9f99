"""MOQT variable-length integers (vi64, profile §2.1) — NOT the QUIC varint.

The count of leading 1 bits of the first byte gives the length (1..9 bytes); the remaining bits
hold the value big-endian. Decoders accept any length that can hold the value (non-minimal
encodings are legal); the encoder always emits the shortest form.

Short reads raise ``IndexError`` (``NeedMoreData``) so incremental parsers can tell "wait for
more bytes" from protocol errors with a single ``except IndexError``.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "MAX_VI64",
    "NeedMoreData",
    "decode_vi64",
    "encode_vi64",
]

MAX_VI64: Final = (1 << 64) - 1

Buf = bytes | bytearray | memoryview


class NeedMoreData(IndexError):
    """The buffer ends inside a field; feed more bytes and retry."""


# Small values dominate (deltas, flags, lengths of names): precompute their encodings.
_SMALL: Final = tuple(bytes((i,)) for i in range(128))

# Length of the encoding indexed by first byte: leading ones + 1.
_LEN: Final = tuple(9 - (b ^ 0xFF).bit_length() for b in range(256))

# Prefix bits OR-ed into the n-byte big-endian integer (n = 1..8).
_PREFIX: Final = tuple(
    0 if n == 0 else ((0xFF << (9 - n)) & 0xFF) << (8 * (n - 1)) for n in range(9)
)
_MASK: Final = tuple((1 << (7 * n)) - 1 for n in range(9))


def encode_vi64(v: int) -> bytes:
    """Shortest vi64 encoding of ``v`` (0 <= v <= 2^64-1); ``ValueError`` otherwise."""
    if 0 <= v < 0x80:
        return _SMALL[v]
    if v < 0:
        raise ValueError(f"vi64 out of range: {v}")
    if v < 0x4000:
        return (v | 0x8000).to_bytes(2, "big")
    if v < 0x200000:
        return (v | 0xC00000).to_bytes(3, "big")
    for n in range(4, 9):
        if v < 1 << (7 * n):
            return (v | _PREFIX[n]).to_bytes(n, "big")
    if v > MAX_VI64:
        raise ValueError(f"vi64 out of range: {v}")
    return b"\xff" + v.to_bytes(8, "big")


def decode_vi64(buf: Buf, pos: int = 0) -> tuple[int, int]:
    """Decode one vi64 at ``pos``; returns ``(value, new_pos)``.

    Raises ``IndexError`` (``NeedMoreData``) when ``buf`` ends inside the integer.
    """
    first = buf[pos]
    if first < 0x80:
        return first, pos + 1
    n = _LEN[first]
    end = pos + n
    if end > len(buf):
        raise NeedMoreData
    if n == 2:
        return ((first & 0x3F) << 8) | buf[pos + 1], end
    if n == 9:
        return int.from_bytes(buf[pos + 1 : end], "big"), end
    return int.from_bytes(buf[pos:end], "big") & _MASK[n], end
