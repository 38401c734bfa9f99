"""Location, Track Namespace, Track Name, Reason Phrase (§2.3, §2.6, §2.7).

A Track Namespace is a plain ``tuple[bytes, ...]`` (fields compare byte-exactly); a Track Name
is ``bytes``. Decoders enforce the limits and raise PROTOCOL_VIOLATION; encoders raise
``ValueError`` for values that may not be sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from .errors import protocol_violation

# The text form (logs, tokens, admin, peers) is namespace_text's; re-exported for the codec's users.
from .namespace_text import format_full_track_name, format_namespace
from .reader import Reader
from .vi64 import encode_vi64

__all__ = [
    "MAX_FULL_TRACK_NAME",
    "MAX_NAMESPACE_FIELDS",
    "MAX_REASON_PHRASE",
    "FullTrackName",
    "Location",
    "LocationRange",
    "TrackNamespace",
    "check_full_track_name",
    "check_full_track_name_out",
    "decode_location",
    "decode_reason",
    "decode_track_name",
    "decode_track_namespace",
    "encode_location",
    "encode_reason",
    "encode_track_name",
    "encode_track_namespace",
    "format_full_track_name",
    "format_namespace",
    "namespace_matches_prefix",
    "namespace_suffix",
    "prefixes_overlap",
]

MAX_NAMESPACE_FIELDS = 32
MAX_FULL_TRACK_NAME = 4096
MAX_REASON_PHRASE = 1024

TrackNamespace = tuple[bytes, ...]


class Location(NamedTuple):
    """{Group, Object}; tuple ordering is exactly the profile's lexicographic order (§2.3)."""

    group: int
    object: int

    def __str__(self) -> str:
        return f"{{{self.group},{self.object}}}"


class FullTrackName(NamedTuple):
    """(Track Namespace, Track Name): the identity of a Track."""

    namespace: TrackNamespace
    name: bytes

    def __str__(self) -> str:
        return format_full_track_name(self.namespace, self.name)


class LocationRange(NamedTuple):
    """Inclusive ``[start, end]``; ``end`` None means open (a subscription without an end)."""

    start: Location
    end: Location | None

    def contains(self, loc: Location) -> bool:
        return self.start <= loc and (self.end is None or loc <= self.end)

    @property
    def is_empty(self) -> bool:
        return self.end is not None and self.start > self.end


# --- Location --------------------------------------------------------------------------------


def encode_location(loc: Location) -> bytes:
    return encode_vi64(loc[0]) + encode_vi64(loc[1])


def decode_location(r: Reader) -> Location:
    return Location(r.vi64(), r.vi64())


# --- Track Namespace / Track Name -------------------------------------------------------------


def _check_namespace(ns: Sequence[bytes]) -> int:
    if len(ns) > MAX_NAMESPACE_FIELDS:
        raise ValueError(f"Track Namespace has {len(ns)} fields (max {MAX_NAMESPACE_FIELDS})")
    total = 0
    for f in ns:
        if not f:
            raise ValueError("empty Track Namespace field")
        total += len(f)
    if total > MAX_FULL_TRACK_NAME:
        raise ValueError(f"Track Namespace of {total} bytes (max {MAX_FULL_TRACK_NAME})")
    return total


def encode_track_namespace(ns: Sequence[bytes]) -> bytes:
    _check_namespace(ns)
    parts = [encode_vi64(len(ns))]
    for f in ns:
        parts.append(encode_vi64(len(f)))
        parts.append(bytes(f))
    return b"".join(parts)


def decode_track_namespace(r: Reader) -> TrackNamespace:
    n = r.vi64()
    if n > MAX_NAMESPACE_FIELDS:
        raise protocol_violation(f"Track Namespace with {n} fields")
    fields = []
    total = 0
    for _ in range(n):
        ln = r.vi64()
        if ln == 0:
            raise protocol_violation("empty Track Namespace field")
        total += ln
        if total > MAX_FULL_TRACK_NAME:
            raise protocol_violation("Track Namespace longer than 4096 bytes")
        fields.append(r.take(ln))
    return tuple(fields)


def encode_track_name(name: bytes) -> bytes:
    return encode_vi64(len(name)) + bytes(name)


def decode_track_name(r: Reader) -> bytes:
    return r.length_prefixed(MAX_FULL_TRACK_NAME, "Track Name")


def check_full_track_name(ns: TrackNamespace, name: bytes) -> None:
    """Decoder check: namespace field bytes + name bytes <= 4096 (prefixes not counted)."""
    if sum(map(len, ns)) + len(name) > MAX_FULL_TRACK_NAME:
        raise protocol_violation("Full Track Name longer than 4096 bytes")


def check_full_track_name_out(ns: Sequence[bytes], name: bytes) -> None:
    """Encoder check (``ValueError``)."""
    if _check_namespace(ns) + len(name) > MAX_FULL_TRACK_NAME:
        raise ValueError("Full Track Name longer than 4096 bytes")


# --- Reason Phrase ----------------------------------------------------------------------------


def encode_reason(reason: str) -> bytes:
    raw = reason.encode()
    if len(raw) > MAX_REASON_PHRASE:
        raise ValueError(f"Reason Phrase of {len(raw)} bytes (max {MAX_REASON_PHRASE})")
    return encode_vi64(len(raw)) + raw


def decode_reason(r: Reader) -> str:
    # Reason Phrases are untrusted and only logged: undecodable bytes must not close a session.
    return r.length_prefixed(MAX_REASON_PHRASE, "Reason Phrase").decode(errors="replace")


# --- Prefix matching --------------------------------------------------------------------------


def namespace_matches_prefix(ns: Sequence[bytes], prefix: Sequence[bytes]) -> bool:
    """Field-wise prefix match (§2.7): ("foo","bar") matches (), ("foo",), ("foo","bar")."""
    return len(prefix) <= len(ns) and all(a == b for a, b in zip(ns, prefix, strict=False))


def namespace_suffix(ns: TrackNamespace, prefix: Sequence[bytes]) -> TrackNamespace:
    """The fields of ``ns`` after ``prefix`` (what NAMESPACE / NAMESPACE_DONE carry)."""
    if not namespace_matches_prefix(ns, prefix):
        raise ValueError("namespace does not match the prefix")
    return ns[len(prefix) :]


def prefixes_overlap(a: Sequence[bytes], b: Sequence[bytes]) -> bool:
    """PREFIX_OVERLAP reading of §2.7: one prefix is a field-wise prefix of the other."""
    return namespace_matches_prefix(a, b) or namespace_matches_prefix(b, a)


