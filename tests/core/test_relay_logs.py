"""What the relay logs when its upstream fails names a reason, also for a failure that
carries no message of its own (a dial or a request that got no answer in time raises a
bare TimeoutError): never "unreachable: " or "failed: " followed by nothing. (The HTTP
listeners' log at a client's hang-up and at SIGTERM: tests/ops/test_ops_workers.py.)"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from pathlib import Path

import pytest
from relay_helpers import TIMEOUT, client, make_ns, push_track, relay_at, serve_peer

from relay.core.relay import RelayOptions
from relay.moqt.primitives import FullTrackName
from relay.session import IncomingPublish, SessionHandler


async def _logged(caplog: pytest.LogCaptureFixture, pattern: str) -> str:
    """The first message matching ``pattern`` (polled: a log line has no event to wait on)."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            for rec in caplog.records:
                if re.search(pattern, msg := rec.getMessage()):
                    return msg
            await asyncio.sleep(0.02)


async def test_an_upstream_that_never_answers_the_dial_is_logged_with_a_reason(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))  # held open: no ICMP error, the handshake times out
        url = f"moqt://127.0.0.1:{silent.getsockname()[1]}/"
        r = await relay_at(tmp_path, upstream=[url], upstream_idle_timeout=0.3)
        try:
            line = await _logged(caplog, "upstream relay .* unreachable")
        finally:
            await r.close()
    assert re.fullmatch(rf"upstream relay {re.escape(url)} unreachable: \S.*", line), line


class _SilentOnPublish(SessionHandler):
    """An upstream relay that takes the session but never answers a PUBLISH."""

    async def publish(self, req: IncomingPublish) -> None:
        await asyncio.Event().wait()


async def test_a_push_upstream_that_gets_no_answer_is_logged_with_a_reason(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    upstream = _SilentOnPublish()
    srv = await serve_peer(tmp_path / "tls", upstream)
    a = await relay_at(tmp_path / "a", upstream=[f"moqt://127.0.0.1:{srv.port}/"],
                       options=RelayOptions(upstream_push=True, default_fill_timeout=0.3))
    try:
        pub = await client(a)
        await push_track(pub, FullTrackName(make_ns(), b"k.raw.s0"), layers=1)
        line = await _logged(caplog, "push of .* upstream refused or failed")
    finally:
        await a.close()
        await srv.close()
    assert re.search(r"failed: \S.*; it is served here only$", line), line
