"""Shutting down quietly: what an endpoint still has scheduled when its connection is closed
or its process stops logs no error (ops read ERROR lines as faults)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging

import pytest
from conftest import SETTINGS, Harness, until, url_for, w

from relay.session.wire import MOQT
from relay.transport import CertificatePaths, Connection, QuicSettings, connect, serve

KEEPALIVE = QuicSettings(max_datagram_size=8952, idle_timeout=15.0, keepalive_interval=5.0,
                         connect_timeout=5.0)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("closing", ["client", "server"])
async def test_the_keepalive_of_a_closing_connection_logs_no_error(
        make_harness: object, closing: str, caplog: pytest.LogCaptureFixture) -> None:
    """A keepalive due after the connection was closed, before the library reported it
    closed (the closing period: 3 PTO), stops quietly (qh3 refuses the PING then: this
    printed a QuicConnectionError traceback at every `--workers` shutdown)."""
    h: Harness = await make_harness(KEEPALIVE)  # type: ignore[operator]
    client, server = await h.pair("quic", KEEPALIVE)
    conn = client if closing == "client" else server
    ep = conn._port
    conn.close(0, "done")
    assert not ep._quic_closed  # still in its closing period
    # Run the keepalive as its timer would (a callback of the loop: an exception in it is
    # logged by asyncio at ERROR), then wait for a callback queued after it.
    loop = asyncio.get_running_loop()
    ran = asyncio.Event()
    loop.call_soon(ep._keepalive)
    loop.call_soon(ran.set)
    await w(ran.wait())
    assert _errors(caplog) == []
    await w(client.aclose())


def test_a_webtransport_linger_cut_by_shutdown_logs_no_error(
        certs: CertificatePaths, caplog: pytest.LogCaptureFixture) -> None:
    """After its last WebTransport session closes, an endpoint waits (a second at most) for
    the peer to finish the CONNECT stream. A process that stops meanwhile cuts that wait:
    asyncio.run cancels every task left. It waited on a gather, whose child tasks were
    cancelled too, which left a CancelledError on the gather nobody retrieved:
    "_GatheringFuture exception was never retrieved" at ERROR after moq-rs sessions. Run in
    a loop of its own, so that its shutdown is asyncio.run's own."""

    async def scenario() -> None:
        sessions: asyncio.Queue[Connection] = asyncio.Queue()

        async def handler(conn: Connection) -> None:
            await sessions.put(conn)
            await conn.wait_closed()

        srv = await w(serve("127.0.0.1", 0, certs.certfile, certs.keyfile, handler,
                            settings=SETTINGS, application=MOQT))
        try:
            client = await w(connect(url_for(srv, "webtransport"), settings=SETTINGS,
                                     ca_file=certs.certfile, application=MOQT))
            server = await w(sessions.get())
            client._port.abort()  # the peer goes away without a word: the linger waits
            server.close(0, "bye")
            ep = server._port
            # its linger task has started and waits (suspended) for the peer's FIN
            await until(lambda: bool(ep._tasks) and all(
                inspect.getcoroutinestate(t.get_coro()) == inspect.CORO_SUSPENDED  # type: ignore[arg-type]
                for t in ep._tasks), "the endpoint lingers")
        finally:
            await w(srv.close(grace=0))
        # returning with the linger still waiting: asyncio.run cancels it

    asyncio.run(scenario())
    gc.collect()  # a never-retrieved exception is logged when its future is collected
    assert _errors(caplog) == []
