"""The admin API, under ``/admin/`` on the metrics listener: ``GET /admin/state`` (what the
relay holds) and ``POST /admin/purge`` (take publications out).

It is a security boundary. It is off (404) unless an admin token is configured, whatever the
listen address; every request must carry ``Authorization: Bearer <token>``, compared in
constant time; a wrong or missing one is 401, changes nothing and is counted
(``kvcs_relay_admin_unauthorized_total``). The token is never logged.

Namespaces are shown and given in the one namespace text form (relay/moqt/namespace_text.py:
``kvcs-1/hex:<scope>/hex:<compat>/hex:<anchor>/hex:<pub>``), the form the token table, the
peers and the logs use; a Track Name is written as one of its fields is.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from relay.core.purge import known_tracks, purge, tiers_of
from relay.http import Answer, BadRequest, read_body
from relay.moqt.namespace_text import format_field, format_namespace, parse_namespace
from relay.moqt.primitives import FullTrackName, TrackNamespace

if TYPE_CHECKING:
    from relay.core.relay import Relay

log = logging.getLogger("kvcs.admin")

PREFIX = "/admin/"
# A worker's half of a purge through the supervisor (relay/workers.py): once every worker
# has purged, each forgets its routes to siblings for the namespaces any of them withdrew.
SIBLING_ROUTES = PREFIX + "purge-sibling-routes"
JSON = "application/json"


def parse_prefix(text: str) -> TrackNamespace:
    """A purge's prefix: namespace text naming at least the first field."""
    try:
        prefix = parse_namespace(text)
    except ValueError as e:
        raise BadRequest(f"prefix {text!r}: {e}") from None
    if not prefix:
        raise BadRequest("prefix is empty: name at least the first field, e.g. kvcs-1")
    return prefix


