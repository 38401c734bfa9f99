"""Taking publications out of the relay on an operator's request (the admin API's purge).

A purged Track is gone from both tiers, its live subscriptions end with PUBLISH_DONE, its
upstream subscription is cancelled (a bad production stops), and namespaces left with no
Track and no publisher are withdrawn from discoverers with NAMESPACE_DONE. Afterwards a
FETCH finds nothing to serve (DOES_NOT_EXIST), also after a restart, since LMDB forgot it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from relay.moqt.codes import PublishDoneCode
from relay.moqt.primitives import FullTrackName, TrackNamespace, namespace_matches_prefix
from storage.interface import TrackKey

if TYPE_CHECKING:
    from .relay import Relay

# How long a cancelled upstream subscription may take to wind down before its Track is
# dropped anyway (its ingest task aborts the memory entry when it ends).
UPSTREAM_STOP_TIMEOUT = 2.0


@dataclass
class Removed:
    key: TrackKey
    tiers: list[str]
    bytes: int


@dataclass
class PurgeResult:
    removed: list[Removed] = field(default_factory=list)
    subscriptions_ended: int = 0
    namespaces_done: list[TrackNamespace] = field(default_factory=list)


def known_tracks(relay: Relay) -> set[TrackKey]:
    """Every Track the relay knows: registry, memory tier and LMDB."""
    keys: set[TrackKey] = {(tuple(n.namespace), bytes(n.name)) for n in relay.tracks}
    keys.update(relay.store.memory.tracks())
    if relay.store.durable is not None:
        keys.update((tuple(ns), bytes(name)) for ns, name in relay.store.durable.tracks())
    return keys


def tiers_of(relay: Relay, key: TrackKey) -> dict[str, int]:
    """Bytes held per tier (only tiers that hold some of the Track)."""
    out: dict[str, int] = {}
    mem = relay.store.memory.info(key)
    if mem is not None and mem.groups:
        out["memory"] = mem.nbytes
    durable = relay.store.durable
    if durable is not None:
        info = durable.info(key)
        if info is not None:
            out["lmdb"] = info.nbytes
    return out


async def purge(relay: Relay, prefix: TrackNamespace) -> PurgeResult:
    """Remove every Track whose namespace matches ``prefix`` (field-wise, §2.7)."""
    result = PurgeResult()
    keys = sorted(k for k in known_tracks(relay) if namespace_matches_prefix(k[0], prefix))
    # Under the commit lock: no commit in flight can write a purged Track back to LMDB.
    async with relay.persistence.lock:
        for key in keys:
            tiers = tiers_of(relay, key)
            result.subscriptions_ended += await _stop_track(relay, FullTrackName(*key))
            relay.store.memory.drop_track(key)
            durable = relay.store.durable
            if durable is not None:
                await asyncio.wrap_future(durable.submit(durable.delete_track, key))
            result.removed.append(Removed(key, sorted(tiers), sum(tiers.values())))
    purged_ns = {k[0] for k in keys}
    for ns in list(relay.namespaces.namespaces()):
        if namespace_matches_prefix(ns, prefix) and (
                ns in purged_ns or ns in relay.persistence.cached):
            relay.persistence.forget_namespace(ns)
            relay.learned.forget_kept(ns)
            if relay.namespaces.remove_namespace(ns):
                result.namespaces_done.append(ns)
    relay.counters.admin_purged_tracks += len(result.removed)
    return result


async def _stop_track(relay: Relay, name: FullTrackName) -> int:
    """End the Track's subscriptions and its upstream; forget its registry entry."""
    track = relay.registry.remove(name)
    if track is None:
        return 0
    track.stop_committing()
    ended = 0
    for f in list(track.forwarders):
        f.upstream_done(PublishDoneCode.EXPIRED, "purged by the operator")
        ended += 1
    for sub in list(track.upstreams):
        sub.cancel()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + UPSTREAM_STOP_TIMEOUT
    while track.upstreams and loop.time() < deadline:
        await track.wait_change(deadline - loop.time())
    return ended


__all__ = ["PurgeResult", "Removed", "known_tracks", "purge", "tiers_of"]
