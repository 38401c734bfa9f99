"""``kvcs relay --workers N``: N relay processes behind one UDP port, one relay to the outside.

The supervisor (this module, the process the operator started) runs no relay itself. It
prepares what the workers share (the TLS certificate, the LMDB environment, the port), starts
N workers (``kvcs relay`` again, told their index, the run directory and the siblings' secret
through the environment), and then:

* serves ``/metrics`` (every worker's, summed by name and labels; ``kvcs_relay_workers_up``
  counts the workers answering), ``/healthz`` (every worker alive) and ``/readyz`` (every
  worker ready) on the configured metrics listener; ``/workers`` lists them (JSON);
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

from relay.admin import PREFIX as ADMIN_PREFIX
from relay.admin import SIBLING_ROUTES, AdminAuth
from relay.core.loops import new_relay_id
from relay.core.siblings import read_worker_files
from relay.http import Answer, Listener, read_body, request, text
from relay.logs import reason_of
from relay.merge import merge_admin_purge, merge_admin_state, merge_metrics
from relay.metrics import admin_unauthorized_metric
from relay.options import RelayConfig
from relay.transport import ensure_self_signed
from relay.transport.burst import make_socket

log = logging.getLogger("kvcs.relay")

RESTART_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)  # seconds before restarts in a row
_SCRAPE_TIMEOUT = 3.0
_ADMIN_TIMEOUT = 30.0  # a worker's purge may wait for its LMDB writer
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
        self._http: Listener | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        # /admin/ requests are refused here, before reaching any worker, when they lack the
        # token; counted into kvcs_relay_admin_unauthorized_total with the workers' own
        self._auth = AdminAuth(config.admin_token) if config.admin_token else None
        self.admin_unauthorized = 0

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

    def _infos(self) -> dict[int, dict[str, Any]]:
        infos = read_worker_files(self.run_dir)
        alive = {w.index: w.proc.pid for w in self.workers
                 if w.proc is not None and w.proc.returncode is None}
        return {i: info for i, info in infos.items() if alive.get(i) == info.get("pid")}

    async def _wait_ready(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self._infos()) < self.n:
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
                self._http = Listener(self._route, "supervisor's listener",
                                      self._head_too_large)
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
            if w.index in self._infos():
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
                "workers": self._workers_json()}
        path = Path(self.config.ready_file)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(path)

    def _metrics_address(self) -> tuple[str, int | None]:
        if self._http is None:
            return "", None
        return self._http.address

    def _workers_json(self) -> list[dict[str, Any]]:
        infos = self._infos()
        return [{"index": w.index, "pid": w.proc.pid if w.proc else None,
                 "alive": w.proc is not None and w.proc.returncode is None,
                 "restarts": w.restarts,
                 "metrics_port": infos.get(w.index, {}).get("metrics_port")}
                for w in self.workers]

    # -- the one /metrics, /healthz, /readyz, /workers ----------------------------------------

    async def _get(self, port: int, path: str) -> tuple[int, str]:
        status, body = await request(port, "GET", path, timeout=_SCRAPE_TIMEOUT)
        return status, body.decode("utf-8", "replace")

    async def _scrape_all(self, path: str) -> list[tuple[int, str] | None]:
        infos = self._infos()

        async def one(w: _Worker) -> tuple[int, str] | None:
            port = infos.get(w.index, {}).get("metrics_port")
            if port is None:
                return None
            try:
                return await self._get(int(port), path)
            except (OSError, TimeoutError, ValueError, IndexError):
                return None

        return list(await asyncio.gather(*(one(w) for w in self.workers)))

    async def metrics_text(self) -> str:
        answers = await self._scrape_all("/metrics")
        ok = [a[1] for a in answers if a is not None and a[0] == 200]
        return merge_metrics(ok, [admin_unauthorized_metric(self.admin_unauthorized)],
                             up=len(ok))

    def _head_too_large(self, method: str, path: str) -> None:
        if self._auth is not None and path.startswith(ADMIN_PREFIX):
            self._refused(method, path, "request head too large")

    def _refused(self, method: str, path: str, why: str) -> None:
        self.admin_unauthorized += 1
        log.warning("admin request refused: %s (%s %s)", why, method[:16], path[:64])

    async def _route(self, method: str, path: str, headers: dict[str, str],
                     reader: asyncio.StreamReader) -> Answer:
        if path.startswith(ADMIN_PREFIX):
            if self._auth is None:  # off: as if it did not exist, as on a single relay
                return text(404, "not found")
            # the token first, from the headers alone, as a single relay does
            if not self._auth.authorized(headers):
                self._refused(method, path, "missing or wrong token")
                return text(401, "unauthorized")
            return await self._admin(method, path, headers, await read_body(headers, reader))
        if not path or method not in ("GET", "HEAD"):
            return text(405, "method not allowed")
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", \
                (await self.metrics_text()).encode()
        if path in ("/healthz", "/readyz"):
            answers = await self._scrape_all(path)
            bad = [f"worker {i}: {'down' if a is None else a[1].strip()}"
                   for i, a in enumerate(answers) if a is None or a[0] != 200]
            if self.stopping:
                bad.append("stopping")
            if bad:
                return text(503, "\n".join(bad))
            # the same words as a single relay's listener (relay/metrics.py)
            return text(200, "ok" if path == "/healthz" else "ready")
        if path == "/workers":
            return 200, "application/json", (json.dumps(self._workers_json()) + "\n").encode()
        return text(404, "not found")

    async def _admin(self, method: str, path: str, headers: dict[str, str], body: bytes
                     ) -> Answer:
        """One admin surface: the request goes to every worker (in index order, so a purge
        reaches them all), and their answers are merged; any worker's refusal is the
        answer (they share one configuration, so they refuse alike).

        A purge is answered once every worker has purged *and* has forgotten its routes to
        siblings for the namespaces the purge withdrew (``SIBLING_ROUTES``): only then does
        a FETCH of a purged Track get DOES_NOT_EXIST on every worker."""
        infos = self._infos()
        if len(infos) < self.n:
            return text(503, "a worker is restarting")
        passed = {k: v for k, v in headers.items() if k in ("authorization", "content-type")}
        answers = await self._on_every_worker(infos, method, path, passed, body)
        if isinstance(answers, tuple):
            return answers
        if path == SIBLING_ROUTES:  # not ours to send, but harmless: merged as the others
            merged = {"routes_removed": sum(a["routes_removed"] for a in answers),
                      "namespaces_done": sorted({ns for a in answers
                                                 for ns in a["namespaces_done"]})}
        elif path.endswith("/state"):
            merged = merge_admin_state(answers)
        else:
            merged = merge_admin_purge(answers)
            if merged["namespaces_done"]:
                routes = await self._on_every_worker(
                    infos, "POST", SIBLING_ROUTES, passed,
                    json.dumps({"namespaces": merged["namespaces_done"]}).encode())
                if isinstance(routes, tuple):
                    return routes
        return 200, "application/json", (json.dumps(merged, indent=1) + "\n").encode()

    async def _on_every_worker(self, infos: dict[int, dict[str, Any]], method: str,
                               path: str, headers: dict[str, str], body: bytes
                               ) -> list[dict[str, Any]] | Answer:
        """Each worker's JSON answer, in index order; or the answer to give instead (the
        first refusal, or 502 for a worker that did not answer)."""
        answers = []
        for i in sorted(infos):
            try:
                code, data = await request(int(infos[i]["metrics_port"]), method, path,
                                           headers=headers, body=body,
                                           timeout=_ADMIN_TIMEOUT)
                if code != 200:
                    return code, "text/plain; charset=utf-8", data
                answers.append(json.loads(data))
            except (OSError, TimeoutError, ValueError) as e:
                log.warning("admin %s %s: worker %d did not answer: %s", method, path, i,
                            reason_of(e))
                return text(502, f"worker {i} did not answer")
        return answers


async def supervise(config: RelayConfig, workers: int, env: dict[str, str]) -> int:
    return await Supervisor(config, workers, env).run()
