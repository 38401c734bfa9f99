"""The relay's malloc settings (relay/heap.py): freed buffers are kept for reuse, and an
operator's own glibc variables win. Each case runs in a child process: malloc's settings are
the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60

# A relay-like round: 30 buffers of 1 MiB made, written and freed (as an LMDB commit's dirty
# pages are), on a thread of its own; the minor page faults of each round are printed.
ROUNDS = r"""
import ctypes, json, resource, sys, threading
from relay.heap import tune_malloc
done = tune_malloc() if sys.argv[1] == "tune" else "untouched"
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
faults = []
def rounds():
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        blocks = [libc.malloc(1 << 20) for _ in range(30)]
        for b in blocks:
            ctypes.memset(b, 1, 1 << 20)
        for b in reversed(blocks):
            libc.free(b)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
t = threading.Thread(target=rounds)
t.start()
t.join()
print(json.dumps({"done": done, "faults": faults}))
"""

PAGES_PER_ROUND = 30 * (1 << 20) // 4096

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")


def _rounds(mode: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], cwd=ROOT, env={**clean, **env},
                         capture_output=True, text=True, timeout=TIMEOUT, check=True)
    return json.loads(out.stdout)


def test_a_tuned_heap_reuses_freed_buffers_instead_of_faulting_pages_in_again() -> None:
    tuned = _rounds("tune")
    assert tuned["done"] == "tuned"
    untouched = _rounds("none")
    # glibc's defaults hand the freed top of the heap back: every round faults its pages in
    later = untouched["faults"][1:]  # type: ignore[index]
    assert min(later) > PAGES_PER_ROUND // 2, untouched
    # tuned: after the first round, the same pages serve again
    assert max(tuned["faults"][1:]) < PAGES_PER_ROUND // 20, tuned  # type: ignore[index]


def test_the_operators_malloc_variables_win() -> None:
    got = _rounds("tune", MALLOC_TRIM_THRESHOLD_="131072")
    assert got["done"] == "operator"
    # the operator's small trim threshold holds: pages go back and fault in again
    assert min(got["faults"][1:]) > PAGES_PER_ROUND // 2, got  # type: ignore[index]
