"""What a process on this machine costs, from /proc and wait4 (Linux): the CPU a benchmark
divides by the bytes it delivered, and a command's peak memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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


# Runs argv[2:] as its child and writes the child's ru_maxrss (KiB) to the file argv[1].
# Why a middle process: Linux carries a process's RSS high-water mark across exec
# (exec_mmap: setmax_mm_hiwater_rss), so a child forked straight from a big caller (a
# pytest worker of some GB) reports at least the caller's RSS. This small interpreter is
# what the measured command is forked from.
_MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""


def run_measured(args: Sequence[str], timeout: float) -> Measured:
    """Run ``args`` to its end, with its own peak RSS (wait4's ru_maxrss, exact however
    short-lived it was). Blocking: call it in a thread from asyncio code. Killed (with its
    process group) past ``timeout``."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err, rss = (Path(tmp) / n for n in ("out", "err", "rss"))
        started = time.monotonic()
        with out.open("wb") as o, err.open("wb") as e:
            proc = subprocess.Popen([sys.executable, "-c", _MEASURE, str(rss), *args],
                                    stdout=o, stderr=e, start_new_session=True)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        wall = time.monotonic() - started
        return Measured(code, out.read_text(), err.read_text(), wall,
                        int(rss.read_text()) * 1024)  # kilobytes on Linux
