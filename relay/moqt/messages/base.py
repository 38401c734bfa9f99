"""Common machinery of control messages: the base class, the type registry, shared fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from ..codes import MessageType
from ..errors import RequestError
from ..kvp import KeyValuePair, Properties, decode_kvps, encode_kvps, validate_track_properties
from ..params import Params, ParamScope, decode_params, encode_params
from ..primitives import (
    TrackNamespace,
    check_full_track_name,
    check_full_track_name_out,
    decode_track_name,
    decode_track_namespace,
    encode_track_name,
    encode_track_namespace,
)
from ..reader import Reader
from ..vi64 import encode_vi64

__all__ = [
    "MESSAGE_CLASSES",
    "Message",
    "RequestMessage",
    "TrackRequestMessage",
    "decode_track",
    "decode_track_properties",
    "encode_track",
    "encode_track_properties",
]

MESSAGE_CLASSES: dict[int, type[Message]] = {}


class Message:
    """Base of every control message (frozen dataclasses). ``TYPE`` is the wire type."""

    TYPE: ClassVar[MessageType]

    def __init_subclass__(cls, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if "TYPE" in cls.__dict__:
            MESSAGE_CLASSES[cls.TYPE] = cls

    def encode_body(self) -> bytes:
        raise NotImplementedError

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        raise NotImplementedError


class RequestMessage(Message):
    """A message that opens a request stream; its first field is the Request ID."""

    request_id: int

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        request_id = r.vi64()
        try:
            return cls._decode_rest(request_id, r)
        except RequestError as e:
            # The framing is intact: the session can still answer this request.
            e.message_type = cls.TYPE
            e.request_id = request_id
            raise

    @classmethod
    def _decode_rest(cls, request_id: int, r: Reader) -> Self:
        raise NotImplementedError


def encode_track_properties(props: Properties | tuple[KeyValuePair, ...]) -> bytes:
    return encode_kvps(props)


def decode_track_properties(r: Reader) -> Properties:
    """Track Properties run to the end of the message; known values are checked."""
    props = decode_kvps(r)
    validate_track_properties(props)
    return props


def encode_track(ns: TrackNamespace, name: bytes) -> bytes:
    check_full_track_name_out(ns, name)
    return encode_track_namespace(ns) + encode_track_name(name)


def decode_track(r: Reader) -> tuple[TrackNamespace, bytes]:
    ns = decode_track_namespace(r)
    name = decode_track_name(r)
    check_full_track_name(ns, name)
    return ns, name


@dataclass(frozen=True)
class TrackRequestMessage(RequestMessage):
    """SUBSCRIBE, FETCH (draft-20 body) and TRACK_STATUS share one body: Request ID, Track
    Namespace, Track Name, Parameters (§7.1, §7.9, §7.11). Subclasses set TYPE and SCOPE."""

    SCOPE: ClassVar[ParamScope]

    request_id: int
    track_namespace: TrackNamespace
    track_name: bytes
    params: Params = field(default_factory=Params)

    def encode_body(self) -> bytes:
        return (
            encode_vi64(self.request_id)
            + encode_track(self.track_namespace, self.track_name)
            + encode_params(self.params, self.SCOPE)
        )

    @classmethod
    def _decode_rest(cls, request_id: int, r: Reader) -> Self:
        ns, name = decode_track(r)
        params = decode_params(r, cls.SCOPE)
        r.expect_end(cls.TYPE.name)
        return cls(request_id, ns, name, params)
