"""Namespace messages (§7.12, §7.13, §7.15): PUBLISH_NAMESPACE (0x06), SUBSCRIBE_NAMESPACE (0x50),
NAMESPACE (0x08), NAMESPACE_DONE (0x0E), and SUBSCRIBE_TRACKS (0x51). PUBLISH_SKIPPED (0x0F)
answers only a SUBSCRIBE_TRACKS; the relay never sends it and our clients never meet it from
the relay, so it is not decoded (an unknown type: PROTOCOL_VIOLATION, as anywhere else)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from ..codes import MessageType
from ..params import Params, ParamScope, decode_params, encode_params
from ..primitives import TrackNamespace, decode_track_namespace, encode_track_namespace
from ..reader import Reader
from ..vi64 import encode_vi64
from .base import Message, RequestMessage

__all__ = [
    "Namespace",
    "NamespaceDone",
    "PublishNamespace",
    "SubscribeNamespace",
    "SubscribeTracks",
]


class _NamespaceRequest(RequestMessage):
    """Request ID, Track Namespace (or prefix), Params."""

    SCOPE: ClassVar[ParamScope]
    request_id: int
    track_namespace: TrackNamespace
    params: Params

    def encode_body(self) -> bytes:
        return (
            encode_vi64(self.request_id)
            + encode_track_namespace(self.track_namespace)
            + encode_params(self.params, self.SCOPE)
        )

    @classmethod
    def _decode_rest(cls, request_id: int, r: Reader) -> Self:
        ns = decode_track_namespace(r)
        params = decode_params(r, cls.SCOPE)
        r.expect_end(cls.TYPE.name)
        return cls(request_id, ns, params)  # type: ignore[call-arg]


@dataclass(frozen=True)
class PublishNamespace(_NamespaceRequest):
    TYPE: ClassVar[MessageType] = MessageType.PUBLISH_NAMESPACE
    SCOPE: ClassVar[ParamScope] = ParamScope.PUBLISH_NAMESPACE

    request_id: int
    track_namespace: TrackNamespace
    params: Params = field(default_factory=Params)


@dataclass(frozen=True)
class SubscribeNamespace(_NamespaceRequest):
    """``track_namespace`` is the prefix (0..32 fields; empty = everything)."""

    TYPE: ClassVar[MessageType] = MessageType.SUBSCRIBE_NAMESPACE
    SCOPE: ClassVar[ParamScope] = ParamScope.SUBSCRIBE_NAMESPACE

    request_id: int
    track_namespace: TrackNamespace
    params: Params = field(default_factory=Params)


@dataclass(frozen=True)
class SubscribeTracks(_NamespaceRequest):
    """``track_namespace`` is the prefix; answered with REQUEST_OK, then a PUBLISH per Track
    (the relay: relay/core/track_offers.py)."""

    TYPE: ClassVar[MessageType] = MessageType.SUBSCRIBE_TRACKS
    SCOPE: ClassVar[ParamScope] = ParamScope.SUBSCRIBE_TRACKS

    request_id: int
    track_namespace: TrackNamespace
    params: Params = field(default_factory=Params)


class _Suffix(Message):
    suffix: TrackNamespace

    def encode_body(self) -> bytes:
        return encode_track_namespace(self.suffix)

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        ns = decode_track_namespace(r)
        r.expect_end(cls.TYPE.name)
        return cls(ns)  # type: ignore[call-arg]


@dataclass(frozen=True)
class Namespace(_Suffix):
    """The fields after the subscribed prefix."""

    TYPE: ClassVar[MessageType] = MessageType.NAMESPACE

    suffix: TrackNamespace


@dataclass(frozen=True)
class NamespaceDone(_Suffix):
    TYPE: ClassVar[MessageType] = MessageType.NAMESPACE_DONE

    suffix: TrackNamespace
