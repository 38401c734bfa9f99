"""Track-name ABNF of kvcs-draft 3.2."""

from __future__ import annotations

import pytest

from relay.kvcs.errors import TrackNameError
from relay.kvcs.registry import Codec, Component
from relay.kvcs.track_names import (
    DataTrackName,
    ManifestTrackName,
    data_track,
    parse_track_name,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("manifest", ManifestTrackName(signed=False)),
    ("manifest.cose", ManifestTrackName(signed=True)),
    ("k.raw.s0", DataTrackName(Component.K, "raw", 0)),
    ("v.zstd.s1", DataTrackName(Component.V, "zstd", 1)),
    ("kv.int8.s10", DataTrackName(Component.KV, "int8", 10)),
    ("k.x-9.s907", DataTrackName(Component.K, "x-9", 907)),
    ("k." + "a" * 32 + ".s0", DataTrackName(Component.K, "a" * 32, 0)),
    ("v.-.s3", DataTrackName(Component.V, "-", 3)),
])
def test_valid_names_round_trip(text: str, expected: object) -> None:
    parsed = parse_track_name(text)
    assert parsed == expected
    assert str(parsed) == text
    assert parse_track_name(text.encode("ascii")) == expected


@pytest.mark.parametrize("text", [
    "", "Manifest", "manifest.", "manifest.json", "manifest.cose.s0",
    "k.raw", "k.raw.0", "k.raw.s", "k.raw.s01", "k.raw.s00", "k.raw.s-1", "k.raw.s1a",
    "k.raw.S0", "K.raw.s0", "q.raw.s0", "vk.raw.s0", "k..s0", "k.RAW.s0", "k.ra_w.s0",
    "k.ra w.s0", "k." + "a" * 33 + ".s0", "k.raw.s0.", ".k.raw.s0", "k.raw.s0 ",
    "k.raw.s 0", "k.raw.s\u0661", "k.r\u00e4w.s0", "k.raw.s" + "9" * 20,
])
def test_invalid_names(text: str) -> None:
    with pytest.raises(TrackNameError):
        parse_track_name(text)


def test_non_ascii_octets_rejected() -> None:
    with pytest.raises(TrackNameError, match="ASCII"):
        parse_track_name(b"k.r\xc3\xa4w.s0")


def test_codec_value_and_constructor() -> None:
    assert data_track("k", Codec.ZSTD, 2).codec_value is Codec.ZSTD
    assert str(data_track(Component.KV, "int8", 0)) == "kv.int8.s0"
    assert DataTrackName(Component.K, "brotli", 0).codec_value is None
    with pytest.raises(TrackNameError):
        DataTrackName(Component.K, "Raw", 0)
    with pytest.raises(TrackNameError):
        DataTrackName(Component.K, "raw", -1)
