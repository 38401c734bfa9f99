"""TRACK_STATUS (0x0D) (§7.11); its reply is a REQUEST_OK ("TRACK_STATUS_OK")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from ..codes import MessageType
from ..params import Params, ParamScope, decode_params, encode_params
from ..primitives import TrackNamespace
from ..reader import Reader
from ..vi64 import encode_vi64
from .base import RequestMessage, decode_track, encode_track

__all__ = ["TrackStatus"]


@dataclass(frozen=True)
class TrackStatus(RequestMessage):
    TYPE: ClassVar[MessageType] = MessageType.TRACK_STATUS

    request_id: int
    track_namespace: TrackNamespace
    track_name: bytes
    params: Params = field(default_factory=Params)

    def encode_body(self) -> bytes:
        return (
            encode_vi64(self.request_id)
            + encode_track(self.track_namespace, self.track_name)
            + encode_params(self.params, ParamScope.TRACK_STATUS)
        )

    @classmethod
    def _decode_rest(cls, request_id: int, r: Reader) -> Self:
        ns, name = decode_track(r)
        params = decode_params(r, ParamScope.TRACK_STATUS)
        r.expect_end("TRACK_STATUS")
        return cls(request_id, ns, name, params)
