"""Hosts on a network of their own: Linux network namespaces, veth pairs, tbf, and a UDP
impairment forwarder (``impair.py``), for the tests in this folder and ``python -m benchmarks
net``.

A :class:`Lab` is a hub namespace holding a bridge (198.18.0.1/24) and one namespace per host,
each joined to the bridge by a veth pair (198.18.0.2, .3, ...). Nothing is joined to the
machine's own interfaces, and only 198.18.0.0/15 addresses (RFC 2544's benchmarking range)
are used, so nothing leaves the lab. Names are ``kvcst-<pid>-<n>-<role>``: several runs (or
other helpers' test sessions) can build labs at once, and :func:`sweep_stale` removes only
labs whose creating process is gone. Delay, loss, reordering and duplication come from an
``impair.py`` forwarder running in the hub and listening on 198.18.0.1: a peer that dials the
forwarder's port reaches the target through it (the kernel here has no netem). Rate limits:
``tbf`` on both ends of a host's veth. A link cut: the hub's end of the veth down, then up.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and ``ip`` with ``netns``: :func:`unavailable`
says why not, for a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from impair import Impairment

PREFIX = "kvcst-"
HUB_IP = "198.18.0.1"
ROOT = Path(__file__).resolve().parents[2]
IMPAIR = Path(__file__).resolve().parent / "impair.py"
KVCS = [sys.executable, "-m", "relay.cli"]
TIMEOUT = 60.0  # bound on every wait for a process line
_counter = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=check)


def unavailable() -> str | None:
    """Why this machine cannot build a lab, or None."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, tbf); CI runs these as root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_names() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _delete_ns(name: str) -> None:
    """Kill what still runs in ``name`` (only our own processes run there) and delete it."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", name, check=False)


def sweep_stale() -> list[str]:
    """Delete the labs of test runs that died without cleaning up (their creator's pid is
    gone); never another live run's."""
    gone = []
    for name in _netns_names():
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _delete_ns(name)
            gone.append(name)
    return gone


@dataclass
class Host:
    name: str  # role, e.g. "origin"
    ns: str
    ip: str
    hub_if: str  # its veth's end in the hub (cut / restore / counters there)


@dataclass
class Proc:
    """A process started in a lab namespace; its stderr is drained into ``log``."""

    proc: asyncio.subprocess.Process
    what: str
    log: list[bytes] = field(default_factory=list)
    drain: asyncio.Task[None] | None = None

    def text(self) -> str:
        return b"".join(self.log).decode(errors="replace")


