"""The manifest of kvcs-draft 3.6: JSON builder, parser, validation and digest checks.

Parsing is strict about what the profile defines and ignores unknown members (a later
version may add some). Besides the draft's rules it requires what the draft's model implies:
segments numbered 0, 1, ... in order, segment 0 starting at block 0 and each segment starting
where the previous one ends (chunked prefill appends tokens), and track names whose segment
number is their entry's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .descriptor import Descriptor
from .errors import (
    CompatMismatchError,
    DescriptorError,
    ManifestDigestMismatchError,
    ManifestError,
    ObjectContextError,
    TrackNameError,
)
from .namespace import KvcsNamespace
from .payload import Buffer, VerifiedObject, verify_object
from .track_names import DataTrackName, parse_track_name

_HEX32 = re.compile(r"[0-9a-f]{64}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class SegmentEntry:
    """One entry of "segments". ``object_digests`` maps a data track to one list per
    completed Group (in Group order) of the Objects' hex Data Digests (in Object order)."""

    segment: int
    first_block: int
    blocks: int
    block_keys_sha256: str
    tracks: list[str]
    complete: bool = False
    object_digests: dict[str, list[list[str]]] | None = field(default=None)

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "segment": self.segment,
            "first_block": self.first_block,
            "blocks": self.blocks,
            "block_keys_sha256": self.block_keys_sha256,
            "tracks": list(self.tracks),
            "complete": self.complete,
        }
        if self.object_digests is not None:
            obj["object_digests"] = {t: [list(g) for g in groups]
                                     for t, groups in self.object_digests.items()}
        return obj


