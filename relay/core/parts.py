"""The parts of the relay a downstream session's requests reach (handler.py, track_offers.py),
built once by `Relay` (relay.py) and handed to every session's handler: each part is the
small object it is, none of them the Relay."""

from __future__ import annotations

from dataclasses import dataclass

from relay.options import RelayOptions

from .announce import UpwardAnnouncer
from .auth import Authorizer
from .counters import Counters
from .loops import LoopProbe
from .namespaces import NamespaceTable
from .push import UpstreamPush
from .registry import TrackRegistry
from .rendezvous import Rendezvous
from .routing import Routing


@dataclass(frozen=True)
class RelayParts:
    options: RelayOptions
    auth: Authorizer
    counters: Counters
    namespaces: NamespaceTable
    registry: TrackRegistry
    routing: Routing
    rendezvous: Rendezvous  # SUBSCRIBEs held for a publisher (RENDEZVOUS_TIMEOUT)
    loops: LoopProbe
    instance: str  # this relay process's, in its sibling links' SETUP (siblings.py)
    announcer: UpwardAnnouncer | None  # with an upstream only
    push: UpstreamPush | None  # with an upstream and ``upstream_push`` only


__all__ = ["RelayParts"]