class Lab:
    """One star network: a hub namespace (bridge) and hosts. Use as an async context manager
    or call :meth:`close` (also after failures: it kills every process it started and
    deletes every namespace it made)."""

    def __init__(self, workdir: Path) -> None:
        self.tag = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.workdir = workdir
        self.hub = f"{self.tag}-hub"
        self.hosts: dict[str, Host] = {}
        self.procs: list[Proc] = []
        self._made: list[str] = []
        self._certs: tuple[Path, Path] | None = None
        try:
            self._add_ns(self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge", "forward_delay", "0")
            _ip("-n", self.hub, "addr", "add", f"{HUB_IP}/24", "dev", "br0")
            _ip("-n", self.hub, "link", "set", "br0", "up")
        except BaseException:
            for name in self._made:
                _delete_ns(name)
            raise

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    async def __aenter__(self) -> Lab:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def add_host(self, name: str, *, rate_mbit: float | None = None) -> Host:
        """A host joined to the hub; ``rate_mbit``: tbf in both directions of its link."""
        n = len(self.hosts) + 2
        host = Host(name, f"{self.tag}-{name}", f"198.18.0.{n}", f"v{n}")
        self._add_ns(host.ns)
        _ip("link", "add", "eth0", "netns", host.ns, "type", "veth", "peer", "name",
            host.hub_if, "netns", self.hub)
        _ip("-n", self.hub, "link", "set", host.hub_if, "master", "br0")
        _ip("-n", self.hub, "link", "set", host.hub_if, "up")
        _ip("-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", host.ns, "link", "set", "eth0", "up")
        if rate_mbit is not None:
            for ns, dev in ((host.ns, "eth0"), (self.hub, host.hub_if)):
                subprocess.run(
                    ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                     f"{rate_mbit}mbit", "burst", "256kb", "latency", "100ms"],
                    check=True, capture_output=True, timeout=30)
        self.hosts[name] = host
        return host

    def certs(self) -> tuple[Path, Path]:
        """One self-signed certificate for every relay of the lab, naming every lab address
        (a peer may dial a relay directly or through the forwarder on the hub)."""
        if self._certs is None:
            from relay.transport import ensure_self_signed

            addrs = tuple(f"198.18.0.{i}" for i in range(1, 40))
            paths = ensure_self_signed(self.workdir / "lab-tls", addresses=addrs)
            self._certs = (Path(paths.certfile), Path(paths.keyfile))
        return self._certs

    # -- links ---------------------------------------------------------------------------

    def cut(self, host: Host) -> None:
        _ip("-n", self.hub, "link", "set", host.hub_if, "down")

    def restore(self, host: Host) -> None:
        _ip("-n", self.hub, "link", "set", host.hub_if, "up")

    def _hub_counter(self, host: Host, direction: str) -> int:
        out = _ip("-n", self.hub, "-s", "-j", "link", "show", host.hub_if).stdout
        return int(json.loads(out)[0]["stats64"][direction]["bytes"])

    def sent_to_hub(self, host: Host) -> int:
        """Bytes ``host`` has sent over its link (the hub end's receive counter)."""
        return self._hub_counter(host, "rx")

    def received_from_hub(self, host: Host) -> int:
        """Bytes sent to ``host`` over its link (the hub end's transmit counter)."""
        return self._hub_counter(host, "tx")

    # -- processes -----------------------------------------------------------------------

    async def spawn(self, where: Host | str, *argv: str, what: str,
                    stdout: bool = False, env: dict[str, str] | None = None) -> Proc:
        """``argv`` in ``where``'s namespace (a Host or the hub's name)."""
        ns = where.ns if isinstance(where, Host) else where
        full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", ns, *argv, env=full_env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE if stdout else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, limit=1 << 24)
        p = Proc(proc, what)
        self.procs.append(p)
        return p

    def _drain(self, p: Proc) -> None:
        async def drain() -> None:
            assert p.proc.stderr is not None
            while chunk := await p.proc.stderr.read(65536):
                p.log.append(chunk)

        p.drain = asyncio.ensure_future(drain())

    async def wait_line(self, p: Proc, needle: bytes, timeout: float = TIMEOUT) -> bytes:
        """Read ``p``'s stderr up to a line holding ``needle`` (then keep draining it)."""
        assert p.proc.stderr is not None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    line = await p.proc.stderr.readline()
                    p.log.append(line)
                    if not line:
                        raise RuntimeError(f"{p.what} exited before {needle!r}:\n{p.text()}")
                    if needle in line:
                        break
        except TimeoutError:
            raise RuntimeError(f"{p.what}: no {needle!r} within {timeout:g} s:\n"
                               f"{p.text()}") from None
        self._drain(p)
        return line

    async def relay(self, host: Host, *extra: str, upstream: str | None = None,
                    backend: str | None = None, port: int = 4433) -> str:
        """``kvcs relay`` on ``host`` until the lab closes; returns its URL."""
        cert, key = self.certs()
        data = self.workdir / f"data-{host.name}-{port}"
        up = ("--upstream", upstream, "--upstream-ca", str(cert)) if upstream else ()
        be = ("--quic-backend", backend) if backend else ()
        p = await self.spawn(host, *KVCS, "relay", "--listen", f"{host.ip}:{port}",
                             "--data-dir", str(data), "--cert", str(cert), "--key", str(key),
                             "--metrics-listen", "off", *be, *up, *extra,
                             what=f"relay on {host.name}")
        await self.wait_line(p, b"relay ready")
        return f"moqt://{host.ip}:{port}/"

    async def forwarder(self, target: str, imp: Impairment, port: int = 0) -> str:
        """An impairment forwarder on the hub towards ``target`` (a moqt:// URL or
        HOST:PORT); returns the URL (or HOST:PORT) to dial instead."""
        url = target.startswith("moqt://")
        hostport = target.removeprefix("moqt://").rstrip("/") if url else target
        p = await self.spawn(self.hub, sys.executable, str(IMPAIR), "--listen",
                             f"{HUB_IP}:{port}", "--to", hostport, *imp.argv(),
                             what=f"forwarder to {hostport}", stdout=True)
        assert p.proc.stdout is not None
        async with asyncio.timeout(TIMEOUT):
            line = await p.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the forwarder did not start: {await p.proc.stderr.read()!r}"
                               if p.proc.stderr else "the forwarder did not start")
        self._drain(p)
        listen = json.loads(line)["ready"]
        return f"moqt://{listen}/" if url else listen

    async def forwarder_stats(self) -> list[dict[str, Any]]:
        """Stop every running forwarder of the lab; the counters each printed on its way
        out (per direction: in, sent, lost, reordered, duplicated, overflow)."""
        stats = []
        for p in self.procs:
            if p.what.startswith("forwarder") and p.proc.returncode is None:
                assert p.proc.stdout is not None and p.proc.stdin is not None
                p.proc.stdin.close()
                async with asyncio.timeout(10):
                    line = await p.proc.stdout.readline()
                stats.append(json.loads(line)["stats"])
                await self.stop(p)
        return stats

    async def run(self, where: Host, *argv: str, timeout: float,
                  env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of ``argv`` in ``where``; killed past ``timeout``
        (then TimeoutError: a hang is a failure, never waited out)."""
        p = await self.spawn(where, *argv, what=argv[0], stdout=True, env=env)
        assert p.proc.stdin is not None
        p.proc.stdin.close()
        try:
            out, err = await asyncio.wait_for(p.proc.communicate(), timeout)
        except TimeoutError:
            p.proc.kill()
            await p.proc.wait()
            raise
        assert p.proc.returncode is not None
        return p.proc.returncode, out.decode(), err.decode()

    async def kvcs(self, where: Host, *args: str, timeout: float,
                   backend: str | None = None) -> tuple[int, str, str]:
        env = {"KVCS_QUIC_BACKEND": backend} if backend else None
        return await self.run(where, *KVCS, *args, timeout=timeout, env=env)

    async def stop(self, p: Proc, timeout: float = 10.0) -> None:
        """Close ``p``'s stdin (forwarders stop on it), SIGTERM, then SIGKILL."""
        if p.proc.returncode is None:
            if p.proc.stdin is not None and not p.proc.stdin.is_closing():
                p.proc.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                p.proc.terminate()
            try:
                await asyncio.wait_for(p.proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.proc.kill()
                await p.proc.wait()
        if p.drain is not None:
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(p.drain, 2)

    async def close(self) -> None:
        for p in reversed(self.procs):
            with contextlib.suppress(Exception):
                await self.stop(p)
        self.procs.clear()
        for name in reversed(self._made):
            _delete_ns(name)  # with the namespace go its veths, bridge and qdiscs
        self._made.clear()

    def settings(self) -> dict[str, Any]:
        return {"hosts": {h.name: h.ip for h in self.hosts.values()}, "hub": HUB_IP}
