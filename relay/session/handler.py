"""What the layer above implements to answer the peer's requests.

Each method receives an ``Incoming*`` request object and must answer it (accept or reject);
the default implementation rejects everything with NOT_SUPPORTED, so a pure subscriber
session needs no handler. A method may keep running after answering (e.g. to stream a
subscription's Objects); it runs in its own task under the session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relay.moqt.codes import RequestErrorCode

if TYPE_CHECKING:
    from relay.moqt.messages import GoAway

    from .base import SessionBase
    from .fetch import IncomingFetch
    from .namespace import IncomingPublishNamespace, IncomingSubscribeNamespace
    from .publish import IncomingPublish
    from .subscribe import IncomingSubscribe
    from .track_status import IncomingTrackStatus
    from .tracks import IncomingSubscribeTracks

_NS = RequestErrorCode.NOT_SUPPORTED


class SessionHandler:
    async def subscribe(self, req: IncomingSubscribe) -> None:
        await req.reject(RequestErrorCode.DOES_NOT_EXIST, "no such track")

    async def fetch(self, req: IncomingFetch) -> None:
        await req.reject(RequestErrorCode.DOES_NOT_EXIST, "no such track")

    async def publish(self, req: IncomingPublish) -> None:
        await req.reject(RequestErrorCode.UNINTERESTED, "not interested")

    async def publish_namespace(self, req: IncomingPublishNamespace) -> None:
        await req.reject(RequestErrorCode.UNINTERESTED, "not interested")

    async def subscribe_namespace(self, req: IncomingSubscribeNamespace) -> None:
        await req.reject(_NS, "SUBSCRIBE_NAMESPACE is not served here")

    async def subscribe_tracks(self, req: IncomingSubscribeTracks) -> None:
        await req.reject(_NS, "SUBSCRIBE_TRACKS is not served here")

    async def track_status(self, req: IncomingTrackStatus) -> None:
        await req.reject(RequestErrorCode.DOES_NOT_EXIST, "no such track")

    def setup_received(self, session: SessionBase) -> None:
        """The peer's SETUP arrived (``session.peer_setup``); none of its requests has been
        served yet, and none is until this returns."""

    def answered(self, req: object, code: int | None) -> None:
        """A request of the peer was answered: accepted (``code`` None) or rejected."""

    def goaway(self, session: SessionBase, msg: GoAway) -> None:
        """The peer sent GOAWAY on the control stream (§4.3)."""

    def session_closed(self, session: SessionBase, code: int, reason: str) -> None:
        """The session ended (called once)."""
