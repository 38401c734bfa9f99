"""TRACK_STATUS, both sides (§7.11): ``track_status`` asks, ``IncomingTrackStatus`` answers.
TRACK_STATUS_OK ends the request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relay.moqt.codes import MessageType
from relay.moqt.kvp import Properties
from relay.moqt.messages import RequestOk, TrackStatus
from relay.moqt.params import Params
from relay.moqt.primitives import Location, TrackNamespace

from .requests import IncomingTrackRequest, request_ok

if TYPE_CHECKING:
    from .base import SessionBase


async def track_status(session: SessionBase, namespace: TrackNamespace, name: bytes,
                       params: Params) -> RequestOk:
    rs, reply, _ = await request_ok(session, lambda rid: TrackStatus(rid, namespace, name, params),
                                 fin=True)
    await rs.release()  # TRACK_STATUS_OK ends the request (§7.11)
    return reply


class IncomingTrackStatus(IncomingTrackRequest):
    TYPE = MessageType.TRACK_STATUS
    msg: TrackStatus

    async def reply(self, largest: Location | None, properties: Properties = (),
                    expires: int | None = None) -> None:
        """TRACK_STATUS_OK (a REQUEST_OK with LARGEST_OBJECT and Track Properties), FIN."""
        self._answer()
        await self.rs.send(RequestOk(Params(largest_object=largest, expires=expires),
                                     properties), fin=True)
