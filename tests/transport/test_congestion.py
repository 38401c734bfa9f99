"""The bbr controller (relay/transport/congestion.py) on a simulated path: a fake clock, a
bottleneck of known rate and queue, seeded random loss. Deterministic, and each check
would fail if the model collapsed under random loss, ignored persistent congestion or
never left (or never grew in) STARTUP."""

from __future__ import annotations

import asyncio
import heapq
import math
import pathlib
import random
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import w

from relay.session.wire import MOQT
from relay.transport import CertificatePaths, Connection, QuicSettings, connect, serve
from relay.transport.config import CONGESTION_CONTROLS
from relay.transport.congestion import (
    DRAIN,
    PROBE_BW,
    PROBE_RTT,
    STARTUP,
    BbrCongestionControl,
)

MSS = 1200


@dataclass
class Packet:
    """What aioquic's QuicSentPacket gives the controller (sent_bytes, sent_time)."""

    number: int
    sent_bytes: int
    sent_time: float = 0.0


@dataclass
class Path:
    rate: float  # bytes/s at the bottleneck
    rtt: float  # base round trip, seconds
    loss: float = 0.0  # random loss, either direction folded into the data packet
    queue: float = 1.0  # bottleneck queue, in BDPs; beyond it packets are dropped
    seed: int = 1
    ack_every: float = 0.0  # ACKs leave the receiver in batches this often (aggregation)

    @property
    def bdp(self) -> float:
        return self.rate * self.rtt


