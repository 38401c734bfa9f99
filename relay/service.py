"""Start-up composition of a relay process: storage, TLS, the UDP listener, upstream links.

`kvcs relay` and the tests use the same entry point (:func:`start_relay`), so what the tests
run is what operators run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from relay.admin import AdminApi
from relay.core import loops
from relay.core.auth import Authorizer
from relay.core.persistence import pending_commits
from relay.core.relay import Relay, relay_session_config
from relay.core.routing import RELAY_IMPLEMENTATION
from relay.core.siblings import SIBLING_IMPLEMENTATION, SiblingLinks
from relay.core.upstream import UpstreamLink, spread
from relay.heap import tune_malloc
from relay.metrics import MetricsServer, RelayMetrics
from relay.options import RelayConfig
from relay.session import SessionConfig
from relay.session.tokens import tokens_of
from relay.session.wire import MOQT
from relay.transport import QuicSettings, Server, ensure_self_signed, fingerprint, serve
from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from storage.tiered import TieredStore

log = logging.getLogger("kvcs.relay")


@dataclass(frozen=True)
class WorkerRole:
    index: int
    run_dir: Path  # the supervisor's: every worker's ready file, where siblings are found
    secret: str  # the token sibling sessions present (granted everything when tokens are on)
    fd: int | None = None  # the UDP socket the supervisor made for this worker index
    relay_id: str = ""  # the relay's, in loop probes: one for all its workers


@dataclass
class RunningRelay:
    relay: Relay
    server: Server
    store: TieredStore
    config: RelayConfig
    certfile: Path
    fingerprint: str
    metrics: RelayMetrics | None = None
    metrics_server: MetricsServer | None = None
    sibling_server: Server | None = None
    siblings: SiblingLinks | None = None  # to the other workers of this relay
    peers: SiblingLinks | None = None  # to the peer relays of this tier (--peer)
    closed: bool = False

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def metrics_port(self) -> int | None:
        return self.metrics_server.port if self.metrics_server is not None else None

    async def readiness(self) -> list[str]:
        """Why the relay is not ready (empty: ready): listening, storage open, upstream
        reachable when configured, not draining."""
        problems = []
        if self.closed or not self.server.accepting:
            problems.append("not listening")
        if self.relay.draining:
            problems.append("draining")
        if self.store.durable is not None:
            try:
                self.store.durable.stats()
            except Exception as e:  # a closed or broken LMDB environment
                problems.append(f"storage unavailable: {type(e).__name__}")
        up = self.relay.upstream
        if up is not None and up.configured and up.session is None:
            try:
                ok = await asyncio.wait_for(up.get(), 2.0) is not None
            except TimeoutError:
                ok = False
            if not ok:
                problems.append("upstream relay loop" if up.looped else "upstream unreachable")
        return problems

    @property
    def url(self) -> str:
        return f"moqt://{self.config.listen_host}:{self.port}/"

    @property
    def wt_url(self) -> str:
        return f"https://{self.config.listen_host}:{self.port}{self.config.wt_path}"

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.metrics_server is not None:
            await self.metrics_server.close()
        for links in (self.siblings, self.peers):
            if links is not None:
                await links.close()
        await self.relay.close()
        if self.sibling_server is not None:
            await self.sibling_server.close()
        await self.server.close()
        self.store.close()

    def stop_accepting(self) -> None:
        # The transport has no public switch yet: new connections are closed on arrival.
        self.server.stop_accepting()

    async def drain(self, timeout: float) -> bool:
        """GOAWAY to every session, then wait (at most ``timeout`` s) for fills and FETCHes
        in flight and pending LMDB commits. True if everything finished in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.stop_accepting()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.relay.goaway_all(), timeout)
        c = self.relay.counters
        try:
            await asyncio.wait_for(c.wait_idle(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            log.warning("drain timeout: %d fills and %d fetches cut short",
                        c.fill.in_flight.count, c.fetch.in_flight.count)
            return False
        self.relay.persistence.flush()  # what waits for a quiet moment is written now
        commits = pending_commits(list(self.relay.tracks.values()))
        if commits:
            _, pending = await asyncio.wait(commits, timeout=max(0.0, deadline - loop.time()))
            if pending:
                log.warning("drain timeout: %d LMDB commits unfinished", len(pending))
                return False
        return True


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
                        max_age=config.lmdb_max_age, quotas=config.scope_quotas,
                        clock=config.clock)
    store = TieredStore(MemoryStore(config.memory_bytes, config.scope_quotas,
                                    clock=config.clock), durable)
    # Small send buffers: Objects waiting for a slow subscriber wait in the relay's
    # scheduler (in priority order, counted against its backlog bound), not in QUIC's queue.
    settings = QuicSettings(max_datagram_size=config.max_datagram_size,
                            backend=config.quic_backend,
                            congestion_control=config.congestion_control,
                            send_buffer_high=config.send_buffer_bytes // 2,
                            connection_send_buffer_high=config.send_buffer_bytes)
    tokens = list(config.auth_tokens)
    # siblings may ask each other for anything: workers with the supervisor's secret (nobody
    # else holds it), peer relays with the token their tier shares
    shared = [config.worker.secret.encode()] if config.worker is not None else []
    if config.peer and config.peer_token is not None:
        shared.append(config.peer_token)
    if tokens:
        tokens += [{"token": t.decode(), "prefixes": [""], "roles": ["publish", "subscribe"]}
                   for t in shared]
    authorizer = Authorizer.from_config(tokens)
    # links to the upstream and to siblings: a dead one is noticed within this idle timeout
    # (PINGs every third of it keep a quiet link up)
    link_settings = dataclasses.replace(settings, idle_timeout=config.upstream_idle_timeout,
                                        keepalive_interval=config.upstream_idle_timeout / 3)
    upstream = None
    if config.upstream:
        upstream = UpstreamLink(
            config.upstream,
            config=dataclasses.replace(relay_session_config(config.options),
                                       authorization_tokens=tokens_of(config.upstream_token),
                                       implementation=RELAY_IMPLEMENTATION),
            settings=link_settings, ca_file=config.upstream_ca,
            insecure=config.upstream_insecure, dial_timeout=config.upstream_idle_timeout,
            first=spread(socket.gethostname(), len(config.upstream))
            if config.upstream_spread else 0)
    relay = Relay(store, options=config.options, authorizer=authorizer, upstream=upstream,
                  clock=config.clock, announce_fields=config.upstream_announce_fields,
                  upstream_token=config.upstream_token)
    try:
        fd = config.worker.fd if config.worker is not None else None
        server = await serve(config.listen_host, config.listen_port, certfile, keyfile,
                             relay.handle_connection, application=MOQT, settings=settings,
                             wt_path=config.wt_path,
                             reuse_port=config.worker is not None,
                             sock=socket.socket(fileno=fd) if fd is not None else None)
    except BaseException:
        store.close()
        raise
    relay.relay_id = config.worker.relay_id if config.worker is not None and \
        config.worker.relay_id else loops.new_relay_id(server.port)
    running = RunningRelay(relay, server, store, config, certfile, fp,
                           metrics=RelayMetrics(relay, store))
    if config.peer:
        running.peers = SiblingLinks(
            relay, config=_sibling_config(config, relay, config.peer_token),
            settings=link_settings, connect_timeout=config.upstream_idle_timeout,
            ca_file=config.peer_ca, insecure=config.peer_insecure)
        running.peers.keep_peers(config.peer)
    if config.worker is not None:
        # the sibling listener has its own self-signed certificate (made by the supervisor
        # before the workers start), which the links pin, whatever --cert serves outside
        sib = ensure_self_signed(config.worker.run_dir / "tls")
        try:
            running.sibling_server = await serve(
                "127.0.0.1", 0, sib.certfile, sib.keyfile, relay.handle_sibling_connection,
                application=MOQT, settings=settings)
        except BaseException:
            await running.close()
            raise
        # a dead sibling is noticed as fast as a dead upstream (its Tracks then route
        # elsewhere, or are refused as unreachable, not waited for); its listener is on
        # loopback and answers at once
        running.siblings = SiblingLinks(
            relay, config=_sibling_config(config, relay, config.worker.secret.encode()),
            settings=link_settings, connect_timeout=2.0, ca_file=sib.certfile)
        running.siblings.watch_workers(config.worker.run_dir, config.worker.index)
    if config.metrics_listen is not None:
        assert running.metrics is not None
        admin = AdminApi(relay, config.admin_token) if config.admin_token else None
        ms = MetricsServer(running.metrics, running.readiness, admin)
        try:
            await ms.start(*config.metrics_listen)
        except BaseException:
            await running.close()
            raise
        running.metrics_server = ms
    if upstream is not None:
        try:  # an upstream leading back here is a start error (docs/relay.md, "Cycles")
            await loops.refuse_at_start(upstream)
        except BaseException:
            await running.close()
            raise
    if authorizer.open:
        log.warning("no authorization tokens configured: the relay is open (development)")
    if relay.announcer is not None:
        relay.announcer.start()  # what LMDB holds is announced upward from the start
    return running


def _sibling_config(config: RelayConfig, relay: Relay, token: bytes | None) -> SessionConfig:
    """What a sibling link says in SETUP: that it is one, and whose (relay/core/siblings.py)."""
    return dataclasses.replace(relay_session_config(config.options),
                               authorization_tokens=tokens_of(token),
                               implementation=f"{SIBLING_IMPLEMENTATION} {relay.instance}")


def _write_ready_file(path: Path, running: RunningRelay) -> None:
    info: dict[str, object] = {"port": running.port, "metrics_port": running.metrics_port,
                               "pid": os.getpid()}
    worker = running.config.worker
    if worker is not None and running.sibling_server is not None:
        info.update(index=worker.index, sibling_port=running.sibling_server.port)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(path)  # atomic: a reader never sees half a file


async def run_forever(config: RelayConfig) -> None:
    """Serve until SIGTERM/SIGINT, then drain (GOAWAY, in-flight work, LMDB commits) within
    ``config.drain_timeout`` and close. A second signal closes at once."""
    heap = "default" if config.malloc_defaults else tune_malloc()  # relay/heap.py
    running = await start_relay(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if config.ready_file is not None:
            _write_ready_file(Path(config.ready_file), running)
        # after the ready file and the signal handlers: whoever sees this line may use both
        backend = running.server.backend.name
        # the controller only where there is a choice: qh3's native core has its own
        log.info("relay ready on %s (WebTransport %s) quic=%s%s data-dir=%s certificate=%s "
                 "sha256=%s metrics=%s malloc=%s", running.url, running.wt_url, backend,
                 f" cc={config.congestion_control}" if backend == "aioquic" else "",
                 config.data_dir,
                 running.certfile, running.fingerprint,
                 f"{config.metrics_listen[0]}:{running.metrics_port}"
                 if config.metrics_listen else "off", heap)
        await stop.wait()
        stop.clear()
        log.info("shutting down: GOAWAY to %d sessions, drain timeout %.1f s",
                 len(running.relay.sessions), config.drain_timeout)
        drain = asyncio.ensure_future(running.drain(config.drain_timeout))
        again = asyncio.ensure_future(stop.wait())
        await asyncio.wait({drain, again}, return_when=asyncio.FIRST_COMPLETED)
        if not drain.done():
            log.warning("second signal: closing without waiting")
            drain.cancel()
        again.cancel()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await running.close()
        log.info("relay stopped")
