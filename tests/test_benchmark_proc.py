"""benchmarks/_proc.py: the CPU figure bench_relay divides by delivered bytes."""

from __future__ import annotations

import os
import time

from benchmarks._proc import cpu_per_gb, cpu_seconds


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
