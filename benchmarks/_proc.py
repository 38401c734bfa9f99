"""What a process on this machine has cost so far, from /proc (Linux): the CPU a benchmark
divides by the bytes it delivered."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (its own threads; children it waited for
    are counted too: cutime + cstime)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # the command name (field 2) may hold spaces: count fields after its closing ")"
    fields = stat[stat.rindex(b")") + 2:].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / _TICK


def cpu_per_gb(cpu: float, delivered_bytes: int) -> float:
    """CPU seconds per delivered GB (10^9 bytes)."""
    return cpu / (delivered_bytes / 1e9)


def peak_rss(pid: int) -> int:
    """Peak resident set (VmHWM) of a running process, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"/proc/{pid}/status has no VmHWM")


@dataclass
class Measured:
    """One finished command: exit code, output, wall seconds and peak RSS in bytes."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss: int


def run_measured(args: Sequence[str], timeout: float) -> Measured:
    """Run ``args`` to its end; its own peak RSS comes from wait4's rusage, which (unlike
    RUSAGE_CHILDREN) is that one child's, and exact however short-lived it was. Blocking:
    call it in a thread from asyncio code. Killed past ``timeout``."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        proc = subprocess.Popen(list(args), stdout=out, stderr=err)
        # the pid stays ours until wait4 reaps it: killing it by pid cannot hit another process
        timer = threading.Timer(timeout, os.kill, (proc.pid, signal.SIGKILL))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not
        out.seek(0)
        err.seek(0)
        return Measured(proc.returncode, out.read().decode(), err.read().decode(), wall,
                        usage.ru_maxrss * 1024)  # kilobytes on Linux
