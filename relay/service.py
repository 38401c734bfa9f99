"""Start-up composition of a relay process: storage, TLS, the UDP listener, upstream links.

`kvcs relay` and the tests use the same entry point (:func:`start_relay`), so what the tests
run is what operators run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from relay.core.auth import Authorizer
from relay.core.relay import Relay, RelayOptions
from relay.core.upstream import UpstreamLink
from relay.session import SessionConfig
from relay.transport import QuicSettings, Server, ensure_self_signed, fingerprint, serve
from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from storage.tiered import TieredStore

log = logging.getLogger("kvcs.relay")


@dataclass
class RelayConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = 4433
    data_dir: Path = Path("data")
    cert: Path | None = None
    key: Path | None = None
    upstream: list[str] = field(default_factory=list)
    upstream_ca: Path | None = None
    upstream_insecure: bool = False
    memory_bytes: int = 1 << 30
    lmdb_bytes: int = 8 << 30
    lmdb_max_age: float | None = None
    max_datagram_size: int = 1200
    send_buffer_bytes: int = 1 << 20
    wt_path: str = "/moq"
    options: RelayOptions = field(default_factory=RelayOptions)
    auth_tokens: list[dict[str, object]] = field(default_factory=list)


@dataclass
class RunningRelay:
    relay: Relay
    server: Server
    store: TieredStore
    config: RelayConfig
    certfile: Path
    fingerprint: str

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"moqt://{self.config.listen_host}:{self.port}/"

    @property
    def wt_url(self) -> str:
        return f"https://{self.config.listen_host}:{self.port}{self.config.wt_path}"

    async def close(self) -> None:
        await self.relay.close()
        await self.server.close()
        self.store.close()


async def start_relay(config: RelayConfig) -> RunningRelay:
    data = Path(config.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    if config.cert is not None and config.key is not None:
        certfile, keyfile = Path(config.cert), Path(config.key)
        fp = fingerprint(certfile)
    else:
        paths = ensure_self_signed(data / "tls")
        certfile, keyfile, fp = paths.certfile, paths.keyfile, paths.fingerprint
    durable = LmdbStore(os.fspath(data / "lmdb"), config.lmdb_bytes,
                        max_age=config.lmdb_max_age)
    store = TieredStore(MemoryStore(config.memory_bytes), durable)
    # Small send buffers: Objects waiting for a slow subscriber wait in the relay's
    # scheduler (in priority order, counted against its backlog bound), not in QUIC's queue.
    settings = QuicSettings(max_datagram_size=config.max_datagram_size,
                            send_buffer_high=config.send_buffer_bytes // 2,
                            connection_send_buffer_high=config.send_buffer_bytes)
    authorizer = Authorizer.from_config(config.auth_tokens)
    upstream = None
    if config.upstream:
        upstream = UpstreamLink(
            config.upstream,
            config=SessionConfig(max_filter_ranges=config.options.max_filter_ranges,
                                 implementation=config.options.implementation),
            settings=settings, ca_file=config.upstream_ca, insecure=config.upstream_insecure)
    relay = Relay(store, options=config.options, authorizer=authorizer, upstream=upstream)
    try:
        server = await serve(config.listen_host, config.listen_port, certfile, keyfile,
                             relay.handle_connection, settings=settings, wt_path=config.wt_path)
    except BaseException:
        store.close()
        raise
    if authorizer.open:
        log.warning("no authorization tokens configured: the relay is open (development)")
    return RunningRelay(relay, server, store, config, certfile, fp)


async def run_forever(config: RelayConfig) -> None:
    running = await start_relay(config)
    log.info("relay ready on %s (WebTransport %s) data-dir=%s certificate sha256=%s",
             running.url, running.wt_url, config.data_dir, running.fingerprint)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("shutting down")
        await running.relay.goaway_all()
    finally:
        await running.close()
