"""Pure WebTransport helpers: error-code mapping, capsules, structured fields."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.transport.h3wire import (
    WT_APP_ERROR_FIRST,
    WT_APP_ERROR_LAST,
    CapsuleParser,
    app_to_wt_error,
    decode_close_capsule,
    encode_close_capsule,
    parse_sf_item,
    parse_sf_list,
    select_protocol,
    sf_string,
    wt_to_app_error,
)


@given(st.integers(min_value=0, max_value=0xFFFFFFFF))
def test_error_code_mapping_round_trips(code: int) -> None:
    wire = app_to_wt_error(code)
    assert WT_APP_ERROR_FIRST <= wire <= WT_APP_ERROR_LAST
    assert (wire - 0x21) % 0x1F != 0  # never lands on a GREASE code point
    assert wt_to_app_error(wire) == code


def test_error_code_mapping_edges() -> None:
    assert app_to_wt_error(0) == WT_APP_ERROR_FIRST
    assert app_to_wt_error(0x1D) == WT_APP_ERROR_FIRST + 0x1D
    assert app_to_wt_error(0x1E) == WT_APP_ERROR_FIRST + 0x1F  # skips a GREASE point
    assert app_to_wt_error(0xFFFFFFFF) == WT_APP_ERROR_LAST
    assert wt_to_app_error(WT_APP_ERROR_FIRST + 0x1E) is None  # GREASE
    assert wt_to_app_error(0x100) is None  # H3_NO_ERROR is not an application code
    with pytest.raises(ValueError):
        app_to_wt_error(1 << 32)


@given(st.integers(min_value=0, max_value=0xFFFFFFFF), st.text(max_size=50),
       st.integers(min_value=1, max_value=7))
def test_close_capsule_round_trips_in_pieces(code: int, reason: str, step: int) -> None:
    raw = b"\x40\x29\x00" + encode_close_capsule(code, reason)  # unknown capsule first
    parser = CapsuleParser()
    got = []
    for i in range(0, len(raw), step):
        got += parser.feed(raw[i:i + step])
    assert got[0] == (0x29, b"")
    assert len(got) == 2 and got[1][0] == 0x2843
    assert decode_close_capsule(got[1][1]) == (code, reason)


def test_structured_fields() -> None:
    assert sf_string("moqt-22") == b'"moqt-22"'
    assert parse_sf_list(b'"moqt-21", "moqt-22";q=1, moqt-23') == ["moqt-21", "moqt-22",
                                                                     "moqt-23"]
    assert parse_sf_list(b'"a\\"b"') == ['a"b']
    assert parse_sf_item(b'"moqt-22"') == "moqt-22"
    assert parse_sf_item(b"moqt-22") == "moqt-22"
    assert parse_sf_item(b"") is None
    assert select_protocol(b'"moqt-20", "moqt-22"', "moqt-22") == "moqt-22"
    assert select_protocol(b"moqt-22", "moqt-22") == "moqt-22"
    assert select_protocol(b'"moqt-20"', "moqt-22") is None
    assert select_protocol(None, "moqt-22") is None
