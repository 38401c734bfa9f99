"""PUBLISH (0x1D), PUBLISH_DONE (0x0B), PUBLISH_STATE_NOTIFY (0x22) (§7.6–§7.8)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from ..codes import MessageType, PublishDoneCode, publish_done_meaning
from ..kvp import Properties
from ..params import Params, ParamScope, decode_params, encode_params
from ..primitives import TrackNamespace, decode_reason, encode_reason
from ..reader import Reader
from ..vi64 import MAX_VI64, encode_vi64
from .base import (
    Message,
    RequestMessage,
    decode_track,
    decode_track_properties,
    encode_track,
    encode_track_properties,
)

__all__ = ["STREAM_COUNT_UNKNOWN", "Publish", "PublishDone", "PublishStateNotify"]

STREAM_COUNT_UNKNOWN = MAX_VI64


@dataclass(frozen=True)
class Publish(RequestMessage):
    TYPE: ClassVar[MessageType] = MessageType.PUBLISH

    request_id: int
    track_namespace: TrackNamespace
    track_name: bytes
    track_alias: int
    params: Params = field(default_factory=Params)
    track_properties: Properties = ()

    def encode_body(self) -> bytes:
        return (
            encode_vi64(self.request_id)
            + encode_track(self.track_namespace, self.track_name)
            + encode_vi64(self.track_alias)
            + encode_params(self.params, ParamScope.PUBLISH)
            + encode_track_properties(self.track_properties)
        )

    @classmethod
    def _decode_rest(cls, request_id: int, r: Reader) -> Self:
        ns, name = decode_track(r)
        alias = r.vi64()
        params = decode_params(r, ParamScope.PUBLISH)
        return cls(request_id, ns, name, alias, params, decode_track_properties(r))


@dataclass(frozen=True)
class PublishDone(Message):
    """``status_code`` stays an ``int`` (unknown codes are legal); see ``meaning``."""

    TYPE: ClassVar[MessageType] = MessageType.PUBLISH_DONE

    status_code: int
    stream_count: int = STREAM_COUNT_UNKNOWN
    reason: str = ""

    @property
    def meaning(self) -> PublishDoneCode:
        return publish_done_meaning(self.status_code)

    def encode_body(self) -> bytes:
        return (
            encode_vi64(self.status_code)
            + encode_vi64(self.stream_count)
            + encode_reason(self.reason)
        )

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        code = r.vi64()
        count = r.vi64()
        reason = decode_reason(r)
        r.expect_end("PUBLISH_DONE")
        return cls(code, count, reason)


@dataclass(frozen=True)
class PublishStateNotify(Message):
    TYPE: ClassVar[MessageType] = MessageType.PUBLISH_STATE_NOTIFY

    params: Params = field(default_factory=Params)

    def encode_body(self) -> bytes:
        return encode_params(self.params, ParamScope.PUBLISH_STATE_NOTIFY)

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        params = decode_params(r, ParamScope.PUBLISH_STATE_NOTIFY)
        r.expect_end("PUBLISH_STATE_NOTIFY")
        return cls(params)
