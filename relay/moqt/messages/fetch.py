"""FETCH (0x16, draft-20 body) and FETCH_OK (0x18) (§7.9, §7.10)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from ..codes import MessageType
from ..errors import protocol_violation
from ..kvp import Properties
from ..params import Params, ParamScope, decode_params, encode_params
from ..primitives import Location, decode_location, encode_location
from ..reader import Reader
from .base import (
    Message,
    TrackRequestMessage,
    decode_track_properties,
    encode_track_properties,
)

__all__ = ["Fetch", "FetchOk", "check_fetch_ok"]


@dataclass(frozen=True)
class Fetch(TrackRequestMessage):
    """The range is only in ``params.location_filter``; absent = {0,0}..Largest Object."""

    TYPE: ClassVar[MessageType] = MessageType.FETCH
    SCOPE: ClassVar[ParamScope] = ParamScope.FETCH


@dataclass(frozen=True)
class FetchOk(Message):
    """``end_location`` is inclusive (draft-19's "+1" convention is gone)."""

    TYPE: ClassVar[MessageType] = MessageType.FETCH_OK

    end_of_track: bool
    end_location: Location
    params: Params = field(default_factory=Params)
    track_properties: Properties = ()

    def encode_body(self) -> bytes:
        return (
            bytes((int(self.end_of_track),))
            + encode_location(self.end_location)
            + encode_params(self.params, ParamScope.FETCH_OK)
            + encode_track_properties(self.track_properties)
        )

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        eot = r.u8()
        if eot > 1:
            raise protocol_violation(f"FETCH_OK End Of Track {eot} not 0 or 1")
        end = decode_location(r)
        params = decode_params(r, ParamScope.FETCH_OK)
        return cls(bool(eot), end, params, decode_track_properties(r))


def check_fetch_ok(msg: FetchOk, requested_start: Location) -> None:
    """End Location below the FETCH's start → PROTOCOL_VIOLATION (§7.10)."""
    if msg.end_location < requested_start:
        raise protocol_violation(
            f"FETCH_OK End Location {msg.end_location} below the requested start {requested_start}"
        )
