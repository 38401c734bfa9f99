"""Processes of the LMCache tests: a `kvcs relay` on 127.0.0.1 and the LMCache sides
(lmcache_side.py), each spoken to over pipes with a bound on every answer."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

SIDE = Path(__file__).with_name("lmcache_side.py")
ROOT = Path(__file__).resolve().parents[2]
MARK = "KVCS-SIDE "  # marks the sides' answers on stdout, where LMCache may log too


def _lines(stream: IO[str], out: queue.Queue[str | None]) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


class Child:
    """A process whose output lines are read by a thread, so a wait is a bounded get."""

    def __init__(self, args: list[str], *, stdout: bool) -> None:
        env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1",
               "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE if stdout else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
            stderr=subprocess.DEVNULL if stdout else subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        stream = self.proc.stdout if stdout else self.proc.stderr
        assert stream is not None
        threading.Thread(target=_lines, args=(stream, self.lines), daemon=True).start()

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        while True:
            line = self.lines.get(timeout=timeout)
            assert line is not None, f"{self.proc.args[:3]} exited ({self.proc.wait(5)})"
            m = re.search(pattern, line)
            if m:
                return m

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)


class Relay(Child):
    def __init__(self, data: Path, port: int = 0) -> None:
        super().__init__([sys.executable, "-m", "relay.cli", "relay", "--listen",
                          f"127.0.0.1:{port}", "--data-dir", str(data),
                          "--metrics-listen", "off"], stdout=False)
        self.data = data
        try:
            self.port = int(self.wait_for(r"relay ready on moqt://127\.0\.0\.1:(\d+)/", 30)[1])
        except BaseException:
            self.stop()  # never left running by a failed start
            raise

    @property
    def cert(self) -> Path:
        return self.data / "tls" / "cert.pem"


class Side(Child):
    """lmcache_side.py with ``engines`` (name -> connector extra_config)."""

    def __init__(self, chunk: int, engines: dict[str, dict[str, Any]]) -> None:
        setup = json.dumps({"chunk": chunk, "engines": engines})
        super().__init__([sys.executable, str(SIDE), setup], stdout=True)
        self.ready: dict[str, Any] = {}

    def started(self, timeout: float = 90) -> Side:
        """Waits for the side's first answer (its engines are up)."""
        self.ready = self.answer(timeout)
        return self

    def answer(self, timeout: float) -> dict[str, Any]:
        got: dict[str, Any] = json.loads(self.wait_for(f"^{MARK}(.*)$", timeout)[1])
        return got

    def ask(self, op: str, engine: str, tokens: list[int], *, decode: bool = False,
            timeout: float = 60, **more: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        cmd = {"op": op, "engine": engine, "tokens": tokens, "decode": decode, **more}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        super().stop(timeout)


def connector_config(relay: Relay | None, scope_key: Path, *, port: int | None = None,
                     cert: Path | None = None) -> dict[str, Any]:
    """The connector's extra_config for ``relay`` (or a port nobody serves)."""
    p = relay.port if relay is not None else port
    ca = relay.cert if relay is not None else cert
    return {"kvcs.url": f"kvcs://127.0.0.1:{p}/", "kvcs.ca_file": str(ca),
            "kvcs.scope_key_file": str(scope_key), "kvcs.timeout_s": 2}
