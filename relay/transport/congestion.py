"""A loss-tolerant congestion controller for the aioquic backend: a compact BBR-style model.

aioquic's own controllers (Reno, CUBIC) halve their window on every loss episode, so 1 %
random loss on a 20 ms path holds a transfer to a few hundred kB/s (issue 24). This one sets
its pace from a model of the path instead of from loss:

* **bottleneck bandwidth**: the largest delivery rate seen over the last 10 round trips.
  Every acknowledged packet gives one sample (how many bytes were delivered between its
  sending and its acknowledgement, over the longer of the send and ack intervals: the
  delivery-rate estimation of draft-cheng-iccrg-delivery-rate-estimation);
* **minimum RTT** over the last 10 s.

From these: ``pacing rate = pacing_gain x bandwidth`` and
``congestion window = cwnd_gain x bandwidth x min RTT``. The gains come from the mode:
STARTUP (2.89 both: doubling per round trip) until the bandwidth has not grown by 25 % for
three rounds, DRAIN (pacing 1/2.89) until the queue STARTUP built is gone, then PROBE_BW, a
cycle of eight min-RTT phases pacing at 1.25, 0.75, then 1 x the bandwidth (probe for more,
drain what the probe queued, cruise), with the window at 2 x BDP. PROBE_RTT: when the min
RTT has not been refreshed for 10 s, the window drops to four packets for 200 ms so a
standing queue cannot inflate the model.

Loss does not move the model: a random loss removes one sample, not half the window. Two
exceptions keep it safe where loss is congestion after all: a **heavy, persistent loss**
(more than a fifth of what was sent lost in each of two consecutive round trips, at least
16 packets each: far beyond random loss) makes the bandwidth estimate forget its history and
cuts the window to 0.7 x, and **persistent congestion** (RFC 9002 7.6: every packet lost
for about three PTOs) drops the window to the RFC's minimum (two packets), clears the model
and starts over from STARTUP.

Pure Python with no QUIC library import: ``_aioquic.py`` registers it with aioquic and gives
aioquic's pacer :meth:`BbrCongestionControl.pacing_rate` (aioquic's own pacer would pace at
window / smoothed RTT, which is 2 x the model's rate). Per acknowledged packet the work is
a handful of arithmetic operations; the 10-round maximum is kept per round, not per sample.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

STARTUP = "startup"
DRAIN = "drain"
PROBE_BW = "probe_bw"
PROBE_RTT = "probe_rtt"
_INF = float("inf")

HIGH_GAIN = 2.885  # 2/ln 2: the smallest gain that doubles the delivery rate per round
DRAIN_GAIN = 1 / HIGH_GAIN
CWND_GAIN = 2.0  # a window of 2 BDP: room for delayed and aggregated ACKs
PACING_CYCLE = (1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
PROBE_BW_START_PHASE = 2  # after DRAIN, cruise first: the queue was just drained

BW_WINDOW_ROUNDS = 10
MIN_RTT_WINDOW = 10.0
PROBE_RTT_DURATION = 0.2
PROBE_RTT_PACKETS = 4

FULL_BW_GROWTH = 1.25  # STARTUP goes on while the bandwidth grows by this much per round...
FULL_BW_ROUNDS = 3  # ...and stops after this many rounds without

INITIAL_WINDOW_PACKETS = 10  # RFC 9002 7.2 (aioquic's K_INITIAL_WINDOW)
MINIMUM_WINDOW_PACKETS = 2  # RFC 9002 7.2 kMinimumWindow

# ACK aggregation (Linux BBR's extra_acked): bytes ACKed beyond what the bandwidth explains
# since an epoch began, max over two slots of 5 rounds, capped at 100 ms of the bandwidth
EXTRA_ACKED_SLOT_ROUNDS = 5
EXTRA_ACKED_MAX_TIME = 0.1
ACK_EPOCH_RESET_BYTES = 1 << 20

HEAVY_LOSS_FRACTION = 0.2
HEAVY_LOSS_MIN_PACKETS = 16  # a round of fewer packets says too little about a loss rate
HEAVY_LOSS_ROUNDS = 2
HEAVY_LOSS_BETA = 0.7

# A send this long after the previous one, with the window not full, means the application
# had nothing to send: samples from then on measure the application, not the path.
APP_IDLE_GAP = 0.004


class BbrCongestionControl:
    """Duck-typed to aioquic's ``QuicCongestionControl`` (``bytes_in_flight``,
    ``congestion_window``, ``ssthresh`` and the ``on_*`` calls); see the module doc.

    Of a packet it reads ``sent_bytes`` and ``sent_time`` (aioquic's ``QuicSentPacket``)
    and keeps its delivery-rate state on it as ``rate_sample`` (dropped with the packet)."""

    def __init__(self, *, max_datagram_size: int) -> None:
        self.mss = max_datagram_size
        self.bytes_in_flight = 0
        self.congestion_window = INITIAL_WINDOW_PACKETS * max_datagram_size
        self.ssthresh: int | None = None  # read by aioquic's qlog only
        self.min_window = MINIMUM_WINDOW_PACKETS * max_datagram_size
        self.round_count = 0
        self._reset_model()
        self.min_rtt = float("inf")
        self.min_rtt_stamp = 0.0
        self.smoothed_rtt = 0.0
        # delivery-rate estimation state
        self.delivered = 0
        self.delivered_time = 0.0
        self.first_sent_time = 0.0
        self.app_limited_until = 0  # `delivered` at which the app-limited period ends
        self.last_sent_time: float | None = None
        # round trips: a round ends when a packet sent after its start is acknowledged
        self.next_round_delivered = 0
        self.round_lost = 0
        self.round_acked = 0
        self.heavy_loss_rounds = 0
        self.heavy_loss_events = 0  # times the model backed off for loss (for diagnosis)
        self.probe_rtt_done_at: float | None = None

    def _reset_model(self) -> None:
        self.mode = STARTUP
        self.pacing_gain = HIGH_GAIN
        self.cwnd_gain = HIGH_GAIN
        self.btl_bw = 0.0  # bytes/s
        self.round_max_bw = 0.0  # the largest sample of the round in progress
        self.bw_rounds: deque[float] = deque(maxlen=BW_WINDOW_ROUNDS - 1)
        self.filled_pipe = False
        self.full_bw = 0.0
        self.full_bw_rounds = 0
        self.cycle_index = 0
        self.cycle_stamp = 0.0
        self.extra_acked = [0.0, 0.0]
        self.extra_acked_slot = 0
        self.extra_acked_slot_start = self.round_count
        self.ack_epoch_start: float | None = None
        self.ack_epoch_acked = 0

    # -- what the pacer and the tests read ---------------------------------------------

    def bdp(self, gain: float = 1.0) -> float:
        if not self.btl_bw or self.min_rtt == float("inf"):
            return float(INITIAL_WINDOW_PACKETS * self.mss)
        return gain * self.btl_bw * self.min_rtt

    def pacing_rate(self, smoothed_rtt: float | None = None) -> float:
        """Bytes per second to pace at. Before the first bandwidth sample: the initial
        window per RTT times the gain (as RFC 9002 7.7 paces, scaled for STARTUP)."""
        if self.btl_bw:
            return self.pacing_gain * self.btl_bw
        rtt = smoothed_rtt or self.smoothed_rtt or (
            self.min_rtt if self.min_rtt != float("inf") else 0.0)
        if rtt <= 0:
            return float("inf")
        return self.pacing_gain * self.congestion_window / rtt

    # -- aioquic's calls ---------------------------------------------------------------

    def on_packet_sent(self, *, packet: Any) -> None:
        now = packet.sent_time
        if self.bytes_in_flight == 0:
            # the first packet after idle: intervals start here, not at the last ACK
            self.first_sent_time = self.delivered_time = now
            if self.delivered:  # idle after a transfer: the application had nothing
                self.app_limited_until = self.delivered
        elif self.last_sent_time is not None:
            gap = now - self.last_sent_time
            if (gap > APP_IDLE_GAP and gap > 2 * self.mss / self.pacing_rate()
                    and self.bytes_in_flight + packet.sent_bytes < self.congestion_window):
                self.app_limited_until = self.delivered + self.bytes_in_flight
        self.last_sent_time = now
        packet.rate_sample = (self.delivered, self.delivered_time, self.first_sent_time,
                              self.app_limited_until != 0)
        self.bytes_in_flight += packet.sent_bytes

    def on_packet_acked(self, *, now: float, packet: Any) -> None:
        size = packet.sent_bytes
        self.bytes_in_flight -= size
        self.delivered += size
        self.delivered_time = now
        self.round_acked += 1
        state = getattr(packet, "rate_sample", None)
        if state is None:
            return
        p_delivered, p_delivered_time, p_first_sent, app_limited = state
        self.first_sent_time = packet.sent_time
        if self.app_limited_until and self.delivered > self.app_limited_until:
            self.app_limited_until = 0
        if p_delivered >= self.next_round_delivered:
            self.next_round_delivered = self.delivered
            self._end_round()
        # delivery rate over the longer of the send and ack intervals: the shorter one is
        # compressed by ACK aggregation or send bursts and would overestimate (and one
        # under a min RTT is compressed too: no sample, as in the draft)
        interval = packet.sent_time - p_first_sent
        ack_interval = now - p_delivered_time
        if ack_interval > interval:
            interval = ack_interval
        if self.min_rtt <= interval:
            bw = (self.delivered - p_delivered) / interval
            if bw > self.round_max_bw and (not app_limited or bw > self.btl_bw):
                self.round_max_bw = bw
                if bw > self.btl_bw:
                    self.btl_bw = bw
        self._update_ack_aggregation(now, size)
        self._update_mode(now)
        self._update_window(size)

    def on_packets_expired(self, *, packets: Iterable[Any]) -> None:
        for packet in packets:
            self.bytes_in_flight -= packet.sent_bytes

    def on_packets_lost(self, *, now: float, packets: Iterable[Any]) -> None:
        for packet in packets:
            self.bytes_in_flight -= packet.sent_bytes
            self.round_lost += 1

    def on_persistent_congestion(self) -> None:
        # RFC 9002 7.6.2: back to the minimum window. The model described a path that is
        # gone (a rerouted or cut link): start over and measure again.
        self._reset_model()
        self.congestion_window = self.min_window
        self.heavy_loss_rounds = 0

    def on_rtt_measurement(self, *, now: float, rtt: float) -> None:
        self.smoothed_rtt = rtt if not self.smoothed_rtt else (
            0.875 * self.smoothed_rtt + 0.125 * rtt)
        expired = now - self.min_rtt_stamp > MIN_RTT_WINDOW and self.mode != PROBE_RTT
        if rtt <= self.min_rtt or expired:
            expired = rtt > self.min_rtt
            self.min_rtt = rtt
            self.min_rtt_stamp = now
            if expired and self.filled_pipe and self.mode != PROBE_RTT:
                # the old minimum aged out: measure it afresh with the queue drained
                self._enter_probe_rtt()
                self.min_rtt_stamp = now

    def get_log_data(self) -> dict[str, Any]:
        return {"cwnd": self.congestion_window, "bytes_in_flight": self.bytes_in_flight,
                "bbr_mode": self.mode, "bbr_btl_bw": int(self.btl_bw)}

    # -- the model ---------------------------------------------------------------------

    def _end_round(self) -> None:
        self.round_count += 1
        # the 10-round maximum: one entry per finished round
        self.bw_rounds.append(self.round_max_bw)
        self.round_max_bw = 0.0
        self.btl_bw = max(self.bw_rounds, default=0.0)
        # heavy persistent loss: the path carries less than the model says
        sent = self.round_acked + self.round_lost
        if sent >= HEAVY_LOSS_MIN_PACKETS and self.round_lost > HEAVY_LOSS_FRACTION * sent:
            self.heavy_loss_rounds += 1
            if self.heavy_loss_rounds >= HEAVY_LOSS_ROUNDS:
                self.heavy_loss_rounds = 0
                self.heavy_loss_events += 1
                delivered_rate = self.bw_rounds[-1] if self.bw_rounds else 0.0
                self.bw_rounds.clear()
                self.btl_bw = delivered_rate
                self.bw_rounds.append(delivered_rate)
                self.congestion_window = max(
                    int(self.congestion_window * HEAVY_LOSS_BETA), self.min_window)
                if not self.filled_pipe:
                    self.filled_pipe = True
                    self._enter(DRAIN)
        else:
            self.heavy_loss_rounds = 0
        self.round_lost = self.round_acked = 0
        # STARTUP ends when the bandwidth stops growing (not on loss)
        if not self.filled_pipe and not self.app_limited_until:
            if self.btl_bw >= self.full_bw * FULL_BW_GROWTH:
                self.full_bw = self.btl_bw
                self.full_bw_rounds = 0
            else:
                self.full_bw_rounds += 1
                if self.full_bw_rounds >= FULL_BW_ROUNDS:
                    self.filled_pipe = True
                    self._enter(DRAIN)

    def _update_ack_aggregation(self, now: float, acked: int) -> None:
        """How far ACKs run ahead of the bandwidth: a receiver that acknowledges in batches
        (a busy host, a delayed-ACK timer) leaves nothing in flight between its batches unless
        the window holds that much beyond the BDP; at a small min RTT the batches are most of
        the window."""
        if self.round_count - self.extra_acked_slot_start >= EXTRA_ACKED_SLOT_ROUNDS:
            self.extra_acked_slot ^= 1
            self.extra_acked[self.extra_acked_slot] = 0.0
            self.extra_acked_slot_start = self.round_count
        start = self.ack_epoch_start
        expected = self.btl_bw * (now - start) if start is not None else 0.0
        if start is None or self.ack_epoch_acked <= expected or (
                self.ack_epoch_acked + acked >= ACK_EPOCH_RESET_BYTES):
            # ACKs came no faster than the model: a new epoch starts here
            self.ack_epoch_start = now
            self.ack_epoch_acked = 0
            expected = 0.0
        self.ack_epoch_acked += acked
        extra = self.ack_epoch_acked - expected
        if extra > self.congestion_window:
            extra = self.congestion_window
        slot = self.extra_acked_slot
        if extra > self.extra_acked[slot]:
            self.extra_acked[slot] = extra

    def _enter(self, mode: str, now: float = 0.0) -> None:
        self.mode = mode
        if mode == STARTUP:
            self.pacing_gain = self.cwnd_gain = HIGH_GAIN
        elif mode == DRAIN:
            self.pacing_gain, self.cwnd_gain = DRAIN_GAIN, HIGH_GAIN
        elif mode == PROBE_BW:
            self.cycle_index = PROBE_BW_START_PHASE
            self.cycle_stamp = now
            self.pacing_gain = PACING_CYCLE[self.cycle_index]
            self.cwnd_gain = CWND_GAIN
        else:
            self.pacing_gain, self.cwnd_gain = 1.0, 1.0

    def _enter_probe_rtt(self) -> None:
        self._enter(PROBE_RTT)
        self.probe_rtt_done_at = None

    def _update_mode(self, now: float) -> None:
        mode = self.mode
        if mode == DRAIN:
            if self.bytes_in_flight <= self.bdp():
                self._enter(PROBE_BW, now)
        elif mode == PROBE_BW:
            # each phase lasts one min RTT; the 0.75 phase ends early once the queue the
            # 1.25 phase built is gone
            elapsed = now - self.cycle_stamp
            if elapsed > self.min_rtt or (self.pacing_gain < 1.0
                                          and self.bytes_in_flight <= self.bdp()):
                self.cycle_index = (self.cycle_index + 1) % len(PACING_CYCLE)
                self.cycle_stamp = now
                self.pacing_gain = PACING_CYCLE[self.cycle_index]
        elif mode == PROBE_RTT:
            if self.probe_rtt_done_at is None:
                if self.bytes_in_flight <= PROBE_RTT_PACKETS * self.mss:
                    self.probe_rtt_done_at = now + PROBE_RTT_DURATION
            elif now >= self.probe_rtt_done_at:
                self.min_rtt_stamp = now
                if self.filled_pipe:
                    self._enter(PROBE_BW, now)
                else:
                    self._enter(STARTUP)

    def _update_window(self, acked: int) -> None:
        if self.mode == PROBE_RTT:
            self.congestion_window = max(min(self.congestion_window,
                                             PROBE_RTT_PACKETS * self.mss), self.min_window)
            return
        # Once per ACKed packet: plain comparisons, no calls. The target: gain x BDP, plus a
        # few packets for delayed ACKs at small BDPs, plus (once the bandwidth is known)
        # what ACK aggregation needs on top.
        mss = self.mss
        bw = self.btl_bw
        if bw and self.min_rtt != _INF:
            target = self.cwnd_gain * bw * self.min_rtt + 3 * mss
        else:
            target = (INITIAL_WINDOW_PACKETS + 3) * mss
        cwnd = self.congestion_window
        if self.filled_pipe:
            e0, e1 = self.extra_acked
            extra = e0 if e0 > e1 else e1
            cap = bw * EXTRA_ACKED_MAX_TIME
            target += extra if extra < cap else cap
            cwnd += acked
            if cwnd > target:
                cwnd = int(target)
        elif cwnd < target or self.delivered < INITIAL_WINDOW_PACKETS * mss:
            cwnd += acked
        self.congestion_window = cwnd if cwnd > self.min_window else self.min_window