def scope_totals(tracks: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tracks and bytes per tier per scope (the namespace's second field, in hex as in
    ``[scopes."<hex>"]`` and the metrics' ``scope`` label), from the ``tracks`` entries of
    ``GET /admin/state``."""
    scopes: dict[str, dict[str, int]] = {}
    for t in tracks:
        fields = parse_namespace(t["namespace"])
        sc = scopes.setdefault(fields[1].hex() if len(fields) > 1 else "", {"tracks": 0})
        sc["tracks"] += 1
        for tier, n in t["bytes"].items():
            sc[f"{tier}_bytes"] = sc.get(f"{tier}_bytes", 0) + n
    return [{"scope": s, **v} for s, v in sorted(scopes.items())]


def links_state(relay: Relay) -> list[dict[str, Any]]:
    """Request streams per link (``out``: this relay's requests; ``in``: the peer's), in use
    and granted: each upstream, sibling and lower-relay session on its own, the clients
    summed. The upstream link also lists what it holds there for a long time."""
    out: list[dict[str, Any]] = []
    clients = {"link": "client", "sessions": 0,
               "requests_out": {"in_use": 0, "granted": 0},
               "requests_in": {"in_use": 0, "granted": 0}}
    for kind, session in relay.links():
        rs = session.request_streams()
        streams = {"requests_out": {"in_use": rs.out_in_use, "granted": rs.out_granted},
                   "requests_in": {"in_use": rs.in_in_use, "granted": rs.in_granted}}
        if kind == "client":
            clients["sessions"] += 1
            for d in ("requests_out", "requests_in"):
                for k in ("in_use", "granted"):
                    clients[d][k] += streams[d][k]
            continue
        entry: dict[str, Any] = {"link": kind, "peer": str(session.conn.remote_address),
                                 **streams}
        if kind == "upstream":
            ann, held = relay.announcer, relay.routing.upstream_namespaces
            entry["announcements"] = sorted(format_namespace(p) for p in ann.announced) \
                if ann is not None else []
            entry["namespace_subscriptions"] = sorted(format_namespace(p) for p in held.held) \
                if held is not None else []
        out.append(entry)
    return [*out, clients]


class AdminAuth:
    """The admin token check, shared by a relay's listener and the supervisor's."""

    def __init__(self, token: str) -> None:
        self._digest = hashlib.sha256(token.encode()).digest()

    def authorized(self, headers: Mapping[str, str]) -> bool:
        scheme, _, value = headers.get("authorization", "").partition(" ")
        # compare_digest on every request, also for a missing header, and of equal-length
        # digests: neither the token's bytes nor its length show in the timing
        ok = hmac.compare_digest(
            hashlib.sha256(value.strip().encode()).digest(),
            self._digest)
        return ok and scheme.lower() == "bearer"


def _json(status: int, doc: Any) -> Answer:
    return status, JSON, (json.dumps(doc, indent=1) + "\n").encode()


def _error(status: int, message: str) -> Answer:
    return status, "text/plain", (message + "\n").encode()


class AdminApi:
    """Routes ``/admin/*`` requests of the metrics listener."""

    def __init__(self, relay: Relay, token: str) -> None:
        self.relay = relay
        self._auth = AdminAuth(token)

    def authorized(self, headers: Mapping[str, str]) -> bool:
        return self._auth.authorized(headers)

    def note_refused(self, method: str, path: str, why: str) -> None:
        """A request refused before its token could be accepted: counted and logged (never
        the token; method and path cut short, since a client chooses them)."""
        self.relay.counters.admin_unauthorized += 1
        log.warning("admin request refused: %s (%s %s)", why, method[:16], path[:64])

    def check(self, method: str, path: str, headers: Mapping[str, str]) -> Answer | None:
        """The answer to a request without the token (401), before anything else of it is
        looked at; None when the token is right."""
        if self.authorized(headers):
            return None
        self.note_refused(method, path, "missing or wrong token")
        return 401, "text/plain", b"unauthorized\n"

    async def route(self, method: str, path: str, headers: Mapping[str, str],
                    reader: asyncio.StreamReader) -> Answer:
        """The token first, from the headers alone: a request without it learns nothing
        else (not even whether its body would have been acceptable) and is counted."""
        refused = self.check(method, path, headers)
        if refused is not None:
            return refused
        return await self.serve(method, path, await read_body(headers, reader))

    async def serve(self, method: str, path: str, body: bytes) -> Answer:
        """An authorized request."""
        if path == PREFIX + "state":
            if method not in ("GET", "HEAD"):
                return _error(405, "use GET")
            return _json(200, self.state())
        if path == PREFIX + "purge":
            if method != "POST":
                return _error(405, "use POST")
            try:
                prefix = _purge_prefix(body)
            except BadRequest as e:
                return _error(400, str(e))
            return _json(200, await self.purge(prefix))
        if path == SIBLING_ROUTES:
            if method != "POST":
                return _error(405, "use POST")
            try:
                namespaces = _namespace_list(body)
            except BadRequest as e:
                return _error(400, str(e))
            return _json(200, self.purge_sibling_routes(namespaces))
        return _error(404, "not found")

    def purge_sibling_routes(self, namespaces: Sequence[TrackNamespace]) -> dict[str, Any]:
        """Forget the routes to sibling workers of ``namespaces`` (docs/workers.md).

        A worker withdrawing a namespace does not always reach its siblings in time: an
        announcement it sent before its purge may arrive at a sibling that had purged
        already, and it never tells its siblings of a namespace it no longer holds
        itself. Left alone, such a route makes the sibling answer a FETCH of the purged
        Track as if it existed somewhere (INVALID_RANGE, not DOES_NOT_EXIST). Listeners
        of a namespace whose last route this was get NAMESPACE_DONE, as from a purge.
        """
        relay = self.relay
        removed = 0
        done = []
        for ns in namespaces:
            had = ns in relay.namespaces
            for e in relay.namespaces.sources_of(ns):
                if e.source in relay.siblings:
                    relay.namespaces.remove_publisher(e)
                    removed += 1
            if had and ns not in relay.namespaces:
                done.append(format_namespace(ns))
        return {"routes_removed": removed, "namespaces_done": done}

    def state(self) -> dict[str, Any]:
        relay = self.relay
        sessions: dict[str, int] = {"quic": 0, "webtransport": 0}
        for s in list(relay.sessions):
            t = getattr(s.conn, "transport", "quic")
            sessions[t] = sessions.get(t, 0) + 1
        sessions["total"] = sum(sessions.values())
        keys = sorted(known_tracks(relay))
        tracks = [self._track(k) for k in keys]
        return {"sessions": sessions,
                "links": links_state(relay),
                "scopes": scope_totals(tracks),
                "namespaces": sorted(format_namespace(ns) for ns in relay.namespaces.namespaces()),
                "tracks": tracks}

    def _track(self, key: tuple[TrackNamespace, bytes]) -> dict[str, Any]:
        relay = self.relay
        rt = relay.tracks.get(FullTrackName(*key))
        tiers = tiers_of(relay, key)
        largest = rt.largest() if rt is not None else relay.store.largest_object(key)
        return {"namespace": format_namespace(key[0]), "name": format_field(key[1]),
                "tiers": sorted(tiers), "bytes": tiers,
                "complete": relay.store.is_complete(key),
                # its publisher failed: served as far as held, never persisted
                "aborted": relay.store.memory.is_aborted(key),
                "live": bool(rt is not None and rt.live),
                "largest_object": list(largest) if largest is not None else None,
                "subscribers": len(rt.forwarders) if rt is not None else 0}

    async def purge(self, prefix: TrackNamespace) -> dict[str, Any]:
        res = await purge(self.relay, prefix)
        log.info("admin purge of %s: %d tracks removed, %d subscriptions ended",
                 format_namespace(prefix), len(res.removed), res.subscriptions_ended)
        return {"prefix": format_namespace(prefix),
                "removed": [{"namespace": format_namespace(r.key[0]),
                             "name": format_field(r.key[1]), "tiers": r.tiers,
                             "bytes": r.bytes} for r in res.removed],
                "subscriptions_ended": res.subscriptions_ended,
                "namespaces_done": [format_namespace(ns) for ns in res.namespaces_done]}


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    # RecursionError: a deeply nested body ("[" x 60,000 fits in 64 KiB) is malformed too
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadRequest("body is not JSON") from None


def _namespace_list(body: bytes) -> list[TrackNamespace]:
    doc = _json_body(body)
    if not isinstance(doc, dict) or set(doc) != {"namespaces"} or \
            not isinstance(doc["namespaces"], list) or \
            not all(isinstance(x, str) for x in doc["namespaces"]):
        raise BadRequest('expected {"namespaces": ["kvcs-1/hex:<scope>/...", ...]}')
    return [parse_prefix(x) for x in doc["namespaces"]]


def _purge_prefix(body: bytes) -> TrackNamespace:
    try:
        doc = json.loads(body or b"null")
    # RecursionError: a deeply nested body ("[" x 60,000 fits in 64 KiB) is malformed too
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadRequest('body is not JSON: expected {"prefix": "kvcs-1/hex:<scope>/..."}') \
            from None
    if not isinstance(doc, dict) or set(doc) != {"prefix"} or not isinstance(doc["prefix"], str):
        raise BadRequest('expected {"prefix": "kvcs-1/hex:<scope>/..."} and nothing else')
    return parse_prefix(doc["prefix"])


__all__ = ["SIBLING_ROUTES", "AdminApi", "AdminAuth", "parse_prefix", "scope_totals"]
