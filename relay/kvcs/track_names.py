"""Track names of kvcs-draft 3.2.

    track-name = "manifest" / "manifest.cose" / data-track
    data-track = component "." codec-name "." "s" segment
    component  = "k" / "v" / "kv"
    codec-name = 1*32( %x61-7A / DIGIT / "-" )
    segment    = "0" / ( %x31-39 *DIGIT )

A syntactically valid codec name need not be one this library implements:
``DataTrackName.codec`` is kept as text and ``codec_value`` says whether it is known.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from .errors import TrackNameError, UnknownCodecError
from .registry import Codec, Component, codec_by_name

MANIFEST = "manifest"
MANIFEST_COSE = "manifest.cose"
_CODEC_RE = re.compile(r"[a-z0-9-]{1,32}")
_SEGMENT_RE = re.compile(r"0|[1-9][0-9]*")
# MOQT bounds a full track name to 4096 octets; a longer segment number is not a name anyway,
# and the bound keeps int() away from Python's huge-integer limit.
_MAX_SEGMENT_DIGITS = 19


@dataclass(frozen=True)
class ManifestTrackName:
    signed: bool

    def __str__(self) -> str:
        return MANIFEST_COSE if self.signed else MANIFEST

    def encode(self) -> bytes:
        return str(self).encode("ascii")


@dataclass(frozen=True)
class DataTrackName:
    component: Component
    codec: str
    segment: int
    _codec_value: Codec | None = field(init=False, repr=False, compare=False)
    _text: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.component, Component):
            raise TrackNameError(f"component must be a Component, not {self.component!r}")
        if not _CODEC_RE.fullmatch(self.codec):
            raise TrackNameError(f"codec name {self.codec!r} must be 1-32 of [a-z0-9-]")
        if isinstance(self.segment, bool) or not isinstance(self.segment, int) \
                or self.segment < 0:
            raise TrackNameError(f"segment must be a non-negative integer, not {self.segment!r}")
        # A consumer asks both for every Object it checks (several times each, 16,384 Objects
        # in a 512 MiB cache): the name is immutable, so they are made once.
        try:
            codec: Codec | None = codec_by_name(self.codec)
        except UnknownCodecError:
            codec = None
        object.__setattr__(self, "_codec_value", codec)
        object.__setattr__(self, "_text", f"{self.component.label}.{self.codec}.s{self.segment}")

    def __str__(self) -> str:
        return self._text

    def encode(self) -> bytes:
        return str(self).encode("ascii")

    @property
    def codec_value(self) -> Codec | None:
        """The registry entry, or None for a codec this library does not implement."""
        return self._codec_value


TrackName = ManifestTrackName | DataTrackName


def parse_track_name(name: str | bytes) -> TrackName:
    """Parse a track name (text or the wire's octets); raise TrackNameError if invalid."""
    if isinstance(name, bytes | bytearray | memoryview):
        try:
            text = bytes(name).decode("ascii")
        except UnicodeDecodeError:
            raise TrackNameError(f"track name {bytes(name)!r} is not ASCII") from None
    else:
        text = name
    return _parse_text(text)


@functools.lru_cache(maxsize=1024)
def _parse_text(text: str) -> TrackName:
    # A consumer parses a publication's few names again for every Object it checks (16,384
    # Objects in a 512 MiB cache, several parses each); the names are immutable, so each is
    # parsed once. Invalid names raise every time (lru_cache keeps no exceptions).
    if not text.isascii():
        raise TrackNameError(f"track name {text!r} is not ASCII")
    if text == MANIFEST:
        return ManifestTrackName(signed=False)
    if text == MANIFEST_COSE:
        return ManifestTrackName(signed=True)
    parts = text.split(".")
    if len(parts) != 3:
        raise TrackNameError(
            f"track name {text!r} is neither 'manifest', 'manifest.cose' nor "
            "<component>.<codec>.s<segment>"
        )
    component, codec, segment = parts
    if component not in ("k", "v", "kv"):
        raise TrackNameError(f"track name {text!r}: component must be k, v or kv")
    if not _CODEC_RE.fullmatch(codec):
        raise TrackNameError(f"track name {text!r}: codec name must be 1-32 of [a-z0-9-]")
    if not segment.startswith("s"):
        raise TrackNameError(f"track name {text!r}: segment must be 's' followed by a number")
    digits = segment[1:]
    if not _SEGMENT_RE.fullmatch(digits):
        raise TrackNameError(
            f"track name {text!r}: segment number must be decimal without leading zeros"
        )
    if len(digits) > _MAX_SEGMENT_DIGITS:
        raise TrackNameError(f"track name {text!r}: segment number is too large")
    return DataTrackName(Component.from_label(component), codec, int(digits))


def data_track(component: Component | str, codec: Codec | str, segment: int) -> DataTrackName:
    """Convenience constructor: data_track("k", "raw", 0) -> k.raw.s0."""
    comp = component if isinstance(component, Component) else Component.from_label(component)
    name = codec.label if isinstance(codec, Codec) else codec
    return DataTrackName(comp, name, segment)