class Run:
    """Sender (the controller, paced and windowed as aioquic does) -> bottleneck -> ACK.
    A packet is declared lost when the third later packet is acknowledged (RFC 9002's
    packet threshold), and an RTT sample is taken per ACK as aioquic does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cc = BbrCongestionControl(max_datagram_size=MSS)
        self.rng = random.Random(path.seed)
        self.now = 0.0
        self.next_send = 0.0
        self.link_free = 0.0
        self.events: list[tuple[float, int, str, Packet]] = []
        self.number = 0
        self.delivered: list[tuple[float, int]] = []  # (time, bytes) of each ACK
        self.modes: list[tuple[float, str]] = [(0.0, STARTUP)]
        self.pending_loss: list[Packet] = []
        self.rates: list[tuple[float, float]] = []  # (time, pacing rate) after each ACK

    def _send(self) -> None:
        p = Packet(self.number, MSS, self.now)
        self.number += 1
        self.cc.on_packet_sent(packet=p)
        rate = self.cc.pacing_rate()
        self.next_send = self.now + (MSS / rate if rate != float("inf") else 0.0)
        start = max(self.now, self.link_free)
        queued = (start - self.now) * self.path.rate
        if queued > self.path.queue * self.path.bdp or self.rng.random() < self.path.loss:
            # dropped: noticed once three later packets are acknowledged (or at once if
            # none follow: a timeout stands in for the probe)
            heapq.heappush(self.events, (self.now + self.path.rtt + 4 * MSS / self.path.rate,
                                         p.number, "lost", p))
            return
        self.link_free = start + MSS / self.path.rate
        acked = self.link_free + self.path.rtt
        if self.path.ack_every:
            acked = math.ceil(acked / self.path.ack_every) * self.path.ack_every
        heapq.heappush(self.events, (acked, p.number, "ack", p))

    def run(self, until: float, stop_at: float | None = None) -> None:
        while self.now < until:
            can_send = (self.cc.bytes_in_flight + MSS <= self.cc.congestion_window
                        and (stop_at is None or self.now < stop_at))
            next_event = self.events[0][0] if self.events else until
            if can_send and max(self.next_send, self.now) <= next_event:
                self.now = max(self.next_send, self.now)
                self._send()
                continue
            if not self.events:
                self.now = until
                break
            self.now, _, kind, p = heapq.heappop(self.events)
            if kind == "ack":
                self.cc.on_packet_acked(now=self.now, packet=p)
                self.cc.on_rtt_measurement(now=self.now, rtt=self.now - p.sent_time)
                self.delivered.append((self.now, p.sent_bytes))
                self.rates.append((self.now, self.cc.pacing_rate()))
            else:
                self.cc.on_packets_lost(now=self.now, packets=[p])
            if self.cc.mode != self.modes[-1][1]:
                self.modes.append((self.now, self.cc.mode))

    def goodput(self, start: float, end: float) -> float:
        return sum(n for t, n in self.delivered if start <= t < end) / (end - start)


def test_random_loss_of_one_percent_keeps_the_rate_near_the_bottleneck() -> None:
    path = Path(rate=2.5e6, rtt=0.04, loss=0.01, queue=2.0)
    run = Run(path)
    run.run(6.0)
    # after start-up, the path stays nearly full: Reno would halve per loss (~every 2 RTT
    # at this BDP) and average far lower
    assert run.goodput(2.0, 6.0) > 0.85 * path.rate
    assert 0.8 * path.rate < run.cc.btl_bw < 1.3 * path.rate
    assert run.cc.congestion_window >= path.bdp
    assert run.cc.mode in (PROBE_BW, PROBE_RTT)
    assert run.cc.heavy_loss_events == 0  # random loss never looked like congestion


def test_no_loss_fills_the_link_and_keeps_the_queue_small() -> None:
    path = Path(rate=5e6, rtt=0.08, queue=4.0)
    run = Run(path)
    run.run(5.0)
    assert run.goodput(1.5, 5.0) > 0.9 * path.rate
    # window about 2 BDP (not the whole queue): the model bounds what it puts in flight
    assert run.cc.congestion_window < 2.5 * path.bdp
    assert abs(run.cc.min_rtt - path.rtt) < 0.01


def test_acks_in_batches_on_a_tiny_rtt_do_not_starve_the_window() -> None:
    # loopback through a busy host: a lone packet comes back in 0.2 ms, but under load the
    # receiver acknowledges every 2 ms (its timer granularity and ACK delay). A window of
    # 2 x bandwidth x min RTT alone would be ~5 packets and hold the rate at a fraction.
    path = Path(rate=20e6, rtt=0.0002, queue=50.0, ack_every=0.002)
    run = Run(path)
    run.run(2.0)
    assert run.goodput(1.0, 2.0) > 0.8 * path.rate
    assert run.cc.congestion_window < 8 * path.rate * path.ack_every  # still bounded


def test_startup_grows_then_exits_when_the_bandwidth_plateaus() -> None:
    path = Path(rate=2.5e6, rtt=0.02, queue=3.0)
    run = Run(path)
    run.run(2.0)
    modes = [m for _, m in run.modes]
    assert modes[:3] == [STARTUP, DRAIN, PROBE_BW]
    left_startup = run.modes[1][0]
    # exponential growth reaches 2.5 MB/s from 10 packets in ~8 rounds, then three rounds
    # without 25 % growth: well under 30 rounds
    assert left_startup < 30 * path.rtt
    # while in STARTUP the pacing rate grew (it did not sit at the initial rate)
    early = [r for t, r in run.rates if t < left_startup]
    assert max(early) > 4 * min(early)
    assert 0.85 * path.rate < run.cc.btl_bw < 1.2 * path.rate


def test_probe_rtt_refreshes_the_min_rtt_every_ten_seconds_at_little_cost() -> None:
    path = Path(rate=2.5e6, rtt=0.04, queue=4.0)
    run = Run(path)
    run.run(12.0)
    probes = [(t, m) for t, m in run.modes if m == PROBE_RTT]
    assert len(probes) == 1 and 10.0 < probes[0][0] < 11.0
    after = run.modes[run.modes.index(probes[0]) + 1]
    assert 0.2 <= after[0] - probes[0][0] < 0.5  # 200 ms at four packets, then back
    assert abs(run.cc.min_rtt - path.rtt) < 0.005  # no standing queue crept in
    assert run.goodput(2.0, 12.0) > 0.9 * path.rate


def test_persistent_congestion_drops_to_the_minimum_window_and_measures_again() -> None:
    path = Path(rate=2.5e6, rtt=0.04)
    run = Run(path)
    run.run(2.0)
    assert run.cc.congestion_window > 20 * MSS
    run.cc.on_persistent_congestion()
    assert run.cc.congestion_window == 2 * MSS
    assert run.cc.mode == STARTUP and run.cc.btl_bw == 0.0
    run.run(4.0)  # the path is still there: it is found again
    assert run.goodput(3.0, 4.0) > 0.85 * path.rate


def test_heavy_persistent_loss_backs_off() -> None:
    # a bottleneck that halves mid-transfer behind a tiny queue: a fifth and more of every
    # round is lost until the model forgets the old rate
    path = Path(rate=5e6, rtt=0.04, queue=0.25)
    run = Run(path)
    run.run(2.0)
    assert run.cc.btl_bw > 0.8 * 5e6
    run.path.rate = 1e6
    run.run(4.0)
    assert run.cc.heavy_loss_events >= 1
    assert run.cc.btl_bw < 1.5e6
    assert run.goodput(3.0, 4.0) > 0.7 * 1e6


# -- over real QUIC (127.0.0.1) ------------------------------------------------------------

def _controller(conn: Connection) -> Any:
    return conn._port._quic._loss._cc


@pytest.mark.parametrize("name", CONGESTION_CONTROLS)
async def test_a_transfer_is_exact_with_the_controller_the_settings_name(
        name: str, certs: CertificatePaths, quic_backends: str | None) -> None:
    settings = QuicSettings(max_datagram_size=1200, congestion_control=name,
                            backend="aioquic", idle_timeout=15.0, connect_timeout=5.0)
    payload = random.Random(7).randbytes(4 * 1024 * 1024)
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    server_side: list[Connection] = []

    async def handler(conn: Connection) -> None:
        server_side.append(conn)
        incoming = await w(conn.accept())
        chunks = []
        while chunk := await w(incoming.recv.read()):
            chunks.append(chunk)
        got.set_result(b"".join(chunks))
        await conn.wait_closed()

    server = await serve("127.0.0.1", 0, certs.certfile, certs.keyfile, handler,
                         settings=settings, application=MOQT)
    try:
        client = await w(connect(f"moqt://127.0.0.1:{server.port}/", settings=settings,
                                 ca_file=certs.certfile, application=MOQT))
        send = await w(client.open_uni())
        await w(send.write(payload))
        await w(send.finish())
        assert await w(got) == payload
        # both ends run the controller named, and bbr is paced by its own model
        expected = {"bbr": "BbrCongestionControl", "reno": "RenoCongestionControl",
                    "cubic": "CubicCongestionControl"}[name]
        for conn in (client, server_side[0]):
            cc = _controller(conn)
            assert type(cc).__name__ == expected
            pacer = conn._port._quic._loss._pacer
            assert (type(pacer).__name__ == "ModelPacer") == (name == "bbr")
        if name == "bbr":
            cc = _controller(client)
            assert cc.delivered >= len(payload) and cc.btl_bw > 0
            assert cc.mode != STARTUP or cc.round_count < 10
        client.close()
    finally:
        await w(server.close())


@pytest.mark.parametrize("name", CONGESTION_CONTROLS)
async def test_the_relay_config_key_reaches_its_connections(
        name: str, tmp_path: pathlib.Path, quic_backends: str | None) -> None:
    from relay.config import load
    from relay.service import start_relay

    settings = load({"congestion_control": name, "listen": "127.0.0.1:0",
                     "metrics_listen": "off",  # its default port may be a running relay's
                     "data_dir": str(tmp_path), "quic_backend": "aioquic",
                     "memory_bytes": str(16 << 20), "lmdb_bytes": str(16 << 20)}, {})
    running = await w(start_relay(settings.relay_config()))
    try:
        # a different controller on the client: the server's must come from the key
        other = "reno" if name != "reno" else "bbr"
        client = await w(connect(f"moqt://127.0.0.1:{running.port}/", ca_file=running.certfile,
                                 settings=QuicSettings(backend="aioquic",
                                                       congestion_control=other), application=MOQT))
        ep = next(iter(running.server._endpoints))
        assert type(ep._quic._loss._cc).__name__.lower().startswith(name)
        assert type(_controller(client)).__name__.lower().startswith(other)
        client.close()
    finally:
        await w(running.close())


def test_qh3_refuses_a_congestion_controller() -> None:
    from relay.config import ConfigError, load

    with pytest.raises(ConfigError, match="no choice"):
        load({"quic_backend": "qh3", "congestion_control": "bbr"}, {})
    assert load({"quic_backend": "qh3"}, {}).relay_config().quic_backend == "qh3"


def test_the_peer_commands_pass_congestion_control_to_their_sessions() -> None:
    from relay.peers import cli

    def access() -> Any:
        return cli._access(("moqt://127.0.0.1:1/",), None, True, 1000)

    from relay.transport.backend import default_backend, set_default_backend

    wrapped = cli._with_quic_backend(access)
    saved = default_backend("client")
    try:
        for name in CONGESTION_CONTROLS:
            got = wrapped(quic_backend="aioquic", congestion_control=name)
            assert got.settings.congestion_control == name
            # the rest of the peers' settings are kept
            assert got.settings.send_buffer_high == cli.PEER_SETTINGS.send_buffer_high
        assert wrapped(quic_backend="aioquic", congestion_control=None).settings == \
            cli.PEER_SETTINGS
        with pytest.raises(SystemExit) as e:
            wrapped(quic_backend="qh3", congestion_control="bbr")
        assert e.value.code == 2
        # --max-datagram-size likewise: auto (the default) or a number; bad: exit 2
        for given, want in ((None, "auto"), ("1200", 1200), ("auto", "auto")):
            got = wrapped(quic_backend="aioquic", congestion_control=None,
                          max_datagram_size=given)
            assert got.settings.max_datagram_size == want
        with pytest.raises(SystemExit) as e:
            wrapped(quic_backend="aioquic", congestion_control=None, max_datagram_size="900")
        assert e.value.code == 2
    finally:
        cli._congestion_control = cli._max_datagram_size = None
        set_default_backend(client=saved)
