"""Reading a whole stream, for tests: the product parses streams as they arrive and never
needs one joined (relay/transport has no such call)."""

from __future__ import annotations

from relay.transport import RecvStream, TransportError


async def read_all(recv: RecvStream, limit: int | None = None) -> bytes:
    """Everything up to the FIN (TransportError past ``limit`` bytes)."""
    parts: list[bytes] = []
    total = 0
    while chunk := await recv.read():
        total += len(chunk)
        if limit is not None and total > limit:
            raise TransportError(f"stream {recv.stream_id} exceeds {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)
