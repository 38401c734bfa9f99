"""Control messages of §7, one module per family."""

from .base import MESSAGE_CLASSES, Message, RequestMessage
from .fetch import Fetch, FetchOk, check_fetch_ok
from .namespace import (
    Namespace,
    NamespaceDone,
    PublishNamespace,
    SubscribeNamespace,
    SubscribeTracks,
)
from .publish import STREAM_COUNT_UNKNOWN, Publish, PublishDone, PublishStateNotify
from .request import (
    OK_SCOPES,
    UPDATE_SCOPES,
    Redirect,
    RequestErrorMessage,
    RequestOk,
    RequestUpdate,
    check_redirect,
    check_request_ok,
    check_request_update,
)
from .setup import MAX_GOAWAY_URI, GoAway, Setup, check_goaway, check_setup
from .subscribe import Subscribe, SubscribeOk
from .track_status import TrackStatus

__all__ = [
    "MAX_GOAWAY_URI",
    "MESSAGE_CLASSES",
    "OK_SCOPES",
    "STREAM_COUNT_UNKNOWN",
    "UPDATE_SCOPES",
    "Fetch",
    "FetchOk",
    "GoAway",
    "Message",
    "Namespace",
    "NamespaceDone",
    "Publish",
    "PublishDone",
    "PublishNamespace",
    "PublishStateNotify",
    "Redirect",
    "RequestErrorMessage",
    "RequestMessage",
    "RequestOk",
    "RequestUpdate",
    "Setup",
    "Subscribe",
    "SubscribeNamespace",
    "SubscribeOk",
    "SubscribeTracks",
    "TrackStatus",
    "check_fetch_ok",
    "check_goaway",
    "check_redirect",
    "check_request_ok",
    "check_request_update",
    "check_setup",
]
