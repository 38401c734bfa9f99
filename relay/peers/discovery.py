"""Discovering publications (kvcs-draft 5.1, MOQT-PROFILE 15.2 step 2).

Every prefix of the prompt is searched, with at most ``max_prefixes`` requests:

- a prompt of up to ``max_prefixes`` blocks: for each Block Key, the consumer
  SUBSCRIBE_NAMESPACEs ("kvcs-1", Scope ID, Compatibility ID, Anchor Key); each NAMESPACE
  suffix is a Publication ID. The prefixes never overlap (same length, different Anchor
  Keys), so they are all sent at once: the longest prefix costs one round trip.
- a longer prompt: one SUBSCRIBE_NAMESPACE for ("kvcs-1", Scope ID, Compatibility ID),
  which the relay answers with every publication of that model in the scope; the consumer
  keeps those whose Anchor Key is one of its Block Keys. Per-key requests would overlap it
  (PREFIX_OVERLAP), and one per key would grow with the prompt; a prompt that runs far past
  a shared system prompt is exactly the case where the shorter publication matters. A relay
  that refuses the model-wide prefix gets the per-key requests for the 64 longest instead.

MOQT has no "end of the current list" marker, so discovery waits ``window`` seconds for the
first match (a consumer that joins before production waits longer), then ``grace`` seconds
more for longer prefixes, and picks the longest.
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
    model_prefix,
    parse_namespace,
)
from relay.moqt.codes import RequestErrorCode
from relay.session import MoqtSession, NamespaceSubscription, RequestRejected, SessionFailure

MAX_PREFIXES = 64  # longer prompts are searched with one model-wide request
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
    their announcement order). Prefixes the relay refused as UNAUTHORIZED (with no
    narrower prefix left to try) are added to ``denied``."""
    if not keys:
        return []
    blocks_of = {key: n for n, key in enumerate(keys, 1)}  # Anchor Key -> prefix blocks
    per_key = [content_prefix(scope_id, compat_id, key)
               for key in reversed(keys[-max_prefixes:])]
    found: dict[KvcsNamespace, int] = {}
    arrived = asyncio.Event()
    subs: list[NamespaceSubscription] = []

    async def follow(prefix: Namespace) -> None:
        try:
            sub = await session.subscribe_namespace(prefix)
        except SessionFailure as e:
            if len(prefix) < 4:
                # a relay that grants per-prefix access only: the longest prefixes, then
                await asyncio.gather(*(follow(p) for p in per_key))
            elif denied is not None and isinstance(e, RequestRejected) and \
                    e.code == RequestErrorCode.UNAUTHORIZED:
                denied.append(str(e))
            return  # e.g. unauthorized for this scope: nothing found here
        subs.append(sub)
        async for ev in sub:
            if not ev.active:
                continue
            with contextlib.suppress(NamespaceError):
                ns = parse_namespace(ev.namespace)
                n = blocks_of.get(ns.anchor_key)
                if n is not None and ns.fields[:len(prefix)] == prefix:
                    found.setdefault(ns, n)
                    arrived.set()

    prefixes = [model_prefix(scope_id, compat_id)] if len(keys) > max_prefixes else per_key
    tasks = [asyncio.ensure_future(follow(p)) for p in prefixes]
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arrived.wait(), window)
        if found and max(found.values()) < len(keys):
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
