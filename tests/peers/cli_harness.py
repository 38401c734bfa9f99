"""Running `kvcs` as a subprocess, and a `kvcs relay` subprocess on 127.0.0.1 (shared by the
peers' and the model's CLI tests)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from processes import free_udp_port, ready_process

KVCS = [sys.executable, "-m", "relay.cli"]

__all__ = ["KVCS", "free_udp_port", "ready_process", "relay_process", "run_kvcs"]


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
    # no fixed metrics port: another relay on this machine may hold 9464
    argv = [*KVCS, "relay", "--listen", "127.0.0.1:0", "--data-dir", str(data),
            "--metrics-listen", "off", *extra]
    async with ready_process(argv, rb"relay ready on (moqt://127\.0\.0\.1:\d+/) ", timeout,
                             "the relay") as m:
        yield m.group(1).decode(), data / "tls" / "cert.pem"
