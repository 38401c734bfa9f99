"""Relay loops: an upstream path that leads back to the relay is refused (docs/relay.md,
"Trees", "Cycles").

A tree has no loops by construction (announcements go up only, requests from the upstream
are answered from own sources only), but a configuration can make one: A's ``--upstream``
is B and B's is A. A request for a Track nobody has would then circle A -> B -> A until its
FILL_TIMEOUT. So every new upstream session is probed before it carries a request: a
TRACK_STATUS for the reserved namespace ``(".kvcs-relay-loop", <relay id>, ...)`` (MOQT
reserves namespaces whose first field starts with "."). A relay that receives a probe from a
lower relay looks for its own id in the trail: there, the path up has come back to it (a
loop); else it adds its id and sends the probe on up its own upstream session, and passes on
the answer. A relay with no upstream session answers DOES_NOT_EXIST: no loop. The relay
whose probe came back refuses that upstream session (``UpstreamLink.verify``).

A relay's id is the same in every worker of one relay (the supervisor makes it), since a
loop may pass through two workers of one relay; it names the host and port, so the log line
of a refused loop says which relays it went through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from typing import TYPE_CHECKING

from relay.moqt.codes import RequestErrorCode
from relay.moqt.primitives import TrackNamespace
from relay.session import IncomingTrackStatus, LinkError, MoqtSession, RequestRejected
from relay.session.errors import SessionFailure

from .namespaces import Reach
from .routing import is_tree_relay, runs_this_code

if TYPE_CHECKING:
    from .counters import Counters
    from .upstream import UpstreamLink

log = logging.getLogger("kvcs.relay")

PROBE_FIELD = b".kvcs-relay-loop"
PROBE_TRACK = b"probe"
MAX_TRAIL = 31  # relay ids a probe holds: the namespace's 32 fields (§2.7) but the first
LOOP = "relay loop"  # the reason of a loop's REQUEST_ERROR begins so (code NOT_SUPPORTED)
CLOSE_REASON = "relay loop refused"  # the reason this relay closes a refused session with
# How long a relay passing a probe on waits for its own upstream session (dialled at once,
# whatever its backoff), and how long ``start_relay`` waits for the first one: a reachable
# upstream answers a handshake and a probe far sooner.
PROBE_WAIT = 1.0


class RelayLoop(Exception):
    """The upstream a relay starts with leads back to it (a start error: one line)."""


def new_relay_id(port: int) -> str:
    """An id naming this relay in probes and loop reports: host, port and a random tag
    (two relays of one host and port, one after the other, are told apart)."""
    return f"{socket.gethostname()[:64]}:{port}/{secrets.token_hex(3)}"


def is_probe(namespace: TrackNamespace) -> bool:
    return bool(namespace) and namespace[0] == PROBE_FIELD


def _is_loop(e: RequestRejected) -> bool:
    return e.code == RequestErrorCode.NOT_SUPPORTED and e.reason.startswith(LOOP)


def _printable(text: str) -> str:
    """Another relay's text, fit for a log line (§2.6: sanitize before logging)."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _names(trail: TrackNamespace) -> list[str]:
    return [_printable(f.decode("utf-8", "replace")) for f in trail]


def _reason(text: str) -> str:
    return text.encode()[:1024].decode("utf-8", "ignore")  # a Reason Phrase's bound (§2.6)


class LoopProbe:
    """This relay's side of the loop probe: its id, the probes it sends up a new upstream
    session (``verify``) and those it answers from a lower relay (``answer``)."""

    def __init__(self, counters: Counters, upstream: UpstreamLink | None) -> None:
        # who this relay is in probes; start_relay names it after its port once it listens,
        # a supervisor's workers share their relay's
        self.relay_id = new_relay_id(0)
        self.counters = counters
        self.upstream = upstream

    async def verify(self, session: MoqtSession) -> str | None:
        """Probe a new upstream session before it carries requests (``UpstreamLink.verify``):
        why it must be refused (the probe came back: a loop; the session is closed), else
        None. An upstream that is no kvcs relay, or does not answer in time, is not a loop."""
        if not runs_this_code(session):
            return None
        link = self.upstream
        assert link is not None  # only the upstream link verifies its sessions
        try:
            await asyncio.wait_for(
                session.track_status((PROBE_FIELD, self.relay_id.encode()), PROBE_TRACK),
                link.dial_timeout)
        except RequestRejected as e:
            if _is_loop(e):
                self.counters.upstream_loops += 1
                session.close(0, CLOSE_REASON)  # NO_ERROR: a configuration to fix, not a fault
                return _printable(e.reason)
        except (TimeoutError, SessionFailure, LinkError):
            pass
        return None

    async def answer(self, req: IncomingTrackStatus, session: MoqtSession,
                     reach: Reach) -> None:
        """A probe arriving at this relay: refused as a loop if it passed here before, else
        sent on up (and its answer passed back). Only from a lower relay (never down a tree
        nor between workers), and with no token: it asks for nobody's Track."""
        if reach is not Reach.ALL or not is_tree_relay(session):
            await req.reject(RequestErrorCode.DOES_NOT_EXIST, "reserved namespace")
            return
        ns = req.full_name.namespace
        trail, me = ns[1:], self.relay_id.encode()
        if me in trail or len(trail) >= MAX_TRAIL:
            path = _names((*trail[trail.index(me):], me)) if me in trail else \
                [*_names(trail[:2]), "...", f"({len(trail)} relays)"]
            why = _reason(f"{LOOP}: {' -> '.join(path)}")
            log.warning("%s (probe of %s came back here)", why, _names(trail[:1])[0])
            await req.reject(RequestErrorCode.NOT_SUPPORTED, why)
            return
        link = self.upstream
        up = None
        if link is not None:
            # none open in time: no loop through it yet (its own dial probes, later)
            with contextlib.suppress(TimeoutError):
                up = await asyncio.wait_for(link.for_probe(), PROBE_WAIT)
        if link is not None and up is not None and runs_this_code(up):
            try:
                await asyncio.wait_for(up.track_status((*ns, me), PROBE_TRACK),
                                       link.dial_timeout)
            except RequestRejected as e:
                if _is_loop(e):
                    await req.reject(e.code, e.reason)
                    return
            except (TimeoutError, SessionFailure, LinkError):
                pass
        await req.reject(RequestErrorCode.DOES_NOT_EXIST, "no relay loop")


async def refuse_at_start(link: UpstreamLink) -> None:
    """At start: dial the upstream (bounded: an unreachable one is dialled again later, and
    a loop found then is refused at run time) and raise :class:`RelayLoop` if every URL
    that answered leads back here."""
    try:
        await asyncio.wait_for(link.get(), min(link.dial_timeout, PROBE_WAIT))
    except TimeoutError:
        return
    if link.session is None and link.looped is not None:
        url, why = link.looped
        raise RelayLoop(f"upstream {url} leads back to this relay ({why}); "
                        "a relay tree must have no cycle")


__all__ = ["PROBE_FIELD", "LoopProbe", "RelayLoop", "is_probe", "new_relay_id",
           "refuse_at_start"]
