"""Announcing upward (MOQT-PROFILE §14.4 row "Announcing upward"; docs/relay.md, "Trees").

A relay with an upstream tells it what this relay itself can serve, so a Track published at
any relay of a tree is routable from every other: the namespaces its own clients announced
(publishers, and lower relays announcing to it in turn), the Tracks its publishers push with
PUBLISH, and the namespaces of the complete Tracks it holds in LMDB (also after a restart).
Never what it learned from its upstream or from a sibling worker: a tree has no loops.

Aggregated by prefix: one PUBLISH_NAMESPACE per distinct first ``fields`` fields of those
namespaces (1 by default: ``("kvcs-1",)``, one for every KVCS publication and scope), however
many publications and sources lie under it. Each announcement holds a request stream open for
its lifetime and QUIC bounds concurrent streams per session (qh3: 100), so one per scope could
not carry a relay holding thousands of scopes. The upstream then asks for the namespaces under
each prefix (SUBSCRIBE_NAMESPACE down the same session, answered from this relay's own
sources): one stream carries them all, and the upstream admits each by this relay's token.
A namespace the token does not cover (known here when this relay's token table holds it) is
never shown to the upstream.

The announcement ends (its request stream cancelled) when the last source under the prefix
goes: publisher gone, purge, eviction, expiry. One that failed (no answer in time, the
stream not granted yet) is sent again after a pause (doubling, capped) while it is wanted.
After the upstream session is lost, or replaced by the next ``--upstream`` URL, everything
is announced again on the new one.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from relay.logs import reason_of
from relay.moqt.codes import RequestErrorCode
from relay.moqt.primitives import (
    TrackNamespace,
    format_namespace,
    namespace_matches_prefix,
    prefixes_overlap,
)
from relay.session import LinkError, MoqtSession, RequestRejected
from relay.session.errors import SessionFailure

from .auth import Authorizer, Role
from .namespaces import NamespaceListener, NamespaceTable, own_source

if TYPE_CHECKING:
    from .counters import Counters
    from .upstream import UpstreamLink

log = logging.getLogger("kvcs.relay")


# seconds before a failed announcement (or an upstream's subscription down to a lower
# relay) is sent again, doubling up to RETRY_MAX
RETRY_FIRST = 0.5
RETRY_MAX = 5.0


class _Pending:
    """A PUBLISH_NAMESPACE sent and not yet answered (its identity tells attempts apart)."""


class UpwardAnnouncer:
    def __init__(self, namespaces: NamespaceTable, auth: Authorizer, counters: Counters,
                 link: UpstreamLink, fields: int, token: bytes | None,
                 answer_timeout: float) -> None:
        self.namespaces = namespaces
        self.auth = auth
        self.counters = counters
        self.link = link
        self.answer_timeout = answer_timeout  # for the upstream's answer to an announcement
        self.fields = fields  # 0: announce whole namespaces
        self.token = token
        self._wanted: dict[TrackNamespace, int] = {}  # prefix -> own namespaces under it
        # what the current session carries: the accepted announcement, or one in flight
        self._sent: dict[TrackNamespace, Any] = {}
        self._refused: set[TrackNamespace] = set()  # on the current session: not again
        self._session: MoqtSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.listener = NamespaceListener((), self._on_namespace, shows=own_source)
        for ns in namespaces.add_listener(self.listener):
            self.add(ns)

    # -- what there is to announce ----------------------------------------------------------------

    def prefix_of(self, namespace: TrackNamespace) -> TrackNamespace:
        return namespace[:self.fields] if self.fields else namespace

    def _on_namespace(self, namespace: TrackNamespace, active: bool) -> None:
        if active:
            self.add(namespace)
        else:
            self.remove(namespace)

    def add(self, namespace: TrackNamespace) -> None:
        """One more own namespace under ``namespace``'s prefix."""
        if not self.covers(namespace):
            self.counters.upstream_announcements_uncovered += 1
            log.info("not announced upstream (the upstream token does not cover it): %s",
                     format_namespace(namespace))
            return
        p = self.prefix_of(namespace)
        n = self._wanted.get(p, 0)
        self._wanted[p] = n + 1
        if n == 0:
            self._changed(p)

    def remove(self, namespace: TrackNamespace) -> None:
        if not self.covers(namespace):
            return
        p = self.prefix_of(namespace)
        n = self._wanted.get(p, 0)
        if n > 1:
            self._wanted[p] = n - 1
        elif n == 1:
            del self._wanted[p]
            self._changed(p)

    @property
    def announced(self) -> list[TrackNamespace]:
        """The prefixes the upstream accepted on the current session."""
        return [p for p, h in self._sent.items() if not isinstance(h, _Pending)]

    def _token_known(self) -> bool:
        """This relay's own token table holds our upstream token (one table for a whole
        tree): what it covers is known here; otherwise the upstream decides."""
        return self.token is not None and any(hmac.compare_digest(g.token, self.token)
                                              for g in self.auth.grants)

    def covers(self, namespace: TrackNamespace) -> bool:
        """May our upstream token publish ``namespace`` (as far as known here)?"""
        if not self._token_known():
            return True
        assert self.token is not None
        return self.auth.allows(Role.PUBLISH, namespace, [self.token])

    def offered(self, namespace: TrackNamespace) -> bool:
        """Under a prefix announced (or being announced) on the current session, and
        covered by our token."""
        return any(namespace_matches_prefix(namespace, p) for p in self._sent) and \
            self.covers(namespace)

    # -- the upstream session ---------------------------------------------------------------------

    def start(self) -> None:
        """Keep a session to the upstream while there is something to announce (called
        once the event loop runs; changes start it too)."""
        if self._task is None and self._wanted and not self._closing:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # built outside an event loop (a tool): nothing to announce to
            self._task = loop.create_task(self._run())

    def _changed(self, prefix: TrackNamespace) -> None:
        session = self._session
        if session is None or session.closed:
            self.start()
            return
        if prefix in self._wanted:
            if prefix not in self._sent and prefix not in self._refused:
                self._announce(session, prefix)
            return
        handle = self._sent.pop(prefix, None)
        if handle is not None and not isinstance(handle, _Pending):
            handle.withdraw()
            log.info("withdrawn from the upstream relay: %s", format_namespace(prefix))

    async def _run(self) -> None:
        try:
            while self._wanted and not self._closing:
                session = await self.link.get(wait=True)
                if session is None:
                    continue  # dial failed: get(wait=True) sleeps out the link's backoff
                self._session = session
                self._sent.clear()
                self._refused.clear()
                for p in list(self._wanted):
                    self._announce(session, p)
                await session.wait_closed()
                self._session = None
        finally:
            self._task = None

    def _announce(self, session: MoqtSession, prefix: TrackNamespace,
                  pause: float = RETRY_FIRST) -> None:
        pending = _Pending()
        self._sent[prefix] = pending
        session.spawn(self._send(session, prefix, pending, pause), "announce-up")

    async def _send(self, session: MoqtSession, prefix: TrackNamespace,
                    pending: _Pending, pause: float) -> None:
        try:
            handle = await asyncio.wait_for(session.publish_namespace(prefix),
                                            self.answer_timeout)
        except RequestRejected as e:
            if self._sent.get(prefix) is pending:
                del self._sent[prefix]
                if e.code == RequestErrorCode.UNAUTHORIZED:
                    self._refused.add(prefix)  # not asked again on this session
            self.counters.upstream_announcements_refused += 1
            log.warning("upstream relay refused the announcement of %s: %s (0x%x); it is "
                        "served here only", format_namespace(prefix), e.reason, e.code)
            return
        except (SessionFailure, LinkError, TimeoutError) as e:
            if self._sent.get(prefix) is not pending:
                return
            del self._sent[prefix]
            log.info("announcement of %s upstream failed: %s; sent again in %.1f s",
                     format_namespace(prefix), reason_of(e), pause)
            await asyncio.sleep(pause)  # a back-off timer: nothing to wait on
            if session is self._session and not session.closed and \
                    prefix in self._wanted and prefix not in self._sent and \
                    prefix not in self._refused:
                self.counters.upstream_announcements_retried += 1
                self._announce(session, prefix, min(pause * 2, RETRY_MAX))
            return
        if self._sent.get(prefix) is not pending or session is not self._session:
            handle.withdraw()  # no longer wanted, or the session was replaced meanwhile
            return
        self._sent[prefix] = handle
        log.info("announced to the upstream relay: %s", format_namespace(prefix))

    async def close(self) -> None:
        self._closing = True
        self.namespaces.remove_listener(self.listener)
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class AnnouncedAuthority:
    """What the upstream relay may ask of us (requests routed down our upstream session):
    what we announced to it. It authorized its own clients per scope before routing their
    requests down, and sends no tokens of its own; this relay chose to trust it by dialling
    it (and verifying its certificate)."""

    def __init__(self, announcer: UpwardAnnouncer | None) -> None:
        self.announcer = announcer

    def allows(self, role: Role, namespace: TrackNamespace, tokens: Iterable[bytes]) -> bool:
        return self.announcer is not None and self.announcer.offered(namespace)

    def allows_prefix(self, role: Role, prefix: TrackNamespace, tokens: Iterable[bytes]
                      ) -> bool:
        return self.announcer is not None and \
            any(prefixes_overlap(prefix, p) for p in self.announcer._sent)
