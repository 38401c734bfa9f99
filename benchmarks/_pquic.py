"""aiopquic (picoquic, C, on its own network thread) as the QUIC core of a raw transfer: the
ends that ``_raw_net.py`` runs for its ``aiopquic`` rows, shaped like its relay.transport ends
(the server opens one unidirectional stream to each client and writes ``nbytes`` in 1 MiB
writes; the client reads to the FIN).

Only what the evaluation needs (docs/performance.md, "The QUIC core: aiopquic evaluated"): no
MOQT, no relay.transport port. Writes go through ``send_stream_data_drained`` (aiopquic's own
wait on its ring: ``send_stream_data`` raises BufferError when the per-stream ring, 4 MiB, is
full). ``congestion`` is picoquic's algorithm name (``bbr1``, aiopquic's default; ``cubic``,
``newreno``, ``bbr``); ``pmtud`` its path-MTU policy (``basic`` probes up to picoquic's largest
packet; ``blocked`` stays at the 1200-byte-class initial size): aiopquic has no fixed
datagram size setting.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from aiopquic.asyncio import QuicConnectionProtocol, connect, serve
from aiopquic.quic.configuration import QuicConfiguration
from aiopquic.quic.events import ConnectionTerminated, HandshakeCompleted, StreamDataReceived

ALPN = "kvcs-bench"
_CHUNK = 1 << 20


def free_udp_port(host: str) -> int:
    """A UDP port free on ``host`` right now (bound and released: a race only with another
    process binding at the same instant)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _config(is_client: bool, congestion: str, pmtud: str) -> QuicConfiguration:
    return QuicConfiguration(is_client=is_client, alpn_protocols=[ALPN],
                             congestion_control_algorithm=congestion, pmtud=pmtud,
                             ip_family=socket.AF_INET)


async def serve_sender(host: str, nbytes: int, cert: str, key: str, congestion: str,
                       pmtud: str, started: asyncio.Future[int]) -> dict[str, Any]:
    """Serve one client: write ``nbytes`` on one stream, wait for the client to close.
    ``started`` gets the port; returns the CPU seconds of this process from the handshake to
    the close (picoquic's thread included)."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[dict[str, Any]] = loop.create_future()
    payload = bytes(_CHUNK)  # bytes: aiopquic takes no memoryview

    class Sender(QuicConnectionProtocol):
        async def _send(self) -> None:
            c0 = time.process_time()
            quic: Any = self._quic
            sid = quic.get_next_available_stream_id(is_unidirectional=True)
            for pos in range(0, nbytes, _CHUNK):
                end = pos + _CHUNK >= nbytes
                chunk = payload if not end else payload[:nbytes - pos]
                await quic.send_stream_data_drained(sid, chunk, end_stream=end)
            await self._closed.wait()
            if not finished.done():
                finished.set_result({"cpu": time.process_time() - c0})

        def quic_event_received(self, event: Any) -> None:
            if isinstance(event, HandshakeCompleted):
                self._task = loop.create_task(self._send())

    cfg = _config(False, congestion, pmtud)
    cfg.load_cert_chain(cert, key)
    port = free_udp_port(host)  # aiopquic does not tell the port it bound for port 0
    server = await serve(host, port, configuration=cfg, create_protocol=Sender)
    started.set_result(port)
    try:
        return await finished
    finally:
        server.close()


async def get(host: str, port: int, ca: str, nbytes: int, deadline: float, congestion: str,
              pmtud: str) -> dict[str, Any]:
    """Dial, read the one stream to its FIN: seconds from dialling (handshake included) and
    CPU seconds of this process over the same span; past ``deadline`` the bytes that came."""
    loop = asyncio.get_running_loop()
    fin: asyncio.Future[None] = loop.create_future()
    got = [0]

    class Receiver(QuicConnectionProtocol):
        def quic_event_received(self, event: Any) -> None:
            if isinstance(event, StreamDataReceived):
                got[0] += len(event.data)
                if event.end_stream and not fin.done():
                    fin.set_result(None)
            elif isinstance(event, ConnectionTerminated) and not fin.done():
                fin.set_exception(ConnectionError(f"closed: {event.error_code}"))

    cfg = _config(True, congestion, pmtud)
    cfg.cafile = ca
    cfg.server_name = host  # the certificates here name the addresses
    t0, c0 = time.perf_counter(), time.process_time()
    async with connect(host, port, configuration=cfg, create_protocol=Receiver):
        try:
            await asyncio.wait_for(fin, deadline)
        except TimeoutError:
            return {"deadline_passed": True, "bytes": got[0]}
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": seconds, "cpu": cpu, "bytes": got[0]}
