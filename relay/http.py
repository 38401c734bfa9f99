"""The one small HTTP/1.x server and client of the relay: a relay's metrics listener
(/metrics, /healthz, /readyz, /admin/) and the supervisor's (relay/workers.py) are both a
`Listener` with their own routes, and the supervisor asks its workers with `request`.

Only what those endpoints need: one request per connection, a bounded head, a body only
with a valid Content-Length (at most :data:`MAX_BODY`), the answer then close. Every
limit is here once, so the two listeners cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

log = logging.getLogger(__name__)

Answer = tuple[int, str, bytes]
"""(status code, Content-Type, body) of one answer."""

# The request line and headers together: ours are a few hundred bytes, and a line longer
# than the stream's own limit (asyncio's 64 KiB) is refused the same way.
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024  # an admin request is a few hundred bytes
# After the answer, what a client still sends (a body we refused to read, the rest of an
# oversized head) is read and dropped, up to this much for this long: closing a socket with
# unread input makes the kernel answer with a reset, which can destroy our answer before
# the client reads it.
LINGER_BYTES = 4 << 20
LINGER_SECONDS = 2.0
# A client that is stuck (or slow on purpose) must not hold a task forever.
REQUEST_TIMEOUT = 10.0

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           405: "Method Not Allowed", 431: "Request Header Fields Too Large",
           502: "Bad Gateway", 503: "Service Unavailable"}


class BadRequest(ValueError):
    """A malformed request; the message is the one line the client gets back (400)."""


class HeadTooLarge(Exception):
    """The request's head exceeds :data:`MAX_HEAD` (answered 431)."""

    def __init__(self, request_line: str) -> None:
        super().__init__("request head too large")
        self.request_line = request_line  # "" when the request line itself was too long


def text(status: int, message: str) -> Answer:
    return status, "text/plain; charset=utf-8", (message + "\n").encode()


async def read_head(reader: asyncio.StreamReader) -> list[str]:
    """The request line and header lines (latin-1, without their CRLF), at most
    :data:`MAX_HEAD` bytes in all; `HeadTooLarge` beyond."""
    lines: list[str] = []
    size = 0
    while True:
        try:
            raw = await reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError:  # one line longer than the stream's limit
            raise HeadTooLarge(lines[0] if lines else "") from None
        size += len(raw)
        if size > MAX_HEAD:
            raise HeadTooLarge(lines[0] if lines else "")
        if raw == b"\r\n":
            return lines
        lines.append(raw[:-2].decode("latin-1"))


def parse_headers(lines: list[str]) -> dict[str, str]:
    """Header lines as a dict of lower-case names (the last of repeated ones wins)."""
    return {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}


def request_target(request_line: str) -> tuple[str, str]:
    """(method, path without the query) of a request line; ("", "") if it has none."""
    parts = request_line.split(" ")
    if len(parts) < 2:
        return (parts[0] if parts else ""), ""
    return parts[0], parts[1].split("?", 1)[0]


def content_length(headers: Mapping[str, str]) -> int:
    """The body's length, at most :data:`MAX_BODY`; `BadRequest` for anything else.

    ASCII digits only: ``str.isdigit()`` also accepts digits such as "²" that ``int()``
    refuses, and ``int()`` accepts "+5", " 5" and "5_0", none of which is HTTP.
    """
    raw = headers.get("content-length", "0")
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 20:
        raise BadRequest(f"bad Content-Length (at most {MAX_BODY // 1024} KiB)")
    n = int(raw)
    if n > MAX_BODY:
        raise BadRequest(f"bad Content-Length (at most {MAX_BODY // 1024} KiB)")
    return n


async def read_body(headers: Mapping[str, str], reader: asyncio.StreamReader) -> bytes:
    """The body its Content-Length announces (`BadRequest` for a bad one)."""
    n = content_length(headers)
    return await reader.readexactly(n) if n else b""


async def answer_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           data: bytes) -> None:
    """Send ``data`` (a whole answer), tell the client we are done sending, then drop what
    it still sends (bounded: :data:`LINGER_BYTES`, :data:`LINGER_SECONDS`) until it closes,
    so that our close does not reset the connection under an answer not yet read. The
    caller closes the writer."""
    writer.write(data)
    await writer.drain()
    if writer.can_write_eof():
        # a client that sent its request and closed at once is gone by now: our data
        # reached a closed socket, whose reset makes shutdown() fail (ENOTCONN); there is
        # nothing more to tell it, and nothing to log
        with contextlib.suppress(OSError):
            writer.write_eof()
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(LINGER_SECONDS):
            left = LINGER_BYTES
            while left > 0 and (chunk := await reader.read(min(left, 1 << 16))):
                left -= len(chunk)


Route = Callable[[str, str, dict[str, str], asyncio.StreamReader], Awaitable[Answer]]
"""(method, path, headers, reader for the body) -> the answer."""


class Listener:
    """A TCP listener answering each connection's one request with ``route``.

    ``on_head_too_large(method, path)`` is told of a request refused with 431 before it
    could be routed (the admin API counts those as refusals)."""

    def __init__(self, route: Route, name: str,
                 on_head_too_large: Callable[[str, str], None] | None = None) -> None:
        self._route = route
        self._name = name
        self._on_head_too_large = on_head_too_large
        self._server: asyncio.Server | None = None
        # each open connection's task and writer: close() ends them itself
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._accept, host, port)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback, not a coroutine: asyncio wraps a coroutine callback in a task of
        # its own, and Python 3.11 logs that task's cancellation at the loop's end (a
        # client still connected at SIGTERM) as an error with a traceback.
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._connections[task] = writer
        task.add_done_callback(self._connections.pop)

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        sock = self._server.sockets[0].getsockname()
        return sock[0], sock[1]

    async def close(self) -> None:
        """Stop listening and close the connections still open (a client may hold one
        across a shutdown): each request's task then ends by itself (its reads end)."""
        if self._server is None:
            return
        self._server.close()
        for writer in self._connections.values():
            writer.close()
        if self._connections:
            _, late = await asyncio.wait(set(self._connections), timeout=2.0)
            for task in late:  # a route still waiting on something: not waited for longer
                task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                try:
                    lines = await read_head(reader)
                    method, path = request_target(lines[0] if lines else "")
                    try:
                        status, ctype, body = await self._route(
                            method, path, parse_headers(lines[1:]), reader)
                    except BadRequest as e:
                        status, ctype, body = text(400, str(e))
                except HeadTooLarge as e:
                    if self._on_head_too_large is not None:
                        self._on_head_too_large(*request_target(e.request_line))
                    status, ctype, body = text(431, "request head too large")
                await answer_and_close(reader, writer, (
                    f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n"
                    f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n").encode() + body)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):
            pass
        except Exception:
            log.exception("request to the %s failed", self._name)
        finally:
            writer.close()


async def request(port: int, method: str, path: str, *, headers: Mapping[str, str] = {},
                  body: bytes = b"", timeout: float) -> tuple[int, bytes]:
    """(status code, body) of one request to a listener on 127.0.0.1:``port`` (a worker's);
    a connection that answers no status line counts as 502."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port),
                                            timeout)
    try:
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{extra}"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, data = raw.partition(b"\r\n\r\n")
    parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return 502, data
    return int(parts[1]), data


__all__ = ["MAX_BODY", "MAX_HEAD", "Answer", "BadRequest", "HeadTooLarge", "Listener",
           "answer_and_close", "content_length", "parse_headers", "read_body", "read_head",
           "request", "request_target", "text"]
