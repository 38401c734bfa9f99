"""The two identifiers a session hands out and checks: Request IDs (§4.4) and Track Aliases
(§8.3)."""

from __future__ import annotations

from ..codes import SessionErrorCode
from ..errors import SessionError
from ..primitives import FullTrackName

__all__ = ["REQUEST_ID_WINDOW", "PeerRequestIds", "TrackAliases"]

# Request IDs received out of order that are remembered at most (beyond: see
# PeerRequestIds.use); far more than the request streams a peer may have open at once.
REQUEST_ID_WINDOW = 4096


class PeerRequestIds:
    """The Request IDs the peer used: its parity (client even, server odd), each once (§4.4).

    Requests travel on different streams and may arrive out of order, so reuse is detected
    with a set, not by "must increase". The set stays bounded: IDs are used in order (each
    endpoint increments by 2), so every ID below the floor is used and only the out-of-order
    ones above it are remembered. A peer skipping IDs cannot grow the set past the window:
    the floor then moves up and a skipped ID arriving later counts as reused.
    """

    __slots__ = ("_floor", "_parity", "_used")

    def __init__(self, *, peer_is_client: bool) -> None:
        self._parity = 0 if peer_is_client else 1
        self._floor = self._parity  # the peer's lowest unused ID
        self._used: set[int] = set()  # used, above the floor

    def use(self, request_id: int) -> None:
        """Wrong parity or reuse: INVALID_REQUEST_ID."""
        if request_id & 1 != self._parity:
            raise SessionError(SessionErrorCode.INVALID_REQUEST_ID,
                               f"Request ID {request_id} has the wrong parity")
        if request_id < self._floor or request_id in self._used:
            raise SessionError(SessionErrorCode.INVALID_REQUEST_ID,
                               f"Request ID {request_id} reused")
        used = self._used
        used.add(request_id)
        if len(used) > REQUEST_ID_WINDOW:
            self._floor = min(used)
        while self._floor in used:
            used.discard(self._floor)
            self._floor += 2


class TrackAliases:
    """The Track Aliases the peer chose (SUBSCRIBE_OK, PUBLISH), each naming one Track while a
    subscription using it lives; several subscriptions to one Track may share an alias (§8.3).

    Each live binding is kept with the Request ID of its subscription, so data streams that
    carry the alias are routed to the subscription that bound it last.
    """

    __slots__ = ("_by_alias",)

    def __init__(self) -> None:
        self._by_alias: dict[int, tuple[FullTrackName, list[int]]] = {}

    def bind(self, alias: int, track: FullTrackName, request_id: int) -> None:
        """Another Track under a live alias: DUPLICATE_TRACK_ALIAS."""
        cur = self._by_alias.get(alias)
        if cur is None:
            self._by_alias[alias] = (track, [request_id])
        elif cur[0] != track:
            raise SessionError(SessionErrorCode.DUPLICATE_TRACK_ALIAS,
                               f"Track Alias {alias} is bound to another Track")
        else:
            cur[1].append(request_id)

    def release(self, alias: int, request_id: int) -> None:
        """The subscription ``request_id`` ended: once no live one uses ``alias``, it is free
        to name another Track."""
        cur = self._by_alias.get(alias)
        if cur is None or request_id not in cur[1]:
            return
        cur[1].remove(request_id)
        if not cur[1]:
            del self._by_alias[alias]

    def route(self, alias: int) -> int | None:
        """The Request ID of the latest live subscription using ``alias``."""
        cur = self._by_alias.get(alias)
        return cur[1][-1] if cur is not None else None
