"""Failure injection: SIGKILL a process committing tracks, many times; after each reopen every
track is whole and bit-identical, or absent (the LMDB tier's invariant)."""

from __future__ import annotations

import hashlib
import os
import random
import re
import subprocess
import sys
from pathlib import Path

from storage_helpers import crash_track, deleted_by_child, flat, track_key

from storage.interface import Location, StoredObject
from storage.lmdb_store import LmdbStore

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
_expected: dict[int, bytes] = {}


def _digest(objs: list[StoredObject]) -> bytes:
    h = hashlib.sha256()
    for o in objs:
        h.update(repr((o.group, o.subgroup, o.object_id, o.priority, int(o.status), o.datagram,
                       len(o.properties), len(o.payload))).encode())
        h.update(o.properties)
        h.update(o.payload)
    return h.digest()


def _expected_digest(i: int) -> bytes:
    if i not in _expected:
        _expected[i] = _digest(flat(crash_track(i)))
    return _expected[i]


def _verify(path: Path, capacity: int, committed: set[int], evicting: bool) -> int:
    store = LmdbStore(path, capacity=capacity)
    try:
        present = []
        with store.session() as s:
            for t in store.tracks():
                m = re.fullmatch(rb"track-(\d+)", t[1])
                assert m is not None, t
                i = int(m.group(1))
                got = _digest(list(s.read(t, Location(0, 0))))
                assert got == _expected_digest(i), f"track {i} is not bit-identical"
                present.append(i)
        stats = store.stats()
        assert stats["tracks"] == len(present)
        assert stats["groups"] == sum(len(crash_track(i)) for i in present)  # no stray Groups
        assert store.stats()["bytes_used"] == sum(store.info(track_key(i)).nbytes  # type: ignore[union-attr]
                                       for i in present)
        if not evicting:  # every reported commit survived (unless the child deleted it)
            missing = {i for i in committed if not deleted_by_child(i)} - set(present)
            assert not missing, f"committed tracks lost: {sorted(missing)}"
        return len(present)
    finally:
        store.close()


def _run_rounds(path: Path, rounds: int, capacity: int, evicting: bool, rng: random.Random
                ) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    committed: set[int] = set()
    kills = present = 0
    for rnd in range(rounds):
        first = (1000 if evicting else 0) * 1000 + rnd * 1000
        proc = subprocess.Popen([sys.executable, str(HERE / "crash_child.py"), str(path),
                                 str(first), str(capacity)],
                                stdout=subprocess.PIPE, env=env, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "R"  # store opened: now start the clock
        # Kill after a random number of progress lines, not after a delay: however slow the
        # machine, each kill lands while the child is committing (or evicting) the next one.
        seen = [proc.stdout.readline() for _ in range(rng.randint(0, 8))]
        proc.kill()
        proc.wait()
        # Every line printed before death is in the pipe: those commits finished.
        seen.extend(proc.stdout.read().splitlines())
        proc.stdout.close()
        assert proc.returncode != 0, "child exited on its own"
        for line in seen:
            if line.startswith("C "):
                committed.add(int(line[2:]))
        kills += 1
        present = _verify(path, capacity, committed, evicting)
    # what the test claims was exercised: commits that finished before a kill, and (small
    # capacity) evictions, some of them killed midway
    assert committed, "no commit finished before any kill"
    if evicting:
        assert len({i for i in committed if not deleted_by_child(i)}) > present, \
            "the capacity forced no eviction"
    return kills


def test_sigkill_during_commits_leaves_whole_tracks_or_nothing(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    kills = _run_rounds(tmp_path / "durable", 14, 1 << 30, False, rng)
    # Small capacity: kills also land inside evictions.
    kills += _run_rounds(tmp_path / "evicting", 12, 6 << 20, True, rng)
    assert kills == 14 + 12
