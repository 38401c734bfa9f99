"""One request stream (§1.3, §5, §7): which message may come when, from which side.

Every message sent and received on a request stream passes through its ``RequestState``:
the first message opens the request, exactly one response follows, then only the follow-ups
that request type allows, each REQUEST_UPDATE answered once and in order, at most
MAX_REQUEST_UPDATES of them unanswered (§4.2). Peer input that breaks a rule raises
``SessionError``; a request (or REQUEST_UPDATE) the session must refuse comes out as
``Refuse``; our own misuse raises ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..codes import MessageType, RequestErrorCode, SessionErrorCode
from ..control import ControlStreamParser, InvalidRequest, encode_message
from ..errors import RequestError, SessionError, protocol_violation
from ..messages import (
    Fetch,
    FetchOk,
    GoAway,
    Message,
    Namespace,
    NamespaceDone,
    Publish,
    PublishDone,
    RequestErrorMessage,
    RequestMessage,
    RequestOk,
    RequestUpdate,
    SubscribeOk,
    check_fetch_ok,
    check_goaway,
    check_redirect,
    check_request_ok,
    check_request_update,
)
from ..params import Params, check_filter_ranges
from ..primitives import FullTrackName, Location, TrackNamespace

if TYPE_CHECKING:
    from .session import SessionState

__all__ = ["REQUEST_TYPES", "Refuse", "RequestState"]

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

# Follow-ups after the first message (requester) or the first response (responder), by
# request type and by who sends them (§5.1, §5.2, §7.8).
_FROM_RESPONDER = {
    M.SUBSCRIBE: _REPLIES | {M.PUBLISH_STATE_NOTIFY, M.PUBLISH_DONE, M.GOAWAY},
    M.PUBLISH: _REPLIES | {M.REQUEST_UPDATE, M.GOAWAY},
    M.FETCH: _REPLIES | {M.GOAWAY},
    M.TRACK_STATUS: frozenset({M.GOAWAY}),
    M.PUBLISH_NAMESPACE: _REPLIES | {M.GOAWAY},
    M.SUBSCRIBE_NAMESPACE: _REPLIES | {M.NAMESPACE, M.NAMESPACE_DONE, M.GOAWAY},
    # (PUBLISH_SKIPPED may follow a SUBSCRIBE_TRACKS; a relay of this project never sends
    # one, and it is not decoded: from another, it closes the session)
    M.SUBSCRIBE_TRACKS: _REPLIES | {M.GOAWAY},
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


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer what the peer sent with REQUEST_ERROR ``code``: the request itself (``final``:
    the reply ends our direction, and the request is over) or one REQUEST_UPDATE."""

    code: int
    reason: str
    final: bool

    @property
    def reply(self) -> RequestErrorMessage:
        return RequestErrorMessage(int(self.code), 0, self.reason[:1024])


