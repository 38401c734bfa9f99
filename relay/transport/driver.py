"""Driving a QUIC library's sans-IO connection over asyncio: datagrams in, events, datagrams
out, one timer.

:class:`QuicDriver` is the I/O half of an :class:`~relay.transport.endpoint.Endpoint` (the
other half routes the events to sessions and streams). Datagrams arrive one at a time, or in
a burst of the burst reader (burst.py), whose datagrams go to the library in one call and
whose events and transmissions run once, at its end; a GRO read goes uncut to a library that
cuts it itself. Datagrams leave through the GSO sender (gso.py). A transmit the library
fails to build is retried with a backoff.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .backend import QuicBackend
from .burst import BURST
from .gso import DatagramSender

log = logging.getLogger(__name__)

# Retrying a transmit the library failed to build: first delay, doubling up to the last.
_RETRY_FIRST = 0.001
_RETRY_MAX = 0.1


class QuicDriver(asyncio.DatagramProtocol):
    """One QUIC connection's I/O, through the calls aioquic and qh3 share. A subclass
    handles the events (``quic_event_received``), looks for a peer's close the library has
    not reported yet (``_check_peer_close``) and wakes what a transmit unblocks
    (``_after_transmit``)."""

    def __init__(self, quic: Any, backend: QuicBackend) -> None:
        self._loop = asyncio.get_running_loop()
        self._quic = quic
        self._b = backend
        # the burst reader hands this endpoint GRO reads uncut (gro_received)
        self.takes_gro = backend.receive_gro is not None
        self._ev = backend.events
        self._take_events = backend.take_events
        self._transport: asyncio.DatagramTransport | None = None
        self._sender: DatagramSender | None = None  # set by client/server: GSO batching
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._transmit_task: asyncio.Handle | None = None
        self._retry: asyncio.TimerHandle | None = None  # after a failed transmit
        self._retry_delay = _RETRY_FIRST
        # set by the backend's QuicServer (both libraries use these names)
        self._connection_id_issued_handler: Any = lambda cid: None
        self._connection_id_retired_handler: Any = lambda cid: None
        self._connection_terminated_handler: Any = lambda: None
        self._burst_dirty = False
        self._pending: list[bytes] = []  # datagrams of the current burst, not yet fed
        self._pending_addr: Any = None

    def quic_event_received(self, event: Any) -> None:
        raise NotImplementedError

    def _check_peer_close(self) -> None:
        raise NotImplementedError

    def _after_transmit(self) -> None:
        raise NotImplementedError

    def transmit_soon(self) -> None:
        if self._transmit_task is None:
            self._transmit_task = self._loop.call_soon(self.transmit)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connect(self, addr: Any) -> None:
        self._quic.connect(addr, now=self._loop.time())
        self.transmit()

    def close(self) -> None:
        """Close the QUIC connection (the backend's QuicServer calls this on shutdown)."""
        self._quic.close()
        self.transmit()

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        if BURST.active:
            # Part of a burst (see burst.py): handed to QUIC in one call and processed
            # once, at its end (a native core decrypts the whole batch in one go).
            if self._pending and addr != self._pending_addr:
                self._receive_pending()
            self._pending.append(data)  # type: ignore[arg-type]
            self._pending_addr = addr
            self._flush_after_burst()
            return
        self._quic.receive_datagram(data, addr, now=self._loop.time())
        self.burst_flush()

    def gro_received(self, buffer: bytes, segment: int, addr: Any) -> None:
        """One GRO read of this connection's datagrams (burst.py), for a backend whose
        library cuts it itself (``takes_gro``); processed like any datagram of a burst."""
        assert self._b.receive_gro is not None
        if self._pending:
            self._receive_pending()  # in the order they came
        self._b.receive_gro(self._quic, buffer, segment, addr, self._loop.time())
        self._flush_after_burst()

    def _flush_after_burst(self) -> None:
        """Events and transmissions once, when the burst reader's burst ends."""
        if not self._burst_dirty:
            self._burst_dirty = True
            BURST.dirty.append(self)

    def _receive_pending(self) -> None:
        pending, self._pending = self._pending, []
        self._b.receive_many(self._quic, pending, self._pending_addr, self._loop.time())

    def burst_flush(self) -> None:
        self._burst_dirty = False
        if self._pending:
            self._receive_pending()
        if self._take_events is not None:
            self._take_events(self._quic)
        self._process_events()
        self.transmit()
        self._check_peer_close()

    def _process_events(self) -> None:
        quic, e = self._quic, self._ev
        event = quic.next_event()
        while event is not None:
            t = type(event)
            if t is e.ConnectionIdIssued:
                self._connection_id_issued_handler(event.connection_id)
            elif t is e.ConnectionIdRetired:
                self._connection_id_retired_handler(event.connection_id)
            elif t is e.ConnectionTerminated:
                self._connection_terminated_handler()
            self.quic_event_received(event)
            event = quic.next_event()

    def _handle_timer(self) -> None:
        now = max(self._timer_at or 0.0, self._loop.time())
        self._timer = None
        self._timer_at = None
        self._quic.handle_timer(now=now)
        self._process_events()
        self.transmit()
        self._check_peer_close()

    def transmit(self) -> None:
        self._transmit_task = None
        transport = self._transport
        if transport is not None and not transport.is_closing():
            datagrams, error = self._b.poll_datagrams(self._quic, self._loop.time())
            if error is not None:
                self._transmit_failed(error)
            elif self._retry is not None:
                self._retry.cancel()
                self._retry = None
                self._retry_delay = _RETRY_FIRST
            if self._sender is not None:
                self._sender.send(datagrams)
            else:
                for data, addr in datagrams:
                    transport.sendto(data, addr)
        timer_at = self._quic.get_timer()
        if self._timer is not None and (timer_at is None or timer_at < self._timer_at):
            self._timer.cancel()
            self._timer = None
        if self._timer is None and timer_at is not None:
            self._timer = self._loop.call_at(timer_at, self._handle_timer)
            self._timer_at = timer_at
        # A later deadline keeps the timer armed for the earlier one: at a full rate every
        # transmit moves the library's deadline on, and re-arming each time (a cancelled
        # handle left in the loop's heap, a new one pushed) was a cost per transmit. Fired
        # early, the timer finds nothing due (the library checks its deadlines against the
        # time given) and the transmit after it arms the real deadline.
        self._after_transmit()

    def _transmit_failed(self, error: Exception) -> None:
        """The library could not build everything it had to send (qh3: "packet builder
        capacity exhausted"); what it built before was sent. Often nothing changes until
        the peer sends again (a server's anti-amplification budget after a lost first
        Initial), and every datagram received transmits again anyway; the one retry kept
        here, backing off to ``_RETRY_MAX``, covers a sender the peer has nothing to say to.
        A fixed 1 ms retry per failure spun thousands of times a second."""
        if self._retry is not None:
            log.debug("%s: transmit failed (%s); a retry is due", self._b.name, error)
            return
        log.debug("%s: transmit failed (%s); retrying in %.0f ms", self._b.name, error,
                  self._retry_delay * 1000)
        self._retry = self._loop.call_later(self._retry_delay, self._retry_transmit)
        self._retry_delay = min(self._retry_delay * 2, _RETRY_MAX)

    def _retry_transmit(self) -> None:
        self._retry = None
        self.transmit()
