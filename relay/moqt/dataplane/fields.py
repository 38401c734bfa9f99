"""Field readers shared by the subgroup and fetch stream parsers (hot path: small values take
the one-byte branch without a call into the vi64 decoder)."""

from __future__ import annotations

from typing import Any

from ..vi64 import NeedMoreData, decode_vi64


def read_vi(buf: Any, p: int) -> tuple[int, int]:
    """A vi64 at ``p``: (value, next position)."""
    b = buf[p]
    if b < 0x80:
        return b, p + 1
    return decode_vi64(buf, p)


def read_properties(buf: Any, p: int) -> tuple[bytes, int]:
    """A Properties field (vi64 length + raw KVP bytes) at ``p``; NeedMoreData if cut."""
    ln, p = read_vi(buf, p)
    end = p + ln
    if end > len(buf):
        raise NeedMoreData
    return bytes(buf[p:end]), end
