"""Key-Value-Pairs (§2.4): Setup Options, Track Properties, Object Properties.

Type parity decides the value: even → one vi64 (``int``), odd → length-prefixed ``bytes``.
Pairs are delta-coded in ascending Type order; a repeated Type has delta 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from .codes import PropertyType, SessionErrorCode
from .errors import SessionError, protocol_violation
from .reader import Reader
from .vi64 import MAX_VI64, encode_vi64

__all__ = [
    "MAX_KVP_BYTES",
    "KeyValuePair",
    "Properties",
    "decode_kvps",
    "encode_kvps",
    "kvps_from_bytes",
    "validate_track_properties",
]

MAX_KVP_BYTES = 65535


class KeyValuePair(NamedTuple):
    """One pair; ``value`` is ``int`` for even types and ``bytes`` for odd types."""

    type: int
    value: int | bytes


Properties = tuple[KeyValuePair, ...]


def encode_kvps(pairs: Iterable[KeyValuePair | tuple[int, int | bytes]]) -> bytes:
    """Encode pairs, sorted by Type (stable, so repeated Types keep their order)."""
    out: list[bytes] = []
    prev = 0
    for t, v in sorted(pairs, key=lambda p: p[0]):
        out.append(encode_vi64(t - prev))
        prev = t
        if t & 1:
            if not isinstance(v, bytes | bytearray | memoryview):
                raise ValueError(f"odd Key-Value-Pair type {t:#x} needs a bytes value")
            if len(v) > MAX_KVP_BYTES:
                raise ValueError("Key-Value-Pair value longer than 65535 bytes")
            out.append(encode_vi64(len(v)))
            out.append(bytes(v))
        else:
            if not isinstance(v, int):
                raise ValueError(f"even Key-Value-Pair type {t:#x} needs an int value")
            out.append(encode_vi64(v))
    return b"".join(out)


def decode_kvps(r: Reader) -> Properties:
    """Decode pairs until the reader's end (the enclosing length bounds the sequence)."""
    pairs: list[KeyValuePair] = []
    t = 0
    while not r.at_end():
        t += r.vi64()
        if t > MAX_VI64:
            raise protocol_violation("Key-Value-Pair type exceeds 2^64-1")
        if t & 1:
            n = r.vi64()
            if n > MAX_KVP_BYTES:
                raise protocol_violation("Key-Value-Pair value longer than 65535 bytes")
            pairs.append(KeyValuePair(t, r.take(n)))
        else:
            pairs.append(KeyValuePair(t, r.vi64()))
    return tuple(pairs)


def kvps_from_bytes(raw: bytes | memoryview) -> Properties:
    """Decode a complete KVP block (e.g. an Object's raw Properties)."""
    return decode_kvps(Reader(raw))


def _kv_error(reason: str) -> SessionError:
    return SessionError(SessionErrorCode.KEY_VALUE_FORMATTING_ERROR, reason)


def validate_track_properties(props: Properties) -> None:
    """Check the values of known Track/Object Properties (KEY_VALUE_FORMATTING_ERROR).

    Unknown types are left alone: relays forward them unchanged (§12).
    """
    for t, v in props:
        if t == PropertyType.DEFAULT_PUBLISHER_PRIORITY and isinstance(v, int) and v > 255:
            raise _kv_error("DEFAULT_PUBLISHER_PRIORITY above 255")
        elif t == PropertyType.DEFAULT_PUBLISHER_GROUP_ORDER and v not in (1, 2):
            raise _kv_error("DEFAULT_PUBLISHER_GROUP_ORDER not 1 or 2")
        elif t == PropertyType.DYNAMIC_GROUPS and v not in (0, 1):
            raise _kv_error("DYNAMIC_GROUPS not 0 or 1")
        elif t == PropertyType.IMMUTABLE_PROPERTIES and isinstance(v, bytes):
            try:
                kvps_from_bytes(v)
            except SessionError as e:
                raise _kv_error(f"IMMUTABLE_PROPERTIES: {e.reason}") from None
