"""Discovering publications (kvcs-draft 5.1, MOQT-PROFILE 15.2 step 2).

Every prefix of the prompt is searched the way the profile describes: for each Block Key,
longest prefix first, the consumer SUBSCRIBE_NAMESPACEs ("kvcs-1", Scope ID, Compatibility
ID, Anchor Key); each NAMESPACE suffix is a Publication ID. The prefixes never overlap (same
length, different Anchor Keys), so up to ``max_prefixes`` of them are in flight at once (a
wave; request streams are the limit). A prompt of more blocks is searched in waves, longest
first: a wave in which every request was answered (REQUEST_OK) and no NAMESPACE followed
within ``grace`` is withdrawn and the next, shorter, one is sent. The cost grows with the
prompt, never with how many publications the relay holds: a single model-wide request
("kvcs-1", Scope ID, Compatibility ID) would be answered with every publication of the
model (10,000 NAMESPACE messages for a relay holding 10,000), so it is never sent.

MOQT has no "end of the current list" marker. A relay sends the NAMESPACEs of what it holds
right after REQUEST_OK on the same stream, so ``grace`` after the last REQUEST_OK of a wave
closes it; the last wave (the only one of a short prompt) waits ``window`` seconds from the
start for a first match (a consumer that joins before production waits longer), then
``grace`` more for longer prefixes. The longest match wins.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from relay.kvcs.errors import NamespaceError
from relay.kvcs.namespace import (
    KvcsNamespace,
    Namespace,
    content_prefix,
    parse_namespace,
)
from relay.moqt.codes import RequestErrorCode
from relay.session import MoqtSession, NamespaceSubscription, RequestRejected, SessionFailure

MAX_PREFIXES = 64  # SUBSCRIBE_NAMESPACEs in flight at once (a wave); longer prompts take more
GRACE = 0.05


@dataclass(frozen=True)
class Candidate:
    """A publication that shares its first ``blocks`` blocks with the prompt."""

    namespace: KvcsNamespace
    blocks: int
    via: str = "namespace"  # or "index" for a namespace given by the caller


async def discover(session: MoqtSession, scope_id: bytes, compat_id: bytes,
                   keys: Sequence[bytes], *, window: float = 0.5, grace: float = GRACE,
                   max_prefixes: int = MAX_PREFIXES, denied: list[str] | None = None
                   ) -> list[Candidate]:
    """Candidates, longest shared prefix first (several publications of one prefix keep
    their announcement order). Prefixes the relay refused as UNAUTHORIZED are added to
    ``denied``."""
    if not keys:
        return []
    blocks_of = {key: n for n, key in enumerate(keys, 1)}  # Anchor Key -> prefix blocks
    longest_first = [content_prefix(scope_id, compat_id, key) for key in reversed(keys)]
    waves = [longest_first[i:i + max_prefixes]
             for i in range(0, len(longest_first), max_prefixes)]
    found: dict[KvcsNamespace, int] = {}
    until = asyncio.get_running_loop().time() + window
    for n, wave in enumerate(waves):
        last = n == len(waves) - 1
        await _search(session, wave, blocks_of, found, denied, grace,
                      until=until if last else None, whole=len(keys))
        if found:
            break
    order = list(found)
    return sorted((Candidate(ns, n) for ns, n in found.items()),
                  key=lambda c: (-c.blocks, order.index(c.namespace)))


async def _search(session: MoqtSession, prefixes: list[Namespace], blocks_of: dict[bytes, int],
                  found: dict[KvcsNamespace, int], denied: list[str] | None, grace: float, *,
                  until: float | None, whole: int) -> None:
    """One wave: follow ``prefixes`` until a match (then ``grace`` for a longer one), or
    until every request was answered and ``grace`` passed (and, given ``until``, that loop
    time too: the last wave waits out the window for a publication still to come)."""
    arrived = asyncio.Event()
    all_answered = asyncio.Event()
    unanswered = len(prefixes)
    subs: list[NamespaceSubscription] = []

    def answered() -> None:
        nonlocal unanswered
        unanswered -= 1
        if not unanswered:
            all_answered.set()

    async def follow(prefix: Namespace) -> None:
        try:
            sub = await session.subscribe_namespace(prefix)
        except SessionFailure as e:
            answered()
            if denied is not None and isinstance(e, RequestRejected) and \
                    e.code == RequestErrorCode.UNAUTHORIZED:
                denied.append(str(e))
            return  # e.g. unauthorized for this scope: nothing found here
        subs.append(sub)
        answered()
        async for ev in sub:
            if not ev.active:
                continue
            with contextlib.suppress(NamespaceError):
                ns = parse_namespace(ev.namespace)
                n = blocks_of.get(ns.anchor_key)
                if n is not None and ns.fields[:len(prefix)] == prefix:
                    found.setdefault(ns, n)
                    arrived.set()

    async def over() -> None:
        await all_answered.wait()
        await asyncio.sleep(grace)  # the NAMESPACEs that follow the last REQUEST_OK
        if until is not None:  # and not before the window is over
            await asyncio.sleep(until - asyncio.get_running_loop().time())

    tasks = [asyncio.ensure_future(follow(p)) for p in prefixes]
    ends = [asyncio.ensure_future(arrived.wait()), asyncio.ensure_future(over())]
    try:
        await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        if found and max(found.values()) < whole:
            await asyncio.sleep(grace)  # a longer prefix's NAMESPACE may be on its way
    finally:
        for sub in subs:
            sub.cancel()
        for t in (*ends, *tasks):
            t.cancel()
        await asyncio.gather(*ends, *tasks, return_exceptions=True)
