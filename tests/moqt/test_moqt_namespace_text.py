"""The one text form of a Track Namespace (relay/moqt/namespace_text.py): every namespace,
awkward bytes included, reads back as itself; the text is canonical; reading is lenient only
where nothing is ambiguous; the peers read what they print."""

from __future__ import annotations

import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from relay.kvcs.namespace import KvcsNamespace
from relay.moqt.namespace_text import (
    format_field,
    format_full_track_name,
    format_namespace,
    parse_namespace,
)
from relay.peers.errors import InputError
from relay.peers.inputs import format_namespace as peers_format
from relay.peers.inputs import parse_namespace_text

# Fields that would break a naive form: empty, the separator, the hex marker, whitespace,
# non-ASCII, NUL, text that reads as hex, "." and "..".
AWKWARD = [b"", b"/", b"//", b"hex:", b"hex:00", b"HEX:00", b" ", b"a b", b"\n", b"\x00",
           b"\xff", "é".encode(), b"00ff", b".", b"..", b"~", b"kvcs-1", b":", b"a/b"]
fields = st.one_of(st.sampled_from(AWKWARD), st.binary(max_size=40),
                   st.text(max_size=12).map(str.encode))


@settings(max_examples=150, deadline=None)
@given(st.lists(fields, max_size=8))
@example([b"kvcs-1", b"/", b"", b"hex:ab"])
def test_every_namespace_reads_back_as_itself(ns: list[bytes]) -> None:
    text = format_namespace(ns)
    assert parse_namespace(text) == tuple(ns)
    # Canonical: reading and writing again changes nothing; no part is empty (so the
    # leniency about empty parts never drops a field) and nothing needs quoting.
    assert format_namespace(parse_namespace(text)) == text
    assert all(text.split("/")) if ns else text == ""
    assert not any(c.isspace() or c in "\"'\\$*?" for c in text)


def test_the_form_of_each_kind_of_field() -> None:
    assert format_namespace((b"kvcs-1", b"\x00\xff", b"room_1.a~b")) == \
        "kvcs-1/hex:00ff/room_1.a~b"
    for awkward in (b"", b"/", b"hex:00", b"a b", b"\xff", b"a:b"):
        assert format_field(awkward).startswith("hex:"), awkward
    assert format_full_track_name((b"kvcs-1", b"\x01"), b"k.raw.s0") == "kvcs-1/hex:01 k.raw.s0"


def test_reading_is_lenient_only_where_nothing_is_ambiguous() -> None:
    assert parse_namespace(" /kvcs-1//hex:00FF/ \n") == (b"kvcs-1", b"\x00\xff")
    assert parse_namespace("") == ()
    assert parse_namespace("kvcs-1/00ff/é") == (b"kvcs-1", b"00ff", "é".encode())
    for bad in ("kvcs-1/hex:zz", "kvcs-1/hex:0", "hex:0 0"):
        with pytest.raises(ValueError, match="hex digits") as e:
            parse_namespace(bad)
        assert "\n" not in str(e.value)


def test_the_peers_read_what_they_print_and_explain_the_old_form() -> None:
    ns = KvcsNamespace(os.urandom(32), os.urandom(32), os.urandom(32), os.urandom(16))
    text = peers_format(ns)
    assert text == format_namespace(ns.fields) and text.count("hex:") == 4
    assert parse_namespace_text(text) == ns
    old = "/".join(["kvcs-1", *(f.hex() for f in ns.fields[1:])])  # before: bare hex
    with pytest.raises(InputError, match="kvcs-1/hex:<scope>"):
        parse_namespace_text(old)
