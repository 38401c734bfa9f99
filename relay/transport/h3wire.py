"""HTTP/3 and WebTransport on the wire, as pure functions: the WebTransport error-code
range, QUIC variable-length integers, the CLOSE_WEBTRANSPORT_SESSION capsule, and the
Structured Field values of the WT-Available-Protocols / WT-Protocol headers.

No state and no I/O: :class:`~relay.transport.webtransport.WebTransport` (the sessions)
uses them, and tests/transport/test_transport_webtransport_codec.py checks them alone.
"""

from __future__ import annotations

# draft-ietf-webtrans-http3: application error codes live in a reserved HTTP/3 range,
# skipping the GREASE code points (one every 0x1f).
WT_APP_ERROR_FIRST = 0x52E4A40FA8DB
WT_APP_ERROR_LAST = 0x52E5AC983162
WT_SESSION_GONE = 0x170D7B68
H3_NO_ERROR = 0x100

CAPSULE_CLOSE_WEBTRANSPORT_SESSION = 0x2843
MAX_CLOSE_REASON = 1024  # bytes; the draft's limit on the capsule's message

HDR_AVAILABLE_PROTOCOLS = b"wt-available-protocols"
HDR_PROTOCOL = b"wt-protocol"


def app_to_wt_error(code: int) -> int:
    """Map a 32-bit application (MOQT) stream error code into the WT HTTP/3 range."""
    if not 0 <= code <= 0xFFFFFFFF:
        raise ValueError(f"WebTransport stream error codes are 32-bit, got {code:#x}")
    return WT_APP_ERROR_FIRST + code + code // 0x1E


def wt_to_app_error(code: int) -> int | None:
    """Inverse of :func:`app_to_wt_error`; None for codes outside the WT range/GREASE."""
    if not WT_APP_ERROR_FIRST <= code <= WT_APP_ERROR_LAST or (code - 0x21) % 0x1F == 0:
        return None
    shifted = code - WT_APP_ERROR_FIRST
    return shifted - shifted // 0x1F


def encode_uint_var(value: int) -> bytes:
    """A QUIC variable-length integer (RFC 9000 16)."""
    if value < 0x40:
        return bytes([value])
    if value < 0x4000:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 0x40000000:
        return (value | 0x80000000).to_bytes(4, "big")
    if value < 0x4000000000000000:
        return (value | 0xC000000000000000).to_bytes(8, "big")
    raise ValueError(f"{value} does not fit a QUIC varint")


def pull_uint_var(data: bytes, pos: int) -> tuple[int, int] | None:
    """(value, next position) of the varint at ``pos``, or None if ``data`` ends first."""
    if pos >= len(data):
        return None
    n = 1 << (data[pos] >> 6)
    if pos + n > len(data):
        return None
    value = int.from_bytes(data[pos:pos + n], "big") & ((1 << (8 * n - 2)) - 1)
    return value, pos + n


def encode_close_capsule(code: int, reason: str) -> bytes:
    """CLOSE_WEBTRANSPORT_SESSION capsule: 32-bit code then the UTF-8 reason."""
    msg = reason.encode("utf-8")[:MAX_CLOSE_REASON]
    value = (code & 0xFFFFFFFF).to_bytes(4, "big") + msg
    return (encode_uint_var(CAPSULE_CLOSE_WEBTRANSPORT_SESSION)
            + encode_uint_var(len(value)) + value)


class CapsuleParser:
    """Incremental capsule parser for the CONNECT stream's DATA payload."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Return the complete (type, value) capsules now available."""
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while self._buf:
            head = pull_uint_var(self._buf, 0)
            head2 = head and pull_uint_var(self._buf, head[1])
            if not head or not head2:
                break
            ctype, (length, start) = head[0], head2
            if len(self._buf) - start < length:
                break
            out.append((ctype, self._buf[start:start + length]))
            self._buf = self._buf[start + length:]
        return out


def decode_close_capsule(value: bytes) -> tuple[int, str]:
    """Return (code, reason) from a CLOSE_WEBTRANSPORT_SESSION capsule value."""
    if len(value) < 4:
        raise ValueError("CLOSE_WEBTRANSPORT_SESSION capsule shorter than 4 bytes")
    return int.from_bytes(value[:4], "big"), value[4:].decode("utf-8", "replace")


def sf_string(value: str) -> bytes:
    """Serialise a Structured Field sf-string (RFC 8941 3.3.3)."""
    return b'"' + value.replace("\\", "\\\\").replace('"', '\\"').encode("ascii") + b'"'


def parse_sf_list(value: bytes) -> list[str]:
    """Parse a Structured Field list of strings/tokens, ignoring parameters.

    Lenient on purpose: bare tokens (``moqt-22``) are accepted as well as sf-strings
    (``"moqt-22"``), since early WebTransport implementations sent either.
    """
    items: list[str] = []
    text = value.decode("ascii", "replace")
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t,":
            i += 1
        if i >= n:
            break
        if text[i] == '"':
            i += 1
            chars: list[str] = []
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n:
                    i += 1
                chars.append(text[i])
                i += 1
            items.append("".join(chars))
            i += 1
        else:
            start = i
            while i < n and text[i] not in ",; \t":
                i += 1
            items.append(text[start:i])
        # skip parameters (";key=value") up to the next comma
        while i < n and text[i] != ",":
            if text[i] == '"':
                i = text.find('"', i + 1) + 1 or n
            else:
                i += 1
    return items


def parse_sf_item(value: bytes) -> str | None:
    """Parse a single sf-string or token (``WT-Protocol``); None if empty."""
    items = parse_sf_list(value)
    return items[0] if items else None


def select_protocol(offered: bytes | None, ours: str) -> str | None:
    """The protocol the server selects from a ``WT-Available-Protocols`` value."""
    if offered is None:
        return None
    return ours if ours in parse_sf_list(offered) else None
