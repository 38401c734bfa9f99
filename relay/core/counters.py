"""What the relay counts, as typed fields: the core adds to them, relay/metrics.py exports
every one of them (docs/metrics.md), tests read them. Nothing here decides anything: the
fills and FETCHes in flight, which draining waits for, are an `InFlight` with its own event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from relay.moqt.codes import session_error_meaning
from storage.interface import Tier


class InFlight:
    """Fills or FETCHes being served now; `idle` is set while there are none."""

    def __init__(self) -> None:
        self.count = 0
        self.idle = asyncio.Event()
        self.idle.set()

    @contextmanager
    def one(self) -> Iterator[None]:
        self.count += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self.idle.set()


@dataclass
class ServeStats:
    """What one fill or FETCH served (relay/core/range_serve.py's walk), added to `Served`."""

    objects: int = 0
    bytes: int = 0
    by_tier: dict[Tier, int] = field(default_factory=dict)
    markers: int = 0
    upstream_fetches: int = 0
    reset: bool = False


@dataclass
class Served:
    """Serving from the cache, of one kind (fills, or FETCHes)."""

    bytes: int = 0
    objects: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(Tier, 0))
    upstream_lookups: int = 0  # ranges no tier held, asked upstream
    unknown_ranges: int = 0  # End of Range markers (or a reset stream): unknown or timed out
    in_flight: InFlight = field(default_factory=InFlight)
    # the latency histogram (relay/metrics.py registers it; None: not recorded)
    observe: Callable[[float], None] | None = None

    def done(self, stats: ServeStats, seconds: float) -> None:
        self.bytes += stats.bytes
        for tier, n in stats.by_tier.items():
            self.objects[tier] += n
        self.upstream_lookups += stats.upstream_fetches
        self.unknown_ranges += stats.markers + int(stats.reset)
        if self.observe is not None:
            self.observe(seconds)


@dataclass
class Counters:
    # sessions, by transport ("quic", "webtransport"); closes also by session close code
    sessions_accepted: dict[str, int] = field(default_factory=dict)
    sessions_closed: dict[tuple[str, int], int] = field(default_factory=dict)
    sessions_refused: int = 0  # max_sessions reached
    # requests answered, by message type name and result (None: ok, else the error code)
    requests: dict[tuple[str, int | None], int] = field(default_factory=dict)
    auth_failures: int = 0
    # the data path
    objects_received: int = 0
    bytes_received: int = 0
    objects_sent: int = 0  # on subscriptions (fills and FETCHes: `fill`, `fetch`)
    bytes_sent: int = 0
    too_far_behind: int = 0
    # a Track's ingest waiting for its subscribers to drain (ingest_pacing.py)
    ingest_waits: int = 0
    ingest_wait_seconds: float = 0.0
    fill: Served = field(default_factory=Served)
    fetch: Served = field(default_factory=Served)
    # upstream
    upstream_subscriptions: int = 0
    upstream_fetches: int = 0
    upstream_fetched_objects: int = 0
    upstream_unreachable: int = 0
    upstream_announcements_refused: int = 0
    upstream_announcements_uncovered: int = 0
    upstream_announcements_retried: int = 0
    upstream_pushes: int = 0
    upstream_pushes_failed: int = 0
    upstream_loops: int = 0  # upstream sessions refused: their loop probe came back
    # LMDB
    lmdb_committed_tracks: int = 0
    lmdb_committed_bytes: int = 0
    lmdb_full: int = 0
    lmdb_expired_tracks: int = 0
    # the admin API
    admin_unauthorized: int = 0
    admin_purged_tracks: int = 0

    def session_accepted(self, transport: str) -> None:
        self.sessions_accepted[transport] = self.sessions_accepted.get(transport, 0) + 1

    def session_closed(self, transport: str, code: int) -> None:
        """The peer chooses its close code: counted by its meaning, an unknown one (GREASE
        included) as INTERNAL_ERROR as the spec reads it (§4.5), so the keys stay bounded."""
        key = (transport, session_error_meaning(code))
        self.sessions_closed[key] = self.sessions_closed.get(key, 0) + 1

    def answered(self, message_type: str, code: int | None) -> None:
        key = (message_type, code)
        self.requests[key] = self.requests.get(key, 0) + 1

    def ok(self, message_type: str) -> int:
        """Requests of this type answered with success (SUBSCRIBE_OK, FETCH_OK, ...).
        Inspection (tests): /metrics exports it as ``requests_total{result="ok"}``."""
        return self.requests.get((message_type, None), 0)

    async def wait_idle(self) -> None:
        """Until no fill or FETCH is being served."""
        while self.fill.in_flight.count or self.fetch.in_flight.count:
            await self.fill.in_flight.idle.wait()
            await self.fetch.in_flight.idle.wait()


__all__ = ["Counters", "InFlight", "ServeStats", "Served"]