@dataclass
class Manifest:
    compat: Descriptor
    segments: list[SegmentEntry]
    deterministic: bool = False

    @property
    def layers(self) -> int:
        return self.compat.layers

    @property
    def block_tokens(self) -> int:
        return self.compat.block_tokens

    @property
    def compat_id(self) -> bytes:
        return self.compat.compat_id

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "kvcs": 1,
            "compat": self.compat.doc,
            "layers": self.layers,
            "block_tokens": self.block_tokens,
            "deterministic": self.deterministic,
            "segments": [s.to_json_obj() for s in self.segments],
        }

    def to_json(self) -> bytes:
        """Compact UTF-8 JSON; the same Manifest always gives the same octets."""
        return json.dumps(self.to_json_obj(), separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")

    def copy(self) -> Manifest:
        return replace(self, segments=[
            replace(s, tracks=list(s.tracks), object_digests=None if s.object_digests is None
                    else {t: [list(g) for g in gs] for t, gs in s.object_digests.items()})
            for s in self.segments])

    # -- consumer checks --------------------------------------------------------------------

    def check_namespace(self, namespace: KvcsNamespace | bytes) -> None:
        """Recompute compat_id of "compat"; a mismatch means: discard the publication."""
        expected = namespace.compat_id if isinstance(namespace, KvcsNamespace) else namespace
        if self.compat_id != expected:
            raise CompatMismatchError(
                f"compat_id of the manifest's descriptor is {self.compat_id.hex()}, "
                f"the namespace says {bytes(expected).hex()}"
            )

    def segment_of(self, track: str | DataTrackName) -> SegmentEntry:
        name = track if isinstance(track, DataTrackName) else parse_track_name(track)
        if not isinstance(name, DataTrackName):
            raise ObjectContextError(f"{name} is not a data track")
        for seg in self.segments:
            if seg.segment == name.segment:
                if str(name) not in seg.tracks:
                    raise ObjectContextError(f"track {name} is not listed in segment "
                                             f"{seg.segment}")
                return seg
        raise ObjectContextError(f"segment {name.segment} of track {name} is not in the manifest")

    def expected_digest(self, track: str, group: int, object_id: int) -> bytes | None:
        """The listed Data Digest of an Object, or None while its Group is not listed."""
        seg = self.segment_of(track)
        if seg.object_digests is None:
            return None
        groups = seg.object_digests.get(str(track), [])
        if group >= len(groups) or object_id >= len(groups[group]):
            return None
        return bytes.fromhex(groups[group][object_id])

    def check_object(self, track: str | DataTrackName, obj: VerifiedObject) -> bool:
        """Check a 3.5-verified Object against this manifest.

        Header fields must fit the track and segment, and the Data Digest must equal the
        listed one. Returns True if the digest was listed (and matched), False if its Group
        is not listed yet (check again with a later version). Raises ObjectContextError or
        ManifestDigestMismatchError otherwise.
        """
        name = track if isinstance(track, DataTrackName) else parse_track_name(track)
        if not isinstance(name, DataTrackName):
            raise ObjectContextError(f"{name} is not a data track")
        seg = self.segment_of(name)
        h = obj.header
        if h.component is not name.component:
            raise ObjectContextError(f"component {h.component.label} in track {name}")
        codec = name.codec_value
        if codec is None or h.codec != int(codec):
            raise ObjectContextError(f"codec value {h.codec} does not match track {name}")
        if h.layer >= self.layers:
            raise ObjectContextError(f"layer {h.layer} >= layers {self.layers}")
        if h.block_index >= seg.blocks:
            raise ObjectContextError(f"block {h.block_index} >= segment blocks {seg.blocks}")
        if h.token_count != self.block_tokens:
            raise ObjectContextError(f"token count {h.token_count} != block_tokens "
                                     f"{self.block_tokens}")
        token_start = (seg.first_block + h.block_index) * self.block_tokens
        if h.token_start != token_start:
            raise ObjectContextError(f"token start {h.token_start}, expected {token_start}")
        listed = self.expected_digest(str(name), h.layer, h.block_index)
        if listed is None:
            return False
        if listed != h.data_digest:
            raise ManifestDigestMismatchError(
                f"{name} layer {h.layer} block {h.block_index}: Data Digest "
                f"{h.data_digest.hex()} is not the listed {listed.hex()}"
            )
        return True

    def verify(self, track: str, group: int, object_id: int, payload: Buffer, *,
               require_listed: bool = False) -> VerifiedObject:
        """verify_object (3.5) followed by check_object; optionally insist on a listed digest
        (a partial retrieval of a completed cache can do that for every Object)."""
        obj = verify_object(payload, group, object_id)
        if not self.check_object(track, obj) and require_listed:
            raise ManifestError(f"{track} group {group} object {object_id} has no listed digest")
        return obj

    def check_successor(self, newer: Manifest) -> None:
        """A later version may only add: same compat and deterministic flag, existing segments
        unchanged except complete false->true and digests extended."""
        if newer.compat != self.compat or newer.deterministic != self.deterministic:
            raise ManifestError("a later manifest version changed compat or deterministic")
        if len(newer.segments) < len(self.segments):
            raise ManifestError("a later manifest version dropped segments")
        for old, new in zip(self.segments, newer.segments, strict=False):
            fixed = ("segment", "first_block", "blocks", "block_keys_sha256", "tracks")
            if any(getattr(old, f) != getattr(new, f) for f in fixed):
                raise ManifestError(f"a later manifest version changed segment {old.segment}")
            if old.complete and not new.complete:
                raise ManifestError(f"segment {old.segment} became incomplete again")
            for track, groups in (old.object_digests or {}).items():
                later = (new.object_digests or {}).get(track, [])
                if later[:len(groups)] != groups:
                    raise ManifestError(f"a later manifest version changed digests of {track}")


# -- parsing ----------------------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two readers could pick different duplicates; a signed manifest must mean one thing.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ManifestError(f"manifest has duplicate member {key!r}")
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise ManifestError(f"manifest contains the non-JSON constant {name}")


def _get(obj: Mapping[str, Any], name: str, path: str) -> Any:
    if name not in obj:
        raise ManifestError(f"{path} lacks member {name!r}")
    return obj[name]


def _int(obj: Mapping[str, Any], name: str, path: str, minimum: int = 0) -> int:
    value = _get(obj, name, path)
    if not _is_int(value) or value < minimum:
        raise ManifestError(f"{path}.{name} must be an integer >= {minimum}, not {value!r}")
    return int(value)


def _bool(obj: Mapping[str, Any], name: str, path: str) -> bool:
    value = _get(obj, name, path)
    if not isinstance(value, bool):
        raise ManifestError(f"{path}.{name} must be true or false, not {value!r}")
    return value


def _parse_segment(obj: Any, index: int, expected_first: int, layers: int) -> SegmentEntry:
    path = f"manifest.segments[{index}]"
    if not isinstance(obj, Mapping):
        raise ManifestError(f"{path} must be an object")
    number = _int(obj, "segment", path)
    if number != index:
        raise ManifestError(f"{path}.segment is {number}; segments must be numbered 0, 1, ...")
    first = _int(obj, "first_block", path)
    if first != expected_first:
        raise ManifestError(f"{path}.first_block is {first}, expected {expected_first} "
                            "(segments are contiguous from block 0)")
    blocks = _int(obj, "blocks", path, minimum=1)
    keys = _get(obj, "block_keys_sha256", path)
    if not isinstance(keys, str) or not _HEX32.fullmatch(keys):
        raise ManifestError(f"{path}.block_keys_sha256 must be 64 lower-case hex digits")
    tracks = _get(obj, "tracks", path)
    if not isinstance(tracks, list) or not tracks or not all(isinstance(t, str) for t in tracks):
        raise ManifestError(f"{path}.tracks must be a non-empty array of track names")
    if len(set(tracks)) != len(tracks):
        raise ManifestError(f"{path}.tracks lists a track twice")
    for t in tracks:
        try:
            name = parse_track_name(t)
        except TrackNameError as exc:
            raise ManifestError(f"{path}.tracks: {exc}") from None
        if not isinstance(name, DataTrackName) or name.segment != number:
            raise ManifestError(f"{path}.tracks: {t!r} is not a data track of segment {number}")
    complete = _bool(obj, "complete", path)
    digests: dict[str, list[list[str]]] | None = None
    if "object_digests" in obj:
        raw = obj["object_digests"]
        if not isinstance(raw, Mapping):
            raise ManifestError(f"{path}.object_digests must be an object")
        digests = {}
        for track, groups in raw.items():
            tpath = f"{path}.object_digests[{track!r}]"
            if track not in tracks:
                raise ManifestError(f"{tpath}: track is not listed in tracks")
            if not isinstance(groups, list) or len(groups) > layers:
                raise ManifestError(f"{tpath} must be an array of at most {layers} groups")
            if complete and len(groups) != layers:
                raise ManifestError(f"{tpath}: a complete segment lists all {layers} groups")
            for g, group in enumerate(groups):
                if not isinstance(group, list) or len(group) != blocks or not all(
                        isinstance(d, str) and _HEX32.fullmatch(d) for d in group):
                    raise ManifestError(f"{tpath}[{g}] must be {blocks} hex SHA-256 digests")
            digests[track] = [list(g) for g in groups]
    return SegmentEntry(number, first, blocks, keys, list(tracks), complete, digests)


def parse_manifest(data: Buffer | str) -> Manifest:
    """Parse and validate a manifest JSON object; raise ManifestError if it is not one."""
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
        doc = json.loads(text, object_pairs_hook=_no_duplicates,
                         parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise ManifestError(f"manifest is not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"manifest is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ManifestError("manifest must be a JSON object")
    if _get(doc, "kvcs", "manifest") != 1 or isinstance(doc["kvcs"], bool):
        raise ManifestError(f"manifest.kvcs must be 1, not {doc['kvcs']!r}")
    try:
        compat = Descriptor(_get(doc, "compat", "manifest"))
    except DescriptorError as exc:
        raise ManifestError(f"manifest.compat: {exc}") from None
    layers = _int(doc, "layers", "manifest", minimum=1)
    if layers != compat.layers:
        raise ManifestError(f"manifest.layers {layers} differs from compat.layers "
                            f"{compat.layers}")
    block_tokens = _int(doc, "block_tokens", "manifest", minimum=1)
    if block_tokens != compat.block_tokens:
        raise ManifestError(f"manifest.block_tokens {block_tokens} differs from "
                            f"compat.block_tokens {compat.block_tokens}")
    deterministic = _bool(doc, "deterministic", "manifest")
    raw_segments = _get(doc, "segments", "manifest")
    if not isinstance(raw_segments, list) or not raw_segments:
        raise ManifestError("manifest.segments must be a non-empty array")
    segments: list[SegmentEntry] = []
    next_first = 0
    for i, raw in enumerate(raw_segments):
        seg = _parse_segment(raw, i, next_first, layers)
        segments.append(seg)
        next_first = seg.first_block + seg.blocks
    return Manifest(compat, segments, deterministic)


def manifest_for_namespace(data: Buffer | str, namespace: KvcsNamespace) -> Manifest:
    """parse_manifest + the MUST of 3.6: compat_id of "compat" equals namespace field 2."""
    manifest = parse_manifest(data)
    manifest.check_namespace(namespace)
    return manifest

