"""An in-process relay with the admin API on, and a tiny HTTP/1.1 client for it."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from relay_helpers import TIMEOUT, client, group_payloads, push_track

from relay.moqt.primitives import FullTrackName
from relay.service import RelayConfig, RunningRelay, start_relay

TOKEN = "admin-token-0123456789abcdef"


async def admin_relay(tmp: Path, token: str | None = TOKEN, **kw: Any) -> RunningRelay:
    kw.setdefault("memory_bytes", 64 << 20)
    kw.setdefault("lmdb_bytes", 64 << 20)
    cfg = RelayConfig(listen_port=0, data_dir=tmp, metrics_listen=("127.0.0.1", 0),
                      admin_token=token, **kw)
    return await start_relay(cfg)


async def http(port: int, method: str, path: str, token: str | None = TOKEN,
               body: bytes = b"") -> tuple[int, str]:
    async with asyncio.timeout(TIMEOUT):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        data = await reader.read()
        writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), rest.decode()


async def purge(port: int, prefix: str, token: str | None = TOKEN) -> tuple[int, Any]:
    code, text = await http(port, "POST", "/admin/purge", token,
                            json.dumps({"prefix": prefix}).encode())
    return code, json.loads(text) if code == 200 else text


async def committed_track(r: RunningRelay, name: FullTrackName, groups: int = 2,
                          size: int = 2000) -> None:
    """Publish ``name`` (``groups`` Groups of 3 Objects), wait until it is in LMDB."""
    pub = await client(r)
    t = await push_track(pub, name, layers=groups)
    for g in range(groups):
        await t.group(g, group_payloads(g, 3, size))
    await t.end()
    assert await r.relay.wait_committed(name, TIMEOUT)
    await pub.aclose()


async def raw_http(port: int, data: bytes, *, eof: bool = False) -> tuple[int | None, bytes]:
    """Send ``data`` as it is (``eof``: then end our side, so that a listener waiting for
    more fails at once instead of at its timeout); the answer's status (None: no answer, or
    a reset) and body.

    The client's send buffer is small, as over a real network: a large request cannot sit
    whole in loopback's buffers, so a listener that closes with unread input resets the
    connection under its own answer (as it would for a remote client)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
    sock.setblocking(False)
    async with asyncio.timeout(TIMEOUT):
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            writer.write(data)
            await writer.drain()
            if eof:
                writer.write_eof()
            answer = await reader.read()
        except ConnectionError:  # reset, or a broken pipe: our request was cut, no answer
            answer = b""
        finally:
            writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    parts = head.split(b" ")
    return (int(parts[1]) if len(parts) > 1 else None), body


def abusive_requests(token: str = TOKEN) -> list[tuple[str, bytes, int]]:
    """(what, request, the status it must get) for requests that once had a listener log a
    traceback or reset the connection instead of answering. The two without the token are
    refusals the admin API counts (kvcs_relay_admin_unauthorized_total)."""
    auth = f"Authorization: Bearer {token}\r\n".encode()
    purge_line = b"POST /admin/purge HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    return [
        # "\xb2" is "²" in latin-1: str.isdigit() says yes, int() refuses it
        ("superscript Content-Length, no token",
         purge_line + b"Content-Length: \xb2\r\n\r\n", 401),
        ("superscript Content-Length, with the token",
         purge_line + auth + b"Content-Length: \xb2\r\n\r\n", 400),
        ("60,000 nested arrays, with the token",
         purge_line + auth + b"Content-Length: 60000\r\n\r\n" + b"[" * 60_000, 400),
        ("a 1 MB Authorization header",
         purge_line + b"Authorization: Bearer " + b"a" * (1 << 20)
         + b"\r\nContent-Length: 0\r\n\r\n", 431),
    ]
