"""Suite-wide: the QUIC backend matrix (tests/backends.py), a fresh folder for the
transformers engine's converted weights, which tests stay together in one pytest-xdist
worker (docs/testing.md), and no test binding a relay's default port (tests/port_guard.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import port_guard
import pytest
from backends import ALL, SAME, use_backends

# Folders whose every test runs once per backend pair (server side, client side): mixed
# pairs where the transport and the session meet the other library, and for the relay core
# in the modules where its sessions (clients, publishers, an upstream relay) do; the rest
# of the core on each backend alone, to keep the suite within CI's budget.
_SUITES = {"transport": ALL, "session": ALL, "core": SAME, "ops": SAME, "interop": SAME,
           "e2e": SAME}
_MODULES = {"test_relay_basic.py": ALL, "test_relay_tree_and_discovery.py": ALL,
            # the controllers are aioquic's (qh3 has no choice): its pair alone
            "test_congestion.py": {"aioquic": SAME["aioquic"]},
            # a relay's ingest waits for its subscribers only on aioquic (docs/relay.md)
            "test_relay_overload.py": {"aioquic": SAME["aioquic"]},
            # the exposition format, not QUIC: one backend (a real Prometheus takes seconds)
            "test_ops_prometheus.py": {"aioquic": SAME["aioquic"]},
            # HTTP (admin API, /metrics, health) and configuration, not QUIC: one backend
            # (what an admin purge does to sessions is the core's, the same on both)
            "test_ops_admin.py": {"aioquic": SAME["aioquic"]},
            "test_ops_config.py": {"aioquic": SAME["aioquic"]},
            "test_ops_metrics.py": {"aioquic": SAME["aioquic"]},
            # malloc's settings in a child process: no QUIC at all
            "test_heap.py": {"aioquic": SAME["aioquic"]},
            # when LMDB is written, timed by the relay's traffic counters: not QUIC
            "test_relay_write_behind.py": {"aioquic": SAME["aioquic"]}}

# Folders whose tests all run in one xdist worker, one after another (`--dist loadgroup`,
# set in pyproject.toml; pytest_xdist_make_scheduler below): the model tests share the
# worker's loaded engines (one load of each model per run instead of one per worker), and
# tests/net's network namespaces are set up and torn down by one process at a time. The
# other worker goes on with the rest.
_GROUPS = {"model": "model", "lmcache": "model", "net": "net"}  # lmcache: the same engine
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pytest_configure(config: pytest.Config) -> None:
    port_guard.install()  # in every process that runs tests (each xdist worker too)
    # Every run converts the GGUF file once (the first in-process load) and the commands the
    # tests start read that copy: a user's own cache never stands in for the conversion.
    # xdist's workers inherit the folder the controlling process made (and removes).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    folder = tempfile.mkdtemp(prefix="kvcs-model-cache-")
    os.environ["KVCS_MODEL_CACHE"] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    workers = getattr(config.option, "numprocesses", None)  # xdist's -n (an int by now)
    if isinstance(workers, int) and workers > 1:
        # One BLAS/OpenMP thread per worker (and per command a test starts): the workers
        # already use the cores, and the pools' spinning threads on an oversubscribed
        # machine cost the model tests several times their CPU. Producer and consumer
        # still run with equal thread counts (the bit-equality tests need it).
        for name in _THREAD_VARS:
            os.environ.setdefault(name, "1")


def _under_tests(path: Path) -> tuple[str, ...]:
    """``path``'s parts below tests/ (a test module in a folder of tests/ has two or more)."""
    parts = path.parts
    return parts[parts.index("tests") + 1:] if "tests" in parts else ()


def _children() -> dict[int, str]:
    """This process's live child processes (pid -> command line), from /proc."""
    me, found = os.getpid(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == me and state != "Z":
            found[int(entry.name)] = cmd.strip()
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """No test leaves a process behind: a child of this (worker) process still running once
    every other fixture has finished fails the run (an error on the last test) and is
    killed."""
    yield
    if not Path("/proc").is_dir():
        return
    deadline = time.monotonic() + 5.0  # a process a teardown just signalled may be exiting
    while (left := _children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, "tests left processes running (killed now): " + "; ".join(
        f"{pid}: {cmd[:200]}" for pid, cmd in left.items())


@pytest.fixture(autouse=True)
def no_default_port() -> Iterator[None]:
    """A test that bound (or started a relay on) a relay's default port fails, also where
    the code under test caught the guard's error (tests/port_guard.py)."""
    port_guard.violations.clear()
    yield
    found, port_guard.violations[:] = list(port_guard.violations), []
    assert not found, "; ".join(found)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` whose groups are the folders of _GROUPS: each group is one unit of
    work for one worker, every other test a unit of its own. xdist_group marks alone group
    nothing here: pytest-xdist 3.8 tells its scheduler a marked test's group by renaming the
    test through an attribute that pytest 9 no longer reads."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FolderGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            rel = _under_tests(Path(nodeid.split("::", 1)[0]))
            group = _GROUPS.get(rel[0]) if len(rel) >= 2 else None
            return group if group is not None else super()._split_scope(nodeid)

    return FolderGroups(config, log)


def _pairs(path: Path) -> dict[str, tuple[str, str]] | None:
    rel = _under_tests(path)
    if len(rel) < 2:
        return None
    return _MODULES.get(rel[-1], _SUITES.get(rel[0]))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    pairs = _pairs(metafunc.definition.path)
    if pairs and "quic_backends" in metafunc.fixturenames:
        metafunc.parametrize("quic_backends", list(pairs), indirect=True)


@pytest.fixture(autouse=True)
def quic_backends(request: pytest.FixtureRequest,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[str | None]:
    """In-process relays and clients use the pair's backends; relay and peer processes
    started by a test inherit them through the environment."""
    name = getattr(request, "param", None)
    if name is None:
        yield None
        return
    server, client = ALL[name]
    monkeypatch.setenv("KVCS_RELAY_QUIC_BACKEND", server)
    monkeypatch.setenv("KVCS_QUIC_BACKEND", client)
    for _ in use_backends(server, client):
        yield name
