"""glibc's malloc set for a relay's allocations: large buffers, freed and made again.

A relay allocates and frees buffers of hundreds of KiB to tens of MiB all the time: a received
Object joined from its packets, a Track's LMDB commit (LMDB mallocs every dirty page of the
transaction, Objects included, and frees them after the write). glibc's defaults serve each
of these from a fresh ``mmap`` (up to a threshold that only grows as such blocks are freed)
or hand a heap's freed top back to the kernel (above 128 KiB, twice the threshold later), so
the next buffer faults in zeroed pages again. On the VMs we measured on a first-touched page
is dear (their host takes free memory back): over 540 MiB of LMCache puts the relay's LMDB
writer thread faulted 138,600 pages in 0.94-1.36 s of system time with the defaults, 3,200
in 0.59-0.69 s with the settings below, and the puts went from 182-210 to 231-251 MiB/s
(docs/performance.md, "The relay's heap").

The settings: blocks below ``MMAP_THRESHOLD`` come from malloc's heaps, and a heap keeps up
to ``TRIM_THRESHOLD`` of freed memory at its top for the next allocation. The cost is that
much memory held per malloc arena (one per thread that allocates, at most 8 per core) when
the relay is idle after a burst. An operator who sets ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` (glibc's own variables, read at start) keeps their values: the
relay then sets nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): a commit's values
# of up to this size come from a heap
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
OPERATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune_malloc() -> str:
    """Set the thresholds above in this process; says what was done, for the ready line:
    ``tuned``, ``operator`` (the operator's variables are set) or ``default`` (not glibc)."""
    if any(v in os.environ for v in OPERATOR_VARIABLES):
        return "operator"
    if not sys.platform.startswith("linux"):
        return "default"
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "default"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    return "tuned" if ok else "default"
