"""Components (Object header / track names) and the KVSP codec registry (KVSP-PROFILE 4)."""

from __future__ import annotations

from enum import IntEnum

from .errors import UnknownCodecError


class Component(IntEnum):
    """Object header Component values; ``label`` is the track-name form."""

    K = 1
    V = 2
    KV = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def from_label(cls, label: str) -> Component:
        return cls[label.upper()]


class Codec(IntEnum):
    """KVSP codecs this library implements; ``label`` is the registry Name."""

    RAW = 0
    ZSTD = 1
    INT8 = 2

    @property
    def label(self) -> str:
        return self.name.lower()


_BY_LABEL = {c.label: c for c in Codec}


def codec_by_name(name: str) -> Codec:
    try:
        return _BY_LABEL[name]
    except KeyError:
        raise UnknownCodecError(f"codec {name!r} is not implemented "
                                f"(known: {', '.join(_BY_LABEL)})") from None

