"""What a process on this machine has cost so far, from /proc (Linux): the CPU a benchmark
divides by the bytes it delivered."""

from __future__ import annotations

import os

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
