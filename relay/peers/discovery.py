"""Discovering publications (kvcs-draft 5.1, MOQT-PROFILE 15.2 step 2).

For each of the prompt's Block Keys, longest prefix first, the consumer SUBSCRIBE_NAMESPACEs
("kvcs-1", Scope ID, Compatibility ID, Anchor Key); each NAMESPACE suffix is a Publication
ID. The prefixes never overlap (same length, different Anchor Keys), so they are all sent at
once instead of one after the other: the answer for the longest prefix costs one round trip
whatever the prompt length. MOQT has no "end of the current list" marker, so discovery waits
``window`` seconds for the first NAMESPACE (a consumer that joins before production waits
longer), then ``grace`` seconds more for longer prefixes, and picks the longest.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from relay.kvcs.errors import NamespaceError
from relay.kvcs.namespace import KvcsNamespace, content_prefix, parse_namespace
from relay.session import MoqtSession, NamespaceSubscription, SessionFailure

MAX_PREFIXES = 64  # the longest prefixes searched; shorter ones are not worth a request
GRACE = 0.05


@dataclass(frozen=True)
class Candidate:
    """A publication that shares its first ``blocks`` blocks with the prompt."""

    namespace: KvcsNamespace
    blocks: int
    via: str = "namespace"  # or "index" for a namespace given by the caller


async def discover(session: MoqtSession, scope_id: bytes, compat_id: bytes,
                   keys: Sequence[bytes], *, window: float = 0.5, grace: float = GRACE,
                   max_prefixes: int = MAX_PREFIXES) -> list[Candidate]:
    """Candidates, longest shared prefix first (several publications of one prefix keep
    their announcement order)."""
    lengths = list(range(len(keys), 0, -1))[:max_prefixes]
    if not lengths:
        return []
    found: dict[KvcsNamespace, int] = {}
    arrived = asyncio.Event()
    subs: list[NamespaceSubscription] = []

    async def follow(n: int) -> None:
        try:
            sub = await session.subscribe_namespace(content_prefix(scope_id, compat_id,
                                                                   keys[n - 1]))
        except SessionFailure:
            return  # e.g. unauthorized for this scope: nothing found here
        subs.append(sub)
        async for ev in sub:
            if not ev.active:
                continue
            with contextlib.suppress(NamespaceError):
                ns = parse_namespace(ev.namespace)
                if ns.anchor_key == keys[n - 1]:
                    found.setdefault(ns, n)
                    arrived.set()

    tasks = [asyncio.ensure_future(follow(n)) for n in lengths]
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arrived.wait(), window)
        if found and max(found.values()) < lengths[0]:
            await asyncio.sleep(grace)  # a longer prefix's NAMESPACE may be on its way
    finally:
        for sub in subs:
            sub.cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    order = list(found)
    return sorted((Candidate(ns, n) for ns, n in found.items()),
                  key=lambda c: (-c.blocks, order.index(c.namespace)))
