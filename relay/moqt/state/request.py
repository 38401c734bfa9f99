"""Stateful, sans-IO checks of the session-level rules the codec cannot see in one message:
Request ID parity/reuse, Track Alias binding, control-stream and request-stream sequencing.

Each checker is fed the messages *received* (and, where replies must be matched, the ones
sent) and raises ``SessionError`` with the profile's code.
"""

from __future__ import annotations

from ..codes import LocationFilterType, MessageType, SessionErrorCode
from ..errors import SessionError, protocol_violation
from ..messages import (
    Fetch,
    FetchOk,
    GoAway,
    Message,
    Namespace,
    NamespaceDone,
    RequestErrorMessage,
    RequestOk,
    RequestUpdate,
    Setup,
    check_fetch_ok,
    check_goaway,
    check_redirect,
    check_request_ok,
    check_request_update,
)
from ..primitives import FullTrackName, Location, TrackNamespace

__all__ = [
    "REQUEST_TYPES",
    "ControlStreamChecker",
    "RequestIdValidator",
    "RequestStreamChecker",
    "TrackAliasRegistry",
]

M = MessageType

REQUEST_TYPES = frozenset({
    M.SUBSCRIBE, M.PUBLISH, M.FETCH, M.TRACK_STATUS, M.PUBLISH_NAMESPACE,
    M.SUBSCRIBE_NAMESPACE, M.SUBSCRIBE_TRACKS,
})

_FIRST_RESPONSE = {
    M.SUBSCRIBE: frozenset({M.SUBSCRIBE_OK, M.REQUEST_ERROR}),
    M.FETCH: frozenset({M.FETCH_OK, M.REQUEST_ERROR}),
}
_DEFAULT_FIRST_RESPONSE = frozenset({M.REQUEST_OK, M.REQUEST_ERROR})
_REPLIES = frozenset({M.REQUEST_OK, M.REQUEST_ERROR})

# Follow-up messages after the first response, by request type and by who sends them.
_FROM_RESPONDER = {
    M.SUBSCRIBE: _REPLIES | {M.PUBLISH_STATE_NOTIFY, M.PUBLISH_DONE, M.GOAWAY},
    M.PUBLISH: _REPLIES | {M.REQUEST_UPDATE, M.GOAWAY},
    M.FETCH: _REPLIES | {M.GOAWAY},
    M.TRACK_STATUS: frozenset({M.GOAWAY}),
    M.PUBLISH_NAMESPACE: _REPLIES | {M.GOAWAY},
    M.SUBSCRIBE_NAMESPACE: _REPLIES | {M.NAMESPACE, M.NAMESPACE_DONE, M.GOAWAY},
    M.SUBSCRIBE_TRACKS: _REPLIES | {M.PUBLISH_SKIPPED, M.GOAWAY},
}
_FROM_REQUESTER = {
    M.SUBSCRIBE: frozenset({M.REQUEST_UPDATE, M.GOAWAY}),
    M.PUBLISH: _REPLIES | {M.REQUEST_UPDATE, M.PUBLISH_STATE_NOTIFY, M.PUBLISH_DONE, M.GOAWAY},
    M.FETCH: frozenset({M.REQUEST_UPDATE, M.GOAWAY}),
    M.TRACK_STATUS: frozenset({M.GOAWAY}),
    M.PUBLISH_NAMESPACE: frozenset({M.REQUEST_UPDATE, M.GOAWAY}),
    M.SUBSCRIBE_NAMESPACE: frozenset({M.REQUEST_UPDATE, M.GOAWAY}),
    M.SUBSCRIBE_TRACKS: frozenset({M.REQUEST_UPDATE, M.GOAWAY}),
}
_NAMESPACE_REQUESTS = frozenset({M.PUBLISH_NAMESPACE, M.SUBSCRIBE_NAMESPACE, M.SUBSCRIBE_TRACKS})


class RequestIdValidator:
    """Request IDs received from the peer: client even, server odd, each used once (§4.4).

    Detection is set-based because requests on different streams may arrive out of order.
    """

    __slots__ = ("_parity", "_seen")

    def __init__(self, *, peer_is_client: bool) -> None:
        self._parity = 0 if peer_is_client else 1
        self._seen: set[int] = set()

    def check(self, request_id: int) -> None:
        if request_id & 1 != self._parity:
            raise SessionError(SessionErrorCode.INVALID_REQUEST_ID, f"wrong parity: {request_id}")
        if request_id in self._seen:
            raise SessionError(SessionErrorCode.INVALID_REQUEST_ID, f"reused: {request_id}")
        self._seen.add(request_id)


class TrackAliasRegistry:
    """Track Aliases bound by the peer (SUBSCRIBE_OK / PUBLISH): one Track per alias (§8.3)."""

    __slots__ = ("_by_alias",)

    def __init__(self) -> None:
        self._by_alias: dict[int, tuple[FullTrackName, int]] = {}

    def bind(self, alias: int, track: FullTrackName) -> None:
        """Bind (or share: several subscriptions to one Track may share an alias)."""
        cur = self._by_alias.get(alias)
        if cur is None:
            self._by_alias[alias] = (track, 1)
        elif cur[0] != track:
            raise SessionError(
                SessionErrorCode.DUPLICATE_TRACK_ALIAS, f"alias {alias} already names {cur[0]}"
            )
        else:
            self._by_alias[alias] = (track, cur[1] + 1)

    def release(self, alias: int) -> None:
        cur = self._by_alias.get(alias)
        if cur is not None:
            if cur[1] <= 1:
                del self._by_alias[alias]
            else:
                self._by_alias[alias] = (cur[0], cur[1] - 1)

    def lookup(self, alias: int) -> FullTrackName | None:
        cur = self._by_alias.get(alias)
        return None if cur is None else cur[0]


