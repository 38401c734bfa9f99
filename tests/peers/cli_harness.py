"""Running `kvcs` as a subprocess, and a `kvcs relay` subprocess on 127.0.0.1 (shared by the
peers' and the model's CLI tests)."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

KVCS = [sys.executable, "-m", "relay.cli"]


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_kvcs(*args: str, timeout: float) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``kvcs ARGS``; killed past ``timeout``."""
    proc = await asyncio.create_subprocess_exec(*KVCS, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@asynccontextmanager
async def relay_process(data: Path, timeout: float, *extra: str
                        ) -> AsyncIterator[tuple[str, Path]]:
    """A `kvcs relay` subprocess (``extra``: more of its options): yields its URL and
    certificate once it logged "ready".
    It binds a port of the kernel's choosing and names it in that line: a port picked here
    and handed over could be taken by another test process in between."""
    proc = await asyncio.create_subprocess_exec(
        *KVCS, "relay", "--listen", "127.0.0.1:0", "--data-dir", str(data),
        # no fixed metrics port: another relay on this machine may hold 9464
        "--metrics-listen", "off", *extra,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    drain = None
    try:
        async with asyncio.timeout(timeout):
            while b"relay ready" not in (line := await proc.stderr.readline()):
                assert line, "the relay exited before it was ready"
        drain = asyncio.ensure_future(proc.stderr.read())  # never block on a full pipe
        m = re.search(rb"relay ready on (moqt://127\.0\.0\.1:\d+/) ", line)
        assert m, line
        yield m.group(1).decode(), data / "tls" / "cert.pem"
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), timeout)
        if drain is not None:
            drain.cancel()
