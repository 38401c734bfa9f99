"""A tiny HTTP/1.1 GET for the ops tests (the relay's metrics listener speaks nothing more)."""

from __future__ import annotations

import asyncio

TIMEOUT = 10.0


async def http_get(port: int, path: str, accept: str = "") -> tuple[int, str]:
    async with asyncio.timeout(TIMEOUT):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        extra = f"Accept: {accept}\r\n" if accept else ""
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode())
        data = await reader.read()
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode()
