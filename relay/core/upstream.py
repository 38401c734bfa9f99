"""Links to upstream relays (``--upstream URL``, tried in order, §14.4 relay trees).

A link keeps one client session to the first reachable upstream relay and re-dials on
demand after it dies, starting with the URL after the one it lost (the list is a ring: a
root tier's replicas, each as good as the others, docs/relay.md "A root of several
replicas"). The first dial starts at ``first`` (``upstream_spread``: see :func:`spread`).
Namespaces, subscriptions and fetches the relay cannot serve locally go through it.

Requests go on the link's first session while the upstream grants it a stream; when it grants
none (a peer grants a bounded number at once, qh3 100, and live subscriptions hold theirs for
as long as their Track is followed), another session to the same upstream is opened for them,
up to ``POOL_MAX`` in all (``for_request``). Only the first one announces and is asked down.

A dead upstream must not stall requests: the session's QUIC idle timeout is short (set by
the service from ``upstream_idle_timeout``, with PINGs keeping a quiet link alive), each dial
is bounded by the same timeout, and after a failed dial the link answers "unreachable" at
once until its backoff (doubling, capped) has passed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence

from relay.logs import reason_of
from relay.session import (
    LinkError,
    MoqtSession,
    QuicSettings,
    SessionConfig,
    SessionHandler,
    open_session,
)
from relay.session.errors import SessionFailure

log = logging.getLogger("kvcs.relay")

UNREACHABLE = "upstream unreachable"  # reason of the TIMEOUT refusals it causes
POOL_MAX = 4  # sessions to the upstream at most: the first, and more for requests
BACKOFF_FIRST = 0.25  # seconds before the first re-dial after a failed one
BACKOFF_MAX = 5.0


def spread(identity: str, n: int) -> int:
    """Which of ``n`` upstream URLs a relay named ``identity`` (its host name) dials first,
    so a tier's replicas spread over the replicas of the tier above instead of all taking
    the first: a StatefulSet pod's ordinal (``edge-5``: 5) modulo ``n``, so consecutive
    pods take consecutive upstreams; any other name by a stable hash."""
    if n <= 1:
        return 0
    _, _, tail = identity.rpartition("-")
    if tail.isdigit():
        return int(tail) % n
    return int.from_bytes(hashlib.sha256(identity.encode()).digest()[:8], "big") % n


class UpstreamLink:
    def __init__(self, urls: Sequence[str], *, config: SessionConfig,
                 settings: QuicSettings | None = None, handler: SessionHandler | None = None,
                 ca_file: str | os.PathLike[str] | None = None, insecure: bool = False,
                 dial_timeout: float = 10.0, first: int = 0) -> None:
        self.urls = list(urls)
        # where a dial starts: ``first`` until a session was made, then the URL after the
        # last session's (a lost upstream is likely dead: its peers are tried before it)
        self._next = first % len(self.urls) if self.urls else 0
        self.config = config
        self.settings = settings
        self.handler = handler
        # a handler per session for what the upstream asks of us (set by the Relay: requests
        # routed down the tree); ``handler`` is used when unset
        self.handler_factory: Callable[[], SessionHandler] | None = None
        self.ca_file = ca_file
        self.insecure = insecure
        self.dial_timeout = dial_timeout
        self._session: MoqtSession | None = None
        self._dialing: asyncio.Future[MoqtSession | None] | None = None
        self._backoff = 0.0
        self._retry_at = 0.0  # loop time before which no dial is tried
        self.connects = 0  # sessions established (the first one and every reconnection)
        self.failed_dials = 0
        self.lost = 0  # sessions that ended other than by our own close
        self._closing = False
        self._watch: asyncio.Future[None] | None = None
        # checks each new session before it carries a request (the Relay sets it:
        # relay/core/loops.py): why it must be refused, None if it may be used
        self.verify: Callable[[MoqtSession], Awaitable[str | None]] | None = None
        self._verifying: MoqtSession | None = None
        self._opened: asyncio.Future[None] | None = None  # the next session to verify is open
        # (URL, why) while the last dial found no usable URL and one led back to this
        # relay: the link is then no upstream at all, not an unreachable one
        self.looped: tuple[str, str] | None = None
        self._url = ""  # the URL the first session is on
        self._extra: list[MoqtSession] = []  # more sessions there, for requests
        self._extra_dialing: asyncio.Future[MoqtSession | None] | None = None

    @property
    def configured(self) -> bool:
        return bool(self.urls)

    @property
    def session(self) -> MoqtSession | None:
        """The session new requests go to: not a closed one, nor one whose peer sent GOAWAY
        (§4.3: start no new requests there; the next ``get`` dials again)."""
        s = self._session
        return s if s is not None and not s.closed and s.goaway_received is None else None

    @property
    def unreachable(self) -> bool:
        """Configured and no usable session: the last dial failed, or the session died
        (and no dial has replaced it yet)."""
        return self.configured and self.session is None and self.looped is None and \
            (self._backoff > 0 or self._session is not None)

    def _probe_session(self) -> MoqtSession | None:
        s = self._verifying
        return s if s is not None and not s.closed else self.session

    async def for_probe(self) -> MoqtSession | None:
        """Where a lower relay's loop probe goes on (relay/core/loops.py): the session in
        use, or one still being verified, else the next one open (dialled at once, whatever
        the backoff: a lower relay's dial is a demand like a request). Never waits for a
        verification, which may itself wait for this probe's answer. None while the last
        dial found only a loop: this relay has no upstream then, so a lower relay's path up
        ends here (dialling the loop again would refuse the lower relay as well)."""
        s = self._probe_session()
        if s is not None or not self.urls or self.looped is not None:
            return s
        if self._dialing is None or self._dialing.done():
            self._dialing = asyncio.ensure_future(self._dial())
        dialing = self._dialing
        while not dialing.done():
            if self._opened is None:
                self._opened = asyncio.get_running_loop().create_future()
            await asyncio.wait({dialing, self._opened}, return_when=asyncio.FIRST_COMPLETED)
            s = self._probe_session()
            if s is not None:
                return s
        return self._probe_session()

    async def get(self, *, wait: bool = False) -> MoqtSession | None:
        """The live upstream session, dialling the URLs in order if needed (None: none up).
        Within the backoff after a failed dial, None at once (``wait``: sleep it out and
        dial again). Concurrent callers share one dial, and a caller giving up (its own
        timeout) does not cut the dial short for the others."""
        if not self.urls:
            return None
        if self.session is not None:
            return self._session
        loop = asyncio.get_running_loop()
        if loop.time() < self._retry_at:
            if not wait:
                return None
            await asyncio.sleep(self._retry_at - loop.time())  # the link's own backoff
            if self.session is not None:
                return self._session
        if self._dialing is None or self._dialing.done():
            self._dialing = asyncio.ensure_future(self._dial())
        return await asyncio.shield(self._dialing)

    async def _open(self, url: str) -> MoqtSession:
        """A session to ``url`` (bounded by the dial timeout), its handler attached."""
        handler = self.handler_factory() if self.handler_factory else self.handler
        session = await asyncio.wait_for(open_session(
            url, config=self.config, handler=handler, settings=self.settings,
            ca_file=self.ca_file, insecure=self.insecure), self.dial_timeout)
        attach = getattr(handler, "attach", None)
        if attach is not None:
            attach(session)
        return session

    async def _dial(self) -> MoqtSession | None:
        loop = asyncio.get_running_loop()
        looped = None
        n = len(self.urls)
        for i in range(self._next, self._next + n):
            url = self.urls[i % n]
            try:
                session = await self._open(url)
            except (LinkError, SessionFailure, OSError, TimeoutError) as e:
                log.warning("upstream relay %s unreachable: %s", url, reason_of(e))
                continue
            refused = await self._verified(session)
            if refused is not None:
                looped = (url, refused)
                log.error("upstream relay %s refused: %s (it leads back to this relay)", url,
                          refused)
                continue
            if session.closed:
                log.warning("upstream relay %s unreachable: closed at once", url)
                continue
            log.info("connected to upstream relay %s", url)
            self._session = session
            self._url = url
            self._next = (i + 1) % n
            self._backoff = 0.0
            self.looped = None
            self.connects += 1
            self._watch = asyncio.ensure_future(self._watch_session(session, url))
            return session
        self.looped = looped
        self.failed_dials += 1
        self._backoff = min(BACKOFF_MAX, self._backoff * 2 or BACKOFF_FIRST)
        self._retry_at = loop.time() + self._backoff
        return None

    def sessions(self) -> list[MoqtSession]:
        """The link's sessions in use: the first, then those opened for requests."""
        first = self.session
        if first is None:
            return []
        self._extra = [s for s in self._extra if not s.closed and s.goaway_received is None]
        return [first, *self._extra]

    def owns(self, session: MoqtSession) -> bool:
        return session is self._session or session in self._extra

    async def for_request(self) -> MoqtSession | None:
        """The session one more request goes on: the first of the link's sessions the
        upstream still grants a stream on; when none does, a new one to the same upstream
        (up to ``POOL_MAX``, bounded by the dial timeout), else the first, where the request
        waits for a stream. None while the upstream is unreachable (``get``)."""
        if await self.get() is None:
            return None
        sessions = self.sessions()
        for s in sessions:
            rs = s.request_streams()
            if rs.out_in_use < rs.out_granted:
                return s
        if len(sessions) < POOL_MAX:
            if self._extra_dialing is None or self._extra_dialing.done():
                self._extra_dialing = asyncio.ensure_future(self._dial_extra(sessions[0]))
            extra = await asyncio.shield(self._extra_dialing)
            if extra is not None:
                return extra
        return sessions[0] if not sessions[0].closed else None

    async def _dial_extra(self, first: MoqtSession) -> MoqtSession | None:
        url = self._url
        try:
            session = await self._open(url)
        except (LinkError, SessionFailure, OSError, TimeoutError) as e:
            log.info("no more sessions to upstream relay %s: %s", url, reason_of(e))
            return None
        if self.verify is not None and await self.verify(session) is not None:
            return None  # a loop: the first session's own check will refuse it too
        if session.closed or first is not self._session or self._closing:
            await session.aclose(0, "not needed")
            return None
        self._extra.append(session)
        log.info("another session to upstream relay %s (%d in all): requests found no stream "
                 "left on the others", url, len(self._extra) + 1)
        return session

    async def _verified(self, session: MoqtSession) -> str | None:
        """Why ``session`` must not be used (``verify`` closed it), None if it may."""
        if self.verify is None:
            return None
        self._verifying = session
        if self._opened is not None:
            self._opened.set_result(None)
            self._opened = None
        try:
            refused = await self.verify(session)
        except BaseException:
            session.close(0, "")
            raise
        finally:
            self._verifying = None
        return refused

    async def _watch_session(self, session: MoqtSession, url: str) -> None:
        code, reason = await session.wait_closed()
        if not self._closing:
            # an idle timeout here is the upstream's death noticed (no PING answered)
            self.lost += 1
            log.warning("upstream relay %s lost: code 0x%x %s", url, code, reason)

    async def close(self) -> None:
        self._closing = True
        for task in (self._watch, self._dialing):
            if task is not None:
                task.cancel()
        for extra in self._extra:
            extra.close(0, "relay shutting down")
        s = self._session
        if s is not None:
            await s.aclose(0, "relay shutting down")
