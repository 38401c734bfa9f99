"""Subprocesses for tests: a free UDP port for one that cannot bind port 0 and say which it
got, and a process waited for until its output says it is ready."""

from __future__ import annotations

import asyncio
import random
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 nothing holds now, below the kernel's ephemeral range.

    Not port 0's answer: the kernel hands the ports of its ephemeral range to every socket
    bound to port 0 (a relay's dial to an upstream, every client), so one it named free a
    moment ago may be a client's before the test binds it (a CI run failed so, with two
    relays dialing in between). Below that range a port is only ever taken on purpose,
    and chosen at random by tests in parallel workers, two rarely meet."""
    from port_guard import DEFAULT_PORTS

    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10_000, low)
        if port in DEFAULT_PORTS:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free UDP port below the ephemeral range")


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