class ControlStreamChecker:
    """The peer's control stream: SETUP first and once, then at most one GOAWAY (§1.3)."""

    __slots__ = ("goaway", "peer_is_client", "setup")

    def __init__(self, *, peer_is_client: bool | None = None) -> None:
        self.peer_is_client = peer_is_client
        self.setup: Setup | None = None
        self.goaway: GoAway | None = None

    def on_message(self, msg: Message) -> None:
        if self.setup is None:
            if not isinstance(msg, Setup):
                raise protocol_violation(f"{msg.TYPE.name} before SETUP on the control stream")
            self.setup = msg
            return
        if isinstance(msg, GoAway):
            if self.goaway is not None:
                raise protocol_violation("second GOAWAY on the control stream")
            if self.peer_is_client is not None:
                check_goaway(msg, sender_is_client=self.peer_is_client)
            self.goaway = msg
            return
        raise protocol_violation(f"{msg.TYPE.name} on the control stream")


class RequestStreamChecker:
    """Sequencing of the messages received on one request stream (§5, §7).

    ``opened_by_peer``: the peer sent the request (we respond); else pass the ``request`` we
    sent. Call ``on_sent`` for every REQUEST_UPDATE we send so replies can be matched.
    ``on_received`` returns, for REQUEST_OK / REQUEST_ERROR, the message type they answer.
    """

    def __init__(
        self,
        *,
        opened_by_peer: bool,
        request: Message | None = None,
        peer_is_client: bool | None = None,
    ) -> None:
        self.opened_by_peer = opened_by_peer
        self.peer_is_client = peer_is_client
        self.request: Message | None = request
        self.request_type: MessageType | None = None if request is None else request.TYPE
        if not opened_by_peer and request is None:
            raise ValueError("the requester side must give its request")
        self._responded = False  # first response received (requester side)
        self._finished = False
        self._goaway = False
        self._updates_sent = 0
        self._namespaces: set[TrackNamespace] = set()

    def on_sent(self, msg: Message) -> None:
        if isinstance(msg, RequestUpdate):
            self._updates_sent += 1

    def on_received(self, msg: Message) -> MessageType | None:
        t = msg.TYPE
        if self._finished:
            raise protocol_violation(f"{t.name} after the request ended")
        if self.request_type is None:  # we are the responder: this opens the stream
            if t not in REQUEST_TYPES:
                raise protocol_violation(f"request stream opened by {t.name}")
            self.request = msg
            self.request_type = t
            return None
        rt = self.request_type
        if not self.opened_by_peer and not self._responded:
            if t not in _FIRST_RESPONSE.get(rt, _DEFAULT_FIRST_RESPONSE):
                raise protocol_violation(f"{t.name} as the response to {rt.name}")
            self._responded = True
            self._check_reply(msg, rt)
            if t == M.REQUEST_ERROR:
                self._finished = True
            elif isinstance(msg, FetchOk) and isinstance(self.request, Fetch):
                start = _fetch_start(self.request)
                if start is not None:
                    check_fetch_ok(msg, start)
            return rt
        allowed = (_FROM_REQUESTER if self.opened_by_peer else _FROM_RESPONDER)[rt]
        if t not in allowed:
            if t == M.REQUEST_UPDATE:
                raise protocol_violation(f"REQUEST_UPDATE on a {rt.name} stream")
            raise protocol_violation(f"{t.name} on a {rt.name} stream")
        if isinstance(msg, GoAway):
            if self._goaway:
                raise protocol_violation("second GOAWAY on a request stream")
            if self.peer_is_client is not None:
                check_goaway(msg, sender_is_client=self.peer_is_client)
            self._goaway = True
        elif isinstance(msg, RequestUpdate):
            check_request_update(msg, rt)
        elif isinstance(msg, Namespace):
            self._namespaces.add(msg.suffix)
        elif isinstance(msg, NamespaceDone):
            if msg.suffix not in self._namespaces:
                raise protocol_violation("NAMESPACE_DONE before NAMESPACE")
            self._namespaces.discard(msg.suffix)
        elif t in _REPLIES:
            if self._updates_sent == 0:
                raise protocol_violation(f"unsolicited {t.name}")
            self._updates_sent -= 1
            self._check_reply(msg, M.REQUEST_UPDATE)
            return M.REQUEST_UPDATE
        elif t == M.PUBLISH_DONE:
            self._finished = True
        return None

    def _check_reply(self, msg: Message, answers: MessageType) -> None:
        if isinstance(msg, RequestOk):
            check_request_ok(msg, answers)
        elif isinstance(msg, RequestErrorMessage) and self.peer_is_client is not None:
            check_redirect(
                msg,
                sender_is_client=self.peer_is_client,
                namespace_request=self.request_type in _NAMESPACE_REQUESTS,
            )


def _fetch_start(f: Fetch) -> Location | None:
    """The requested start when it does not depend on the responder's Largest Object."""
    lf = f.params.location_filter
    if lf is None or lf.type == LocationFilterType.NONE:
        return Location(0, 0)
    if lf.type in (
        LocationFilterType.ABSOLUTE_START,
        LocationFilterType.ABSOLUTE_START_GROUP_END,
        LocationFilterType.ABSOLUTE_RANGE,
    ):
        return Location(lf.start_group, lf.start_object)
    return None
