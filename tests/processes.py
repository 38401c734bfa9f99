"""Subprocesses for tests: a free UDP port for one that cannot bind port 0 and say which it
got, and a process waited for until its output says it is ready."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def ready_process(argv: list[str], ready: bytes, timeout: float, what: str
                        ) -> AsyncIterator[re.Match[bytes]]:
    """A subprocess ``argv`` (its stdout and stderr one pipe) once a line of its output
    matches ``ready``: yields that match. The rest of its output is read and dropped (never
    blocked on a full pipe); terminated when the block ends."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    drain = None
    try:
        async with asyncio.timeout(timeout):
            while not (m := re.search(ready, line := await proc.stdout.readline())):
                assert line, f"{what} exited before it was ready"
        drain = asyncio.ensure_future(proc.stdout.read())
        yield m
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), timeout)
        if drain is not None:
            drain.cancel()


__all__ = ["free_udp_port", "ready_process"]
