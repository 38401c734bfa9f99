"""SUBSCRIBE_NAMESPACE upstream on behalf of the relay's own listeners (MOQT-PROFILE §14.4 row
"SUBSCRIBE_NAMESPACE": "a relay configured with an upstream relay also sends (aggregated)
SUBSCRIBE_NAMESPACE upstream for the prefix"; docs/relay.md "Trees").

Each one holds a request stream of the one session to the upstream relay, and a peer grants a
bounded number of them (qh3: 100). So they are held only while a local listener needs them:

- **Counted by listener.** A listener's prefix is covered by the upstream subscription of its
  own prefix or of a wider one (field-wise prefix of it); the subscription is withdrawn
  (its stream cancelled) as soon as its last listener goes. A consumer's discovery costs the
  link its prefixes for the length of its waves, not for the life of the relay.
- **Aggregated by prefix.** A wider prefix asked while narrower ones are held replaces them
  (one session cannot hold overlapping prefixes: PREFIX_OVERLAP, §2.7): their listeners move
  to it, and what they had learned stays in the namespace table until the wider
  subscription has had ``HANDOVER_GRACE`` to announce it again, so no listener sees a
  namespace withdrawn and announced again.
- **Followed across outages.** While listeners remain, a lost upstream session is
  subscribed again on the next one.

What the upstream announces becomes routable there (Routing.follow_namespaces), as learned,
never as this relay's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from relay.moqt.primitives import TrackNamespace, format_namespace, namespace_matches_prefix
from relay.session import LinkError, RequestRejected
from relay.session.errors import SessionFailure

from .namespaces import PublisherEntry

if TYPE_CHECKING:
    from .routing import Routing
    from .upstream import UpstreamLink

log = logging.getLogger("kvcs.relay")

# A SUBSCRIBE_NAMESPACE waits at most this long for the upstream relay's answer before it is
# answered from what this relay knows: the upstream's NAMESPACEs follow its REQUEST_OK at
# once, so a consumer that reads for a short grace after our REQUEST_OK sees them, and a
# slow upstream never holds back what the relay itself holds.
UPSTREAM_ANSWER_WAIT = 1.0
# How long a wider subscription that replaced narrower ones has to announce again what they
# had learned before the rest is withdrawn (its NAMESPACEs follow its REQUEST_OK at once).
HANDOVER_GRACE = 1.0
# Between two attempts on a live session whose upstream ended our subscription.
RESUBSCRIBE_PAUSE = 1.0


class Interest:
    """One local listener's share of an upstream namespace subscription."""

    __slots__ = ("_owner", "prefix", "sub")

    def __init__(self, owner: UpstreamNamespaces, prefix: TrackNamespace,
                 sub: _Subscription) -> None:
        self._owner = owner
        self.prefix = prefix
        self.sub = sub

    async def answered(self, timeout: float) -> None:
        """Until the upstream answered (or could not be asked), at most ``timeout``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.sub.answered.wait()), timeout)

    def release(self) -> None:
        self._owner.release(self)


class _Subscription:
    """One SUBSCRIBE_NAMESPACE upstream and the namespaces it taught the relay."""

    def __init__(self, prefix: TrackNamespace) -> None:
        self.prefix = prefix
        self.interests: set[Interest] = set()
        self.answered = asyncio.Event()
        # namespace -> its entry in the table (shared with the follower, which adds and
        # removes; emptied when handed over, so the follower's end removes nothing)
        self.entries: dict[TrackNamespace, PublisherEntry] = {}
        self.handed: set[TrackNamespace] = set()  # taken over, not announced again yet
        self.task: asyncio.Task[None] | None = None


class UpstreamNamespaces:
    def __init__(self, routing: Routing, link: UpstreamLink) -> None:
        self.routing = routing
        self.link = link
        self._subs: dict[TrackNamespace, _Subscription] = {}

    @property
    def held(self) -> list[TrackNamespace]:
        """The prefixes subscribed upstream now (or being subscribed)."""
        return list(self._subs)

    def acquire(self, prefix: TrackNamespace) -> Interest:
        for p, sub in self._subs.items():
            if namespace_matches_prefix(prefix, p):  # p covers prefix
                return self._join(sub, prefix)
        sub = _Subscription(prefix)
        narrower = [s for p, s in self._subs.items() if namespace_matches_prefix(p, prefix)]
        for old in narrower:
            del self._subs[old.prefix]
            for i in old.interests:
                i.sub = sub
            sub.interests |= old.interests
            old.interests.clear()
            sub.entries.update(old.entries)
            sub.handed.update(old.entries)
            old.entries.clear()
            self._cancel(old)
        self._subs[prefix] = sub
        sub.task = asyncio.get_running_loop().create_task(self._run(sub))
        return self._join(sub, prefix)

    def _join(self, sub: _Subscription, prefix: TrackNamespace) -> Interest:
        interest = Interest(self, prefix, sub)
        sub.interests.add(interest)
        return interest

    def release(self, interest: Interest) -> None:
        sub = interest.sub
        sub.interests.discard(interest)
        if not sub.interests and self._subs.get(sub.prefix) is sub:
            del self._subs[sub.prefix]
            self._cancel(sub)

    @staticmethod
    def _cancel(sub: _Subscription) -> None:
        sub.answered.set()
        if sub.task is not None:
            sub.task.cancel()

    def close(self) -> None:
        for sub in list(self._subs.values()):
            self._cancel(sub)
        self._subs.clear()

    async def _run(self, sub: _Subscription) -> None:
        first = True
        try:
            while True:
                # a first attempt never waits out the link's backoff: an outage must not
                # hold the answer back (the relay answers from what it knows)
                up = await self.link.get(wait=not first)
                first = False
                if up is None:
                    self._drop_handed(sub)
                    sub.answered.set()
                    continue
                try:
                    nsub = await up.subscribe_namespace(sub.prefix)
                except RequestRejected as e:
                    log.info("upstream SUBSCRIBE_NAMESPACE %s refused: %s",
                             format_namespace(sub.prefix), e)
                    self._drop_handed(sub)
                    sub.answered.set()
                    return
                except (SessionFailure, LinkError):
                    sub.answered.set()
                    continue  # the session died meanwhile: the next one
                sub.answered.set()
                grace = asyncio.get_running_loop().call_later(
                    HANDOVER_GRACE, self._drop_handed, sub) if sub.handed else None
                try:
                    await self.routing.follow_namespaces(nsub, up, entries=sub.entries,
                                                         handed=sub.handed)
                finally:
                    nsub.cancel()
                    if grace is not None:
                        grace.cancel()
                if not up.closed:
                    await asyncio.sleep(RESUBSCRIBE_PAUSE)  # ended by the upstream: again
        finally:
            self._drop_handed(sub)
            sub.answered.set()

    def _drop_handed(self, sub: _Subscription) -> None:
        """What narrower subscriptions had learned and this one did not announce again."""
        for ns in list(sub.handed):
            entry = sub.entries.pop(ns, None)
            if entry is not None:
                self.routing.drop_learned(entry)
        sub.handed.clear()


__all__ = ["UPSTREAM_ANSWER_WAIT", "Interest", "UpstreamNamespaces"]
