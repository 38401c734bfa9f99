"""MOQT sessions on the transport seam: SETUP, request streams, subscriptions, fetches.

Typical use::

    conn = await relay.transport.connect("moqt://127.0.0.1:4433/", ...)
    session = await MoqtSession.start(conn, SessionConfig(), handler)
    sub = await session.subscribe(ns, b"k.raw.s0", Params(location_filter=...))
    async for event in sub: ...

The layers above import nothing of the transport: what they need of it (the failure of a
link, a send stream's backlog, the connection and QUIC settings handed through) is in
``handles`` under the session's names.

The peer's requests reach ``handler`` (a :class:`SessionHandler`) as ``Incoming*`` objects
that are answered with ``accept(...)`` / ``reject(...)``.
"""

from .client import open_session
from .config import SessionConfig
from .errors import (
    RequestCancelled,
    RequestRejected,
    SessionClosed,
    SessionFailure,
    StreamAborted,
)
from .events import (
    NamespaceEvent,
    RangeMarker,
    ReceivedObject,
    Source,
    StreamEnded,
    StreamInfo,
    SubscriptionDone,
)
from .fetch import FetchResponse, IncomingFetch
from .handler import SessionHandler
from .handles import Connection, LinkError, QuicSettings, RequestStreams, SendBacklog
from .namespace import (
    IncomingPublishNamespace,
    IncomingSubscribeNamespace,
    NamespaceSubscription,
    PublishedNamespace,
)
from .publish import IncomingPublish
from .session import MoqtSession
from .subscribe import IncomingSubscribe, ServedSubscription, Subscription
from .track_status import IncomingTrackStatus
from .tracks import IncomingSubscribeTracks, TrackSubscription
from .writers import FetchWriter, SubgroupWriter

__all__ = [
    "Connection",
    "FetchResponse",
    "FetchWriter",
    "IncomingFetch",
    "IncomingPublish",
    "IncomingPublishNamespace",
    "IncomingSubscribe",
    "IncomingSubscribeNamespace",
    "IncomingSubscribeTracks",
    "IncomingTrackStatus",
    "LinkError",
    "MoqtSession",
    "NamespaceEvent",
    "NamespaceSubscription",
    "PublishedNamespace",
    "QuicSettings",
    "RangeMarker",
    "ReceivedObject",
    "RequestCancelled",
    "RequestRejected",
    "RequestStreams",
    "SendBacklog",
    "ServedSubscription",
    "SessionClosed",
    "SessionConfig",
    "SessionFailure",
    "SessionHandler",
    "Source",
    "StreamAborted",
    "StreamEnded",
    "StreamInfo",
    "SubgroupWriter",
    "Subscription",
    "SubscriptionDone",
    "TrackSubscription",
    "open_session",
]
