"""``kvcs relay --workers N``: N relay processes behind one UDP port, one relay to the outside.

The supervisor (this module, the process the operator started) runs no relay itself. It
prepares what the workers share (the TLS certificate, the LMDB environment, the port), starts
N workers (``kvcs relay`` again, told their index, the run directory and the siblings' secret
through the environment), and then:

* serves ``/metrics`` (every worker's, summed by name and labels; ``kvcs_relay_workers_up``
  counts the workers answering), ``/healthz`` (every worker alive) and ``/readyz`` (every
  worker ready) on the configured metrics listener; ``/workers`` lists them (JSON); that
  listener is relay/workers_front.py;
* restarts a worker that dies (its siblings and their sessions go on; what it had committed
  to LMDB is there for the new one);
* on SIGTERM/SIGINT passes the signal on (each worker drains: GOAWAY, fills, FETCHes,
  commits) and exits 0 once every worker has.

A worker never outlives its supervisor: a supervisor that dies without passing a signal on
(SIGKILL, the OOM killer, a crash) would otherwise leave its workers serving the port with
nobody to restart, aggregate or stop them. Each worker asks the kernel for SIGTERM when its
parent dies (``PR_SET_PDEATHSIG``, Linux) and, where that is not available, watches a pipe
whose write end only the supervisor holds (``follow_supervisor``).

How the workers find each other and share Tracks: ``relay/core/siblings.py``; the design and
its limits: ``docs/workers.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.core.loops import new_relay_id
from relay.core.siblings import read_worker_files
from relay.options import RelayConfig
from relay.transport import ensure_self_signed
from relay.transport.burst import make_socket
from relay.workers_front import Front

log = logging.getLogger("kvcs.relay")

RESTART_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)  # seconds before restarts in a row
_READY_AGAIN_TIMEOUT = 60.0  # a restarted worker not ready by then is left to its own exit
_READY_POLL = 0.05  # the ready file is written by the worker: no event to wait for


def worker_sockets(host: str, port: int, n: int) -> list[socket.socket]:
    """``n`` UDP sockets on one port (SO_REUSEPORT; port 0: a free one), one per worker.

    The supervisor keeps them open for the relay's whole life and hands worker i socket i:
    the kernel picks a socket by a hash of the client's address modulo the sockets in the
    group, so a group that never changes size keeps every client on its worker even while
    another worker restarts (a worker that made its own socket would reshuffle everyone).
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            # each worker sizes its buffers for its QUIC backend (relay/transport/server.py)
            s = make_socket(host, port, reuse_port=True, large_buffers=False)
            socks.append(s)
            port = s.getsockname()[1]
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _arm_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``). False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_pipe(fd: int, on_closed: Callable[[], None]) -> threading.Thread:
    """A daemon thread that calls ``on_closed`` once ``fd`` reads end of file: every copy of
    the pipe's write end is closed, which the kernel does for a process that dies."""
    def watch() -> None:
        try:
            while os.read(fd, 64):
                pass  # the supervisor never writes; read on until the end
        except OSError:
            pass  # closed under us: treated as the end too
        on_closed()

    t = threading.Thread(target=watch, name="supervisor-watch", daemon=True)
    t.start()
    return t


def follow_supervisor(supervisor_pid: int, pipe_fd: int | None) -> bool:
    """In a worker, at start: end this process (SIGTERM: the usual drain) when the supervisor
    dies, whichever way it dies. False if the supervisor is already gone (the caller exits).

    ``PR_SET_PDEATHSIG`` is the first means; the pipe (its write end held by the supervisor
    alone, ``pipe_fd`` its read end) is the fallback where the prctl is not available. Only
    one of them signals, so the worker drains once rather than having a second signal cut
    its drain short.
    """
    armed = _arm_parent_death_signal(signal.SIGTERM)
    # the supervisor may have died between our fork and the prctl: then no signal will come
    if os.getppid() != supervisor_pid:
        return False
    if pipe_fd is not None:
        if armed:  # the kernel signals us; the pipe need not be watched, nor kept
            os.close(pipe_fd)
        else:
            _watch_pipe(pipe_fd, lambda: os.kill(os.getpid(), signal.SIGTERM))
    return True


