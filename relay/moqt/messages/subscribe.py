"""SUBSCRIBE (0x03) and SUBSCRIBE_OK (0x04) (§7.1, §7.2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from ..codes import MessageType
from ..kvp import Properties
from ..params import Params, ParamScope, decode_params, encode_params
from ..reader import Reader
from ..vi64 import encode_vi64
from .base import (
    Message,
    TrackRequestMessage,
    decode_track_properties,
    encode_track_properties,
)

__all__ = ["Subscribe", "SubscribeOk"]


@dataclass(frozen=True)
class Subscribe(TrackRequestMessage):
    TYPE: ClassVar[MessageType] = MessageType.SUBSCRIBE
    SCOPE: ClassVar[ParamScope] = ParamScope.SUBSCRIBE


@dataclass(frozen=True)
class SubscribeOk(Message):
    TYPE: ClassVar[MessageType] = MessageType.SUBSCRIBE_OK

    track_alias: int
    params: Params = field(default_factory=Params)
    track_properties: Properties = ()

    def encode_body(self) -> bytes:
        return (
            encode_vi64(self.track_alias)
            + encode_params(self.params, ParamScope.SUBSCRIBE_OK)
            + encode_track_properties(self.track_properties)
        )

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        alias = r.vi64()
        params = decode_params(r, ParamScope.SUBSCRIBE_OK)
        return cls(alias, params, decode_track_properties(r))
