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
- **Bounded.** At most half the streams the upstream grants are held for this at once
  (and never fewer than ``MIN_HELD``). A new prefix beyond that takes the place of the
  oldest subscription already answered: that one is released upstream early, and its
  listeners keep what it had announced (frozen: no later changes from above). Were new
  prefixes to wait for a stream instead, many consumers discovering at once would each hold
  part of a wave (a consumer's wave ends only once all of its requests are answered), and
  none could finish: 32 consumers of 16-block prompts at one edge under a qh3 root found
  nothing within the answer wait.
- **Followed across outages.** While listeners remain, a lost upstream session is
  subscribed again on the next one.

What the upstream announces becomes routable there (LearnedNamespaces.follow), as learned,
never as this relay's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from relay.moqt.primitives import TrackNamespace, format_namespace, namespace_matches_prefix
from relay.session import LinkError, MoqtSession, RequestRejected
from relay.session.errors import SessionFailure

from .namespaces import PublisherEntry

if TYPE_CHECKING:
    from .learned import LearnedNamespaces
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
MIN_HELD = 8  # upstream subscriptions always allowed at once, whatever the grant


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
        self.established = False  # its upstream REQUEST_OK came
        self.frozen = False  # released early: its entries stay for its listeners only


class UpstreamNamespaces:
    def __init__(self, learned: LearnedNamespaces, link: UpstreamLink) -> None:
        self.learned = learned
        self.link = link
        self._subs: dict[TrackNamespace, _Subscription] = {}
        # holding (or asking for) an upstream stream now, oldest first
        self._live: dict[_Subscription, None] = {}
        self._live_changed = asyncio.Event()
        self.frozen = 0  # subscriptions released early for want of streams (counted)

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
        if sub.interests:
            return
        if self._subs.get(sub.prefix) is sub:
            del self._subs[sub.prefix]
            self._cancel(sub)
        elif sub.frozen:  # its last listener gone: what it had announced goes too
            for entry in sub.entries.values():
                self.learned.drop(entry)
            sub.entries.clear()

    async def _hold(self, sub: _Subscription, up: MoqtSession) -> None:
        """Until ``sub`` may hold an upstream stream (see the module doc, "Bounded")."""
        while True:
            limit = max(MIN_HELD, up.request_streams().out_granted // 2)
            if len(self._live) < limit:
                self._live[sub] = None
                return
            # the oldest whose listeners have what the upstream knew when it answered
            oldest = next((s for s in self._live if s.established and s.answered.is_set()),
                          None)
            if oldest is not None:
                self._freeze(oldest)
                continue
            self._live_changed.clear()
            await self._live_changed.wait()

    def _caught_up(self, sub: _Subscription) -> None:
        sub.answered.set()
        self._live_changed.set()  # one more that may give its place up

    def _let_go(self, sub: _Subscription) -> None:
        if self._live.pop(sub, None) is not None:
            self._live_changed.set()

    def _freeze(self, sub: _Subscription) -> None:
        """Release ``sub`` upstream now; its listeners keep what it announced."""
        self.frozen += 1
        if self._subs.get(sub.prefix) is sub:
            del self._subs[sub.prefix]  # a new listener of its prefix subscribes afresh
        sub.frozen = True
        following = sub.entries
        sub.entries = dict(following)
        following.clear()  # the dict its follower holds: its end removes nothing
        sub.handed.clear()
        self._let_go(sub)
        if sub.task is not None:
            sub.task.cancel()

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
                await self._hold(sub, up)
                try:
                    nsub = await up.subscribe_namespace(sub.prefix)
                except RequestRejected as e:
                    log.info("upstream SUBSCRIBE_NAMESPACE %s refused: %s",
                             format_namespace(sub.prefix), e)
                    self._drop_handed(sub)
                    sub.answered.set()
                    return
                except (SessionFailure, LinkError):
                    self._let_go(sub)
                    sub.answered.set()
                    continue  # the session died meanwhile: the next one
                sub.established = True
                grace = asyncio.get_running_loop().call_later(
                    HANDOVER_GRACE, self._drop_handed, sub) if sub.handed else None
                try:
                    # answered once what came with the upstream's REQUEST_OK (the namespaces
                    # it knew then, §7.13) is in the table: a listener answered now has it
                    await self.learned.follow(nsub, up, entries=sub.entries, handed=sub.handed,
                                          caught_up=lambda: self._caught_up(sub))
                finally:
                    nsub.cancel()
                    sub.established = False
                    self._let_go(sub)
                    if grace is not None:
                        grace.cancel()
                if not up.closed:
                    await asyncio.sleep(RESUBSCRIBE_PAUSE)  # ended by the upstream: again
        finally:
            self._let_go(sub)
            self._drop_handed(sub)
            sub.answered.set()

    def _drop_handed(self, sub: _Subscription) -> None:
        """What narrower subscriptions had learned and this one did not announce again."""
        for ns in list(sub.handed):
            entry = sub.entries.pop(ns, None)
            if entry is not None:
                self.learned.drop(entry)
        sub.handed.clear()


__all__ = ["UPSTREAM_ANSWER_WAIT", "Interest", "UpstreamNamespaces"]