@dataclass
class _Worker:
    index: int
    proc: asyncio.subprocess.Process | None = None
    # write end of the pipe whose end of file tells the worker its supervisor is gone
    pipe: int | None = None
    restarts: int = 0
    failures_in_a_row: int = 0
    waiter: asyncio.Task[int] | None = field(default=None, repr=False)


class Supervisor:
    def __init__(self, config: RelayConfig, workers: int, env: dict[str, str]) -> None:
        self.config = config
        self.n = workers
        self.env = env  # the relay's own settings, as KVCS_RELAY_* variables
        self.run_dir = Path(tempfile.mkdtemp(prefix="kvcs-relay-workers-"))
        self.secret = secrets.token_hex(24)
        self.port = 0
        self.relay_id = ""
        self.sockets: list[socket.socket] = []
        self.workers = [_Worker(i) for i in range(workers)]
        self.stopping = False
        self._http: Front | None = None  # the one /metrics, /healthz, /readyz, /admin/
        self._tasks: set[asyncio.Future[None]] = set()

    # -- workers ----------------------------------------------------------------------------

    def _prepare(self) -> None:
        """What the workers would otherwise race to create."""
        data = Path(self.config.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        if self.config.cert is None or self.config.key is None:
            ensure_self_signed(data / "tls")
        ensure_self_signed(self.run_dir / "tls")  # the siblings' own listener
        from storage.lmdb_store import LmdbStore

        LmdbStore(os.fspath(data / "lmdb"), self.config.lmdb_bytes).close()
        self.sockets = worker_sockets(self.config.listen_host, self.config.listen_port, self.n)
        self.port = self.sockets[0].getsockname()[1]
        # the workers are one relay: a loop probe passing two of them is seen coming back
        self.relay_id = new_relay_id(self.port)

    def _ready_path(self, index: int) -> Path:
        return self.run_dir / f"worker-{index}.json"

    async def _spawn(self, w: _Worker) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._ready_path(w.index).unlink()
        self._close_pipe(w)
        # os.pipe() is not inheritable: only this worker gets the read end (pass_fds), and no
        # other child ever holds a copy of the write end that would keep the pipe open
        read_end, w.pipe = os.pipe()
        env = {**os.environ, **self.env,
               "KVCS_WORKER_INDEX": str(w.index), "KVCS_WORKER_DIR": str(self.run_dir),
               "KVCS_WORKER_SECRET": self.secret, "KVCS_WORKER_RELAY_ID": self.relay_id,
               "KVCS_WORKER_FD": str(self.sockets[w.index].fileno()),
               "KVCS_WORKER_SUPERVISOR": str(os.getpid()),
               "KVCS_WORKER_PIPE": str(read_end)}
        host = self.config.listen_host
        listen = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        try:
            w.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "relay.cli", "relay", "--workers", "1", "--listen",
                listen, "--metrics-listen", "127.0.0.1:0",
                "--ready-file", str(self._ready_path(w.index)),
                env=env, pass_fds=(self.sockets[w.index].fileno(), read_end))
        finally:
            os.close(read_end)  # the worker has its copy; ours would hide its EOF from it
        w.waiter = asyncio.ensure_future(w.proc.wait())
        log.info("worker %d started (pid %d)", w.index, w.proc.pid)

    @staticmethod
    def _close_pipe(w: _Worker) -> None:
        if w.pipe is not None:
            os.close(w.pipe)
            w.pipe = None

    def infos(self) -> dict[int, dict[str, Any]]:
        infos = read_worker_files(self.run_dir)
        alive = {w.index: w.proc.pid for w in self.workers
                 if w.proc is not None and w.proc.returncode is None}
        return {i: info for i, info in infos.items() if alive.get(i) == info.get("pid")}

    async def _wait_ready(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.infos()) < self.n:
            if loop.time() > deadline or any(
                    w.proc is not None and w.proc.returncode is not None for w in self.workers):
                return False
            await asyncio.sleep(0.05)
        return True

    async def run(self) -> int:
        self._prepare()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            for w in self.workers:
                await self._spawn(w)
            if not await self._wait_ready(60.0):
                log.error("workers did not all start")
                await self._stop_all()
                return 1
            if self.config.metrics_listen is not None:
                self._http = Front(self, self.config.admin_token)
                await self._http.start(*self.config.metrics_listen)
            self._write_ready_file()
            mhost, mport = self._metrics_address()
            log.info("relay ready on moqt://%s:%d/ with %d workers (pids %s) metrics=%s",
                     self.config.listen_host, self.port, self.n,
                     ",".join(str(w.proc.pid) for w in self.workers if w.proc),
                     f"{mhost}:{mport}" if mport else "off")
            await self._supervise(stop)
            return await self._stop_all()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            if self._http is not None:
                await self._http.close()
            for sock in self.sockets:
                sock.close()
            for w in self.workers:
                self._close_pipe(w)
            shutil.rmtree(self.run_dir, ignore_errors=True)

    async def _supervise(self, stop: asyncio.Event) -> None:
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while True:
                waiters = {w.waiter: w for w in self.workers if w.waiter is not None}
                done, _ = await asyncio.wait({stopped, *waiters},
                                             return_when=asyncio.FIRST_COMPLETED)
                if stopped in done:
                    return
                for fut in done:
                    w = waiters[fut]  # type: ignore[index]
                    code = fut.result()
                    w.failures_in_a_row += 1
                    delay = RESTART_BACKOFF[min(w.failures_in_a_row, len(RESTART_BACKOFF)) - 1]
                    log.warning("worker %d (pid %d) exited with %s; restarting in %.1f s",
                                w.index, w.proc.pid if w.proc else -1, code, delay)
                    w.waiter = None
                    self._close_pipe(w)
                    await asyncio.sleep(delay)
                    w.restarts += 1
                    await self._spawn(w)
                    task = asyncio.ensure_future(self._note_ready(w))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        finally:
            stopped.cancel()

    async def _note_ready(self, w: _Worker) -> None:
        """Once a restarted worker is ready, the ready file names its new pid."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READY_AGAIN_TIMEOUT
        while loop.time() < deadline:
            if w.index in self.infos():
                w.failures_in_a_row = 0
                self._write_ready_file()
                log.info("worker %d ready again (pid %d)", w.index, w.proc.pid if w.proc else -1)
                return
            await asyncio.sleep(_READY_POLL)

    async def _stop_all(self) -> int:
        self.stopping = True
        procs = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        codes = []
        for p in procs:
            try:
                codes.append(await asyncio.wait_for(p.wait(), self.config.drain_timeout + 10))
            except TimeoutError:
                p.kill()
                codes.append(await p.wait())
        log.info("relay stopped (%d workers)", len(procs))
        return 0 if all(c == 0 for c in codes) else 1

    def _write_ready_file(self) -> None:
        if self.config.ready_file is None:
            return
        _, mport = self._metrics_address()
        info = {"port": self.port, "metrics_port": mport, "pid": os.getpid(),
                "workers": self.workers_json()}
        path = Path(self.config.ready_file)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(path)

    def _metrics_address(self) -> tuple[str, int | None]:
        if self._http is None:
            return "", None
        return self._http.address

    def workers_json(self) -> list[dict[str, Any]]:
        infos = self.infos()
        return [{"index": w.index, "pid": w.proc.pid if w.proc else None,
                 "alive": w.proc is not None and w.proc.returncode is None,
                 "restarts": w.restarts,
                 "metrics_port": infos.get(w.index, {}).get("metrics_port")}
                for w in self.workers]



async def supervise(config: RelayConfig, workers: int, env: dict[str, str]) -> int:
    return await Supervisor(config, workers, env).run()
