"""The connector's one session (one QUIC connection) to its relay, for puts, gets and lookups.

LMCache runs every connector coroutine on one event loop of its own (a thread it owns; the
sync methods hand their coroutine to that loop), so the session lives on that loop and is
only touched from it. It is dialled on first use, and again on the next use after it was
lost (the relay restarted, went away, or a request got no answer in time). After a failed
dial nothing is dialled for ``RETRY_S``: every call meanwhile is a miss at once, so an engine
whose relay is down recomputes instead of waiting on every chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from relay.logs import reason_of
from relay.peers.connect import connect
from relay.session import MoqtSession, SessionHandler

from .settings import KvcsSettings

log = logging.getLogger("kvcs.lmcache")
RETRY_S = 1.0  # after a failed dial, misses without dialling for this long


@dataclass
class LinkStats:
    sessions_opened: int = 0  # handshakes that gave a session: 1 for a connector's life
    dials_failed: int = 0
    sessions_dropped: int = 0


class RelayLink:
    def __init__(self, settings: KvcsSettings, handler: SessionHandler) -> None:
        self.settings = settings
        self.handler = handler  # answers the relay's requests (our chunks in flight)
        self.stats = LinkStats()
        self._session: MoqtSession | None = None
        self._dialling = asyncio.Lock()
        self._down_until = 0.0

    @property
    def down(self) -> bool:
        """A dial failed less than RETRY_S ago: callers miss without waiting."""
        return time.monotonic() < self._down_until

    @property
    def current(self) -> MoqtSession | None:
        s = self._session
        return s if s is not None and not s.closed else None

    async def session(self) -> MoqtSession | None:
        """The session, dialled if there is none; None while the relay is unreachable (a
        miss, not an error). Concurrent callers share one dial."""
        s = self.current
        if s is not None:
            return s
        async with self._dialling:
            s = self.current
            if s is not None or self.down:
                return s
            self._session = None
            try:
                self._session = await connect(self.settings.relay_url, self.settings.access,
                                              self.handler)
                self.stats.sessions_opened += 1
            except Exception as e:
                self.stats.dials_failed += 1
                log.warning("KVCS relay unreachable, LMCache recomputes: %s", reason_of(e))
            finally:
                # also when the caller's bound cancelled the dialling
                if self._session is None:
                    self._down_until = time.monotonic() + RETRY_S
            return self._session

    def drop(self, session: MoqtSession | None, reason: str) -> None:
        """Forget ``session`` after a failure on it (the next use dials again); a failure on a
        session already replaced leaves the new one alone."""
        if session is None or session is not self._session:
            return
        log.info("KVCS session dropped (%s)", reason)
        self.stats.sessions_dropped += 1
        self._session = None
        with contextlib.suppress(Exception):
            session.close()

    async def close(self) -> None:
        s, self._session = self._session, None
        if s is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.aclose(), self.settings.timeout)
