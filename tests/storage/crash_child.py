"""Child process for test_storage_crash.py: commits tracks forever, printing progress lines.

usage: crash_child.py DIR FIRST_INDEX CAPACITY
Prints "C <i>" after track i is committed and "D <i>" after track i is deleted.
"""

from __future__ import annotations

import sys

from storage_helpers import crash_track, track_key

from storage.interface import Location
from storage.lmdb_store import LmdbStore


def main() -> None:
    path, first, capacity = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = LmdbStore(path, capacity=capacity)
    print("R", flush=True)
    i = first
    while True:
        store.commit_track(track_key(i), crash_track(i))
        print(f"C {i}", flush=True)
        if i % 5 == 0 and i - 3 >= first:  # deletions the parent can predict
            store.delete_track(track_key(i - 3))
            print(f"D {i - 3}", flush=True)
        if i % 3 == 0:  # reads move the LRU order; flush it sometimes
            with store.session() as s:
                sum(1 for _ in s.read(track_key(i - 1), Location(0, 0)))
            store.flush_usage()
        i += 1


if __name__ == "__main__":
    main()
