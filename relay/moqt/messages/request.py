"""REQUEST_OK (0x07), REQUEST_ERROR (0x05), REQUEST_UPDATE (0x02) (§7.3–§7.5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from ..codes import MessageType, RequestErrorCode, request_error_meaning
from ..errors import protocol_violation
from ..kvp import Properties
from ..params import Params, ParamScope, check_scope, decode_params, encode_params
from ..primitives import TrackNamespace, decode_reason, encode_reason
from ..reader import Reader
from ..vi64 import encode_vi64
from .base import (
    Message,
    RequestMessage,
    decode_track,
    decode_track_properties,
    encode_track,
    encode_track_properties,
)

__all__ = [
    "OK_SCOPES",
    "UPDATE_SCOPES",
    "Redirect",
    "RequestErrorMessage",
    "RequestOk",
    "RequestUpdate",
    "check_redirect",
    "check_request_ok",
    "check_request_update",
]

MAX_REDIRECT_URI = 8192

# Which parameter scope a REQUEST_OK has, by the message it answers.
OK_SCOPES: dict[MessageType, ParamScope] = {
    MessageType.PUBLISH: ParamScope.OK_PUBLISH,
    MessageType.TRACK_STATUS: ParamScope.OK_TRACK_STATUS,
    MessageType.REQUEST_UPDATE: ParamScope.OK_REQUEST_UPDATE,
    MessageType.PUBLISH_NAMESPACE: ParamScope.OK_PUBLISH_NAMESPACE,
    MessageType.SUBSCRIBE_NAMESPACE: ParamScope.OK_SUBSCRIBE_NAMESPACE,
    MessageType.SUBSCRIBE_TRACKS: ParamScope.OK_SUBSCRIBE_TRACKS,
}

# Which parameter scope a REQUEST_UPDATE has, by the request whose stream carries it.
# TRACK_STATUS is absent on purpose: a REQUEST_UPDATE there is a PROTOCOL_VIOLATION.
UPDATE_SCOPES: dict[MessageType, ParamScope] = {
    MessageType.SUBSCRIBE: ParamScope.UPDATE_SUBSCRIPTION,
    MessageType.PUBLISH: ParamScope.UPDATE_SUBSCRIPTION,
    MessageType.FETCH: ParamScope.UPDATE_FETCH,
    MessageType.PUBLISH_NAMESPACE: ParamScope.UPDATE_PUBLISH_NAMESPACE,
    MessageType.SUBSCRIBE_NAMESPACE: ParamScope.UPDATE_SUBSCRIBE_NAMESPACE,
    MessageType.SUBSCRIBE_TRACKS: ParamScope.UPDATE_SUBSCRIBE_TRACKS,
}


@dataclass(frozen=True)
class RequestOk(Message):
    """Reply to PUBLISH, REQUEST_UPDATE, TRACK_STATUS, SUBSCRIBE_NAMESPACE, SUBSCRIBE_TRACKS,
    PUBLISH_NAMESPACE. Track Properties may be non-empty only for TRACK_STATUS: the decoder
    cannot know which request is answered, so the session calls ``check_request_ok``."""

    TYPE: ClassVar[MessageType] = MessageType.REQUEST_OK

    params: Params = field(default_factory=Params)
    track_properties: Properties = ()

    def encode_body(self) -> bytes:
        return encode_params(self.params, ParamScope.REQUEST_OK) + encode_track_properties(
            self.track_properties
        )

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        params = decode_params(r, ParamScope.REQUEST_OK)
        return cls(params, decode_track_properties(r))


def check_request_ok(msg: RequestOk, answers: MessageType) -> None:
    """Rules that depend on the answered request (PROTOCOL_VIOLATION)."""
    scope = OK_SCOPES.get(answers)
    if scope is None:
        raise protocol_violation(f"REQUEST_OK is not a reply to {answers.name}")
    check_scope(msg.params, scope)
    if msg.track_properties and answers != MessageType.TRACK_STATUS:
        raise protocol_violation(f"Track Properties in the REQUEST_OK for {answers.name}")


@dataclass(frozen=True)
class Redirect:
    """The Redirect structure of REQUEST_ERROR REDIRECT: the literal target Track (§7.4)."""

    connect_uri: str = ""
    track_namespace: TrackNamespace = ()
    track_name: bytes = b""


@dataclass(frozen=True)
class RequestErrorMessage(Message):
    """REQUEST_ERROR. ``error_code`` stays an ``int`` (unknown codes are legal): see
    ``meaning``. ``retry_interval``: 0 = do not retry as sent, else minimum wait in ms + 1.
    ``redirect`` is present iff ``error_code`` is REDIRECT."""

    TYPE: ClassVar[MessageType] = MessageType.REQUEST_ERROR

    error_code: int
    retry_interval: int = 0
    reason: str = ""
    redirect: Redirect | None = None

    @property
    def meaning(self) -> RequestErrorCode:
        return request_error_meaning(self.error_code)

    def encode_body(self) -> bytes:
        out = encode_vi64(self.error_code) + encode_vi64(self.retry_interval)
        out += encode_reason(self.reason)
        if (self.error_code == RequestErrorCode.REDIRECT) != (self.redirect is not None):
            raise ValueError("a Redirect goes with REDIRECT and only with it")
        if self.redirect is not None:
            uri = self.redirect.connect_uri.encode()
            if len(uri) > MAX_REDIRECT_URI:
                raise ValueError("redirect URI too long")
            out += encode_vi64(len(uri)) + uri
            out += encode_track(self.redirect.track_namespace, self.redirect.track_name)
        return out

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        code = r.vi64()
        retry = r.vi64()
        reason = decode_reason(r)
        redirect = None
        if code == RequestErrorCode.REDIRECT:
            uri = r.length_prefixed(MAX_REDIRECT_URI, "redirect URI").decode(errors="replace")
            ns, name = decode_track(r)
            redirect = Redirect(uri, ns, name)
        r.expect_end("REQUEST_ERROR")
        return cls(code, retry, reason, redirect)


def check_redirect(
    msg: RequestErrorMessage, *, sender_is_client: bool, namespace_request: bool
) -> None:
    """Redirect rules (§7.4): a server receiving a non-empty URI, or a Track Name on a
    namespace request, is a PROTOCOL_VIOLATION."""
    if msg.redirect is None:
        return
    if sender_is_client and msg.redirect.connect_uri:
        raise protocol_violation("redirect URI from a client")
    if namespace_request and msg.redirect.track_name:
        raise protocol_violation("redirect Track Name on a namespace request")


@dataclass(frozen=True)
class RequestUpdate(RequestMessage):
    """``request_id`` is a fresh ID of the sender, not the updated request's (§4.4)."""

    TYPE: ClassVar[MessageType] = MessageType.REQUEST_UPDATE

    request_id: int
    params: Params = field(default_factory=Params)

    def encode_body(self) -> bytes:
        return encode_vi64(self.request_id) + encode_params(self.params, ParamScope.REQUEST_UPDATE)

    @classmethod
    def _decode_rest(cls, request_id: int, r: Reader) -> Self:
        params = decode_params(r, ParamScope.REQUEST_UPDATE)
        r.expect_end("REQUEST_UPDATE")
        return cls(request_id, params)


def check_request_update(msg: RequestUpdate, updates: MessageType) -> None:
    """Narrow the parameter check to the updated request's type (PROTOCOL_VIOLATION);
    REQUEST_UPDATE on TRACK_STATUS (or any non-request) is itself a violation."""
    scope = UPDATE_SCOPES.get(updates)
    if scope is None:
        raise protocol_violation(f"REQUEST_UPDATE on a {updates.name} stream")
    check_scope(msg.params, scope)
