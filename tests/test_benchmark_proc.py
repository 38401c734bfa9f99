"""benchmarks/_proc.py: the CPU figure bench_relay divides by delivered bytes, and a command's
peak RSS (bench_kvcs, tests/peers/test_peers_memory.py)."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from benchmarks._proc import cpu_per_gb, cpu_seconds, peak_rss, run_measured


def test_cpu_seconds_follows_this_process_cpu_time() -> None:
    before, ours = cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - ours < 0.05:  # burn 50 ms of CPU
        sum(range(1000))
    spent = time.process_time() - ours
    got = cpu_seconds(os.getpid()) - before
    # /proc counts in clock ticks (10 ms): within two ticks of what Python measured
    assert abs(got - spent) <= 0.02 + 2 / os.sysconf("SC_CLK_TCK"), (got, spent)


def test_cpu_per_gb() -> None:
    assert cpu_per_gb(3.0, 2_000_000_000) == 1.5


def test_run_measured_reports_the_commands_own_peak_not_its_callers() -> None:
    caller = np.ones(200 << 20, np.uint8)  # this process holds 200 MiB while it forks
    m = run_measured([sys.executable, "-c", "import sys; b = bytearray(32 << 20); "
                      "sys.stdout.write('ok'); sys.exit(5)"], 30)
    assert (m.returncode, m.stdout) == (5, "ok")
    assert 32 << 20 <= m.peak_rss < 150 << 20, m.peak_rss  # its 32 MiB, not our 200
    assert peak_rss(os.getpid()) >= caller.nbytes