class RequestState:
    """The rules of one request stream. ``ours``: we sent the request (we are the requester).

    ``receive(data, fin)`` parses and checks what the peer sent and returns the messages the
    application acts on, plus ``Refuse`` items the caller must send; ``send(msg)`` checks a
    message of ours and returns its bytes.
    """

    __slots__ = ("_done_sending", "_goaway_received", "_goaway_sent", "_namespaces", "_over",
                 "_parser", "_updates_received", "_updates_sent", "kind", "ours", "request",
                 "responded", "session")

    def __init__(self, session: SessionState, *, ours: bool) -> None:
        self.session = session
        self.ours = ours
        self.request: RequestMessage | None = None
        self.kind: MessageType | None = None
        self.responded = False  # the first response went out (theirs) or came in (ours)
        self._parser = ControlStreamParser()
        self._over = False  # REQUEST_ERROR or PUBLISH_DONE received: nothing may follow
        self._updates_sent = 0  # our REQUEST_UPDATEs not answered yet
        self._updates_received = 0  # the peer's REQUEST_UPDATEs we have not answered yet
        self._goaway_sent = False
        self._goaway_received = False
        self._done_sending = False  # our direction ended (FIN or reset)
        self._namespaces: set[TrackNamespace] = set()

    @property
    def full_name(self) -> FullTrackName:
        req: Any = self.request
        return FullTrackName(req.track_namespace, req.track_name)

    @property
    def update_room(self) -> bool:
        """May we send a REQUEST_UPDATE now without exceeding the peer's MAX_REQUEST_UPDATES
        (unanswered updates per request stream, §4.2)?"""
        limit = self.session.peer_max_request_updates
        return not limit or self._updates_sent < limit

    # -- ours --------------------------------------------------------------------------------

    def send(self, msg: Message) -> bytes:
        """The bytes of ``msg`` after checking we may send it now (``ValueError`` if not)."""
        t = msg.TYPE
        kind = self.kind
        if kind is None:
            if not self.ours or not isinstance(msg, RequestMessage) or t not in REQUEST_TYPES:
                raise ValueError(f"{t.name} cannot open a request stream")
            self.request = msg
            self.kind = t
        elif not self.ours and not self.responded:
            if t not in _FIRST_RESPONSE.get(kind, _DEFAULT_FIRST_RESPONSE):
                raise ValueError(f"{t.name} cannot answer {kind.name}")
            self.responded = True
        else:
            allowed = (_FROM_REQUESTER if self.ours else _FROM_RESPONDER)[kind]
            if t not in allowed:
                raise ValueError(f"{t.name} is not ours to send on a {kind.name} stream")
            if t in _REPLIES:
                if not self._updates_received:
                    raise ValueError(f"{t.name} answers no REQUEST_UPDATE")
                self._updates_received -= 1
            elif t == M.REQUEST_UPDATE:
                if not self.update_room:
                    raise ValueError("the peer's MAX_REQUEST_UPDATES is reached")
                self._updates_sent += 1
            elif t == M.GOAWAY:
                if self._goaway_sent:
                    raise ValueError("a second GOAWAY on a request stream")
                self._goaway_sent = True
        return encode_message(msg)

    def send_ended(self) -> None:
        """Our direction ended (FIN or RESET_STREAM): nothing more is sent, so a
        REQUEST_UPDATE still arriving cannot be answered and is not held against the peer's
        limit (it crossed our FIN)."""
        self._done_sending = True

    # -- the peer's --------------------------------------------------------------------------

    def receive(self, data: bytes | memoryview = b"", fin: bool = False
                ) -> list[Message | Refuse]:
        """What the peer sent (``fin``: its direction ended)."""
        out: list[Message | Refuse] = []
        for msg in self._parser.feed(data, fin):
            out.append(self._on_message(msg))
        if fin and self.kind is None and not self.ours:
            raise protocol_violation("request stream closed before its request")
        return out

    def _on_message(self, msg: Message | InvalidRequest) -> Message | Refuse:
        if self.kind is None:  # the peer opens the stream
            return self._on_request(msg)
        if self.ours and not self.responded:
            return self._on_response(msg)
        return self._on_follow_up(msg)

    def _on_request(self, msg: Message | InvalidRequest) -> Message | Refuse:
        t = msg.message_type if isinstance(msg, InvalidRequest) else msg.TYPE
        if t not in REQUEST_TYPES:
            raise protocol_violation(f"{t.name} cannot open a request stream")
        self.kind = t
        s = self.session
        if isinstance(msg, InvalidRequest):  # a Range filter the codec refused (§6.5)
            if msg.request_id is not None:
                s.peer_ids.use(msg.request_id)
            return Refuse(msg.error.code, msg.error.reason, True)
        assert isinstance(msg, RequestMessage)
        s.peer_ids.use(msg.request_id)
        self.request = msg
        if s.going_away:  # §4.3: requests after GOAWAY may be refused
            return Refuse(RequestErrorCode.GOING_AWAY, "going away", True)
        params = getattr(msg, "params", None)
        if isinstance(params, Params):
            try:
                check_filter_ranges(params, s.max_filter_ranges)
            except RequestError as e:  # INVALID_FILTER: a request error (Appendix B)
                return Refuse(e.code, e.reason, True)
        if isinstance(msg, Publish):
            s.aliases.bind(msg.track_alias, self.full_name, msg.request_id)
        return msg

    def _on_response(self, msg: Message | InvalidRequest) -> Message:
        kind = self.kind
        assert kind is not None and self.request is not None
        if isinstance(msg, InvalidRequest) or \
                msg.TYPE not in _FIRST_RESPONSE.get(kind, _DEFAULT_FIRST_RESPONSE):
            name = _name(msg)
            raise protocol_violation(f"{name} in reply to {kind.name}")
        self.responded = True
        if isinstance(msg, RequestErrorMessage):
            self._over = True
            self._check_error(msg)
        elif isinstance(msg, RequestOk):
            check_request_ok(msg, kind)
        elif isinstance(msg, FetchOk):
            start = _fetch_start(self.request)
            if start is not None:
                check_fetch_ok(msg, start)
        elif isinstance(msg, SubscribeOk):
            self.session.aliases.bind(msg.track_alias, self.full_name, self.request.request_id)
        return msg

    def _on_follow_up(self, msg: Message | InvalidRequest) -> Message | Refuse:
        kind = self.kind
        assert kind is not None
        name = _name(msg)
        if self._over:
            raise protocol_violation(f"{name} after the request ended")
        t = msg.message_type if isinstance(msg, InvalidRequest) else msg.TYPE
        if t not in (_FROM_RESPONDER if self.ours else _FROM_REQUESTER)[kind]:
            raise protocol_violation(f"{name} on a {kind.name} stream")
        if t == M.REQUEST_UPDATE:
            return self._on_update(msg)
        if isinstance(msg, GoAway):
            if self._goaway_received:
                raise protocol_violation("a second GOAWAY on a request stream")
            check_goaway(msg, sender_is_client=self.session.peer_is_client)
            self._goaway_received = True
        elif isinstance(msg, RequestOk | RequestErrorMessage):
            if not self._updates_sent:
                raise protocol_violation(f"{name} answers no REQUEST_UPDATE")
            self._updates_sent -= 1
            if isinstance(msg, RequestOk):
                check_request_ok(msg, M.REQUEST_UPDATE)
            else:
                self._check_error(msg)
        elif isinstance(msg, Namespace):
            self._namespaces.add(msg.suffix)
        elif isinstance(msg, NamespaceDone):
            if msg.suffix not in self._namespaces:
                raise protocol_violation("NAMESPACE_DONE before NAMESPACE")
            self._namespaces.discard(msg.suffix)
        elif isinstance(msg, PublishDone):
            self._over = True
        assert not isinstance(msg, InvalidRequest)
        return msg

    def _on_update(self, msg: Message | InvalidRequest) -> Message | Refuse:
        """A REQUEST_UPDATE: a fresh Request ID of the peer (§4.4), on a request that may be
        updated (§5.1), within our MAX_REQUEST_UPDATES unanswered ones (§4.2)."""
        rid: int | None = msg.request_id  # type: ignore[union-attr]
        s = self.session
        if rid is not None:
            s.peer_ids.use(rid)
        if not self._done_sending:  # else it crossed our FIN: never answered, never held
            self._updates_received += 1
            limit = s.max_request_updates
            if limit and self._updates_received > limit:
                raise SessionError(SessionErrorCode.TOO_MANY_REQUEST_UPDATES,
                                   f"more than {limit} unanswered REQUEST_UPDATEs")
        if isinstance(msg, InvalidRequest):
            return Refuse(msg.error.code, msg.error.reason, False)
        assert isinstance(msg, RequestUpdate) and self.kind is not None
        check_request_update(msg, self.kind)
        return msg

    def _check_error(self, msg: RequestErrorMessage) -> None:
        check_redirect(msg, sender_is_client=self.session.peer_is_client,
                       namespace_request=self.kind in _NAMESPACE_REQUESTS)


def _name(msg: Message | InvalidRequest) -> str:
    t = msg.message_type if isinstance(msg, InvalidRequest) else msg.TYPE
    return t.name


def _fetch_start(request: RequestMessage) -> Location | None:
    """The requested start of a FETCH when it does not depend on the responder's Largest
    Object (the bound FETCH_OK's End Location must reach, §7.10)."""
    if not isinstance(request, Fetch):
        return None
    lf = request.params.location_filter
    if lf is not None and lf.is_absolute:
        return Location(lf.start_group, lf.start_object)
    return None
