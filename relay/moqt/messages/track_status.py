"""TRACK_STATUS (0x0D) (§7.11); its reply is a REQUEST_OK ("TRACK_STATUS_OK")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..codes import MessageType
from ..params import ParamScope
from .base import TrackRequestMessage

__all__ = ["TrackStatus"]


@dataclass(frozen=True)
class TrackStatus(TrackRequestMessage):
    TYPE: ClassVar[MessageType] = MessageType.TRACK_STATUS
    SCOPE: ClassVar[ParamScope] = ParamScope.TRACK_STATUS
