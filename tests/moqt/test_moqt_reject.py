"""Appendix B: one test per must-reject item the codec decides, asserting the exception type
and code. The items that need session state (Request IDs, Track Aliases, what may follow what
on a control or request stream) are in ``test_moqt_state.py``, on two paired session states."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from relay.moqt import (
    MAX_VI64,
    ControlStreamParser,
    FetchStreamParser,
    GroupOrder,
    InvalidRequest,
    ParameterType,
    Params,
    ParamScope,
    Range,
    RangeFilter,
    RequestError,
    RequestErrorCode,
    RequestOk,
    SessionError,
    SessionErrorCode,
    Setup,
    SubgroupStreamParser,
    UniStreamParser,
    check_filter_ranges,
    decode_datagram,
    decode_params,
    encode_message,
    encode_vi64,
)
from relay.moqt.reader import Reader

PV = SessionErrorCode.PROTOCOL_VIOLATION


def session_error(code: SessionErrorCode, fn: Callable[[], Any]) -> None:
    with pytest.raises(SessionError) as e:
        fn()
    assert e.value.code == code


def request_error(code: RequestErrorCode, fn: Callable[[], Any]) -> None:
    with pytest.raises(RequestError) as e:
        fn()
    assert e.value.code == code


def control(hexed: str | bytes) -> list[Any]:
    raw = bytes.fromhex(hexed) if isinstance(hexed, str) else hexed
    return ControlStreamParser().feed(raw, end_stream=True)


def frame(msg_type: int, body: bytes) -> bytes:
    return encode_vi64(msg_type) + len(body).to_bytes(2, "big") + body


def sub_params(params_hex: str) -> bytes:
    """A SUBSCRIBE (Request 0, namespace ("a",), name "t") with a raw parameter list."""
    return frame(0x03, bytes.fromhex("00 01 01 61 01 74" + params_hex))


def params_of(scope: ParamScope, hexed: str) -> Params:
    return decode_params(Reader(bytes.fromhex(hexed)), scope)


# --- control framing --------------------------------------------------------------------------

def test_length_shorter_than_body() -> None:
    session_error(PV, lambda: control("10 00 01 00 c0 75 30"))  # GOAWAY, fields run past Length


def test_length_longer_than_body() -> None:
    session_error(PV, lambda: control("10 00 03 00 05 00"))  # a trailing byte in the body


def test_unknown_message_type() -> None:
    session_error(PV, lambda: control("01 00 00"))
    session_error(PV, lambda: control("40 41 00 00"))


def test_cut_message_at_end_of_stream() -> None:
    session_error(PV, lambda: control("10 00 04 00 c0"))


# --- parameters -------------------------------------------------------------------------------

def test_unknown_parameter() -> None:
    session_error(PV, lambda: control(sub_params("01 01 00")))  # type 0x01


def test_parameter_not_allowed_in_message() -> None:
    session_error(PV, lambda: control(sub_params("01 09 00 00")))  # LARGEST_OBJECT in SUBSCRIBE


def test_non_allowed_duplicate_parameter() -> None:
    session_error(PV, lambda: control(sub_params("02 20 01 00 02")))  # SUBSCRIBER_PRIORITY twice


def test_allowed_duplicates_pass() -> None:
    p = params_of(ParamScope.SUBSCRIBE, "02 03 02 03 00 00 02 03 00")
    assert len(p.authorization_tokens) == 2


def test_parameter_type_past_2_64() -> None:
    big = encode_vi64(MAX_VI64).hex()
    session_error(PV, lambda: params_of(ParamScope.SUBSCRIBE, "02 20 01 " + big + " 00"))


def test_forward_not_0_or_1() -> None:
    session_error(PV, lambda: control(sub_params("01 10 02")))


def test_include_properties_not_0_or_1() -> None:
    session_error(PV, lambda: control(sub_params("01 35 05")))


def test_group_order_not_1_or_2() -> None:
    session_error(PV, lambda: control(sub_params("01 22 00")))
    session_error(PV, lambda: control(sub_params("01 22 03")))


def test_location_filter_type_above_5() -> None:
    session_error(PV, lambda: control(sub_params("01 21 06")))


def test_location_filter_end_group_overflow() -> None:
    big = encode_vi64(MAX_VI64).hex()
    session_error(PV, lambda: control(sub_params(f"01 21 03 {big} 00 01")))


def test_parameter_inside_fill_outside_its_list() -> None:
    # FILL_PARAMETERS { FORWARD 1 }: FORWARD is not allowed inside.
    session_error(PV, lambda: control(sub_params("01 23 03 01 10 01")))
    # and a nested FILL_PARAMETERS is not either
    session_error(PV, lambda: control(sub_params("01 23 03 01 23 00")))


def test_fill_parameter_value_checks() -> None:
    session_error(PV, lambda: control(sub_params("01 23 03 01 22 07")))  # GROUP_ORDER 7 inside


def test_undecodable_token() -> None:
    code = SessionErrorCode.KEY_VALUE_FORMATTING_ERROR
    session_error(code, lambda: control(sub_params("01 03 01 07")))  # Alias Type 7
    session_error(code, lambda: control(sub_params("01 03 01 01")))  # REGISTER without alias


# --- names and phrases ------------------------------------------------------------------------

def test_namespace_more_than_32_fields() -> None:
    body = bytes.fromhex("00 21") + b"\x01a" * 33 + bytes.fromhex("00 00")
    session_error(PV, lambda: control(frame(0x03, body)))


def test_empty_namespace_field() -> None:
    session_error(PV, lambda: control(frame(0x03, bytes.fromhex("00 02 01 61 00 00 00"))))


def test_full_track_name_over_4096() -> None:
    body = bytes.fromhex("00 01 c0 08 00") + b"n" * 2048 + bytes.fromhex("c0 08 01") + b"t" * 2049
    session_error(PV, lambda: control(frame(0x03, body + b"\x00")))
    ns_only = bytes.fromhex("00 02 c0 08 00") + b"n" * 2048 + bytes.fromhex("c0 08 01")
    session_error(PV, lambda: control(frame(0x06, ns_only + b"m" * 2049 + b"\x00")))


def test_reason_phrase_over_1024() -> None:
    body = bytes.fromhex("02 00 c0 04 01") + b"r" * 1025
    session_error(PV, lambda: control(frame(0x0B, body)))


def test_goaway_uri_over_8192() -> None:
    body = bytes.fromhex("c0 20 01") + b"u" * 8193 + b"\x00"
    session_error(PV, lambda: control(frame(0x10, body)))


# --- data plane -------------------------------------------------------------------------------

def test_subgroup_flags_at_least_0x80() -> None:
    session_error(PV, lambda: SubgroupStreamParser().feed(bytes.fromhex("80 90 01 01 00")))
    session_error(PV, lambda: UniStreamParser().feed(bytes.fromhex("80 90 01 01 00")))


def test_subgroup_flags_without_bit_0x10() -> None:
    session_error(PV, lambda: SubgroupStreamParser().feed(bytes.fromhex("40 01 01 00")))
    session_error(PV, lambda: UniStreamParser().feed(bytes.fromhex("40 01 01 00")))


def test_subgroup_mode_0b11() -> None:
    session_error(PV, lambda: UniStreamParser().feed(bytes.fromhex("16 01 01 00")))


def test_properties_on_non_normal_object() -> None:
    # PROPERTIES stream (0x11); Object 0: Properties Length 2, Payload Length 0, Status 3.
    raw = bytes.fromhex("11 01 01 00 00 02 02 05 00 03")
    session_error(PV, lambda: UniStreamParser().feed(raw))
    bad_dgram = bytes.fromhex("21 01 01 00 00 02 02 05 03")
    session_error(PV, lambda: decode_datagram(bad_dgram))


def test_unknown_object_status() -> None:
    session_error(PV, lambda: UniStreamParser().feed(bytes.fromhex("10 01 01 00 00 00 01")))


def test_fetch_flags_at_least_0x80_other_than_markers() -> None:
    for flags in ("80 80", "80 8d", "81 0d", "82 0d", "83 0c"):  # 82 0c is 0x20C, valid
        session_error(PV, lambda f=flags: FetchStreamParser(GroupOrder.ASCENDING).feed(
            bytes.fromhex(f"05 00 {f} 00 00 00")))


def test_first_fetch_object_refers_to_previous() -> None:
    # no Group delta / no Object delta / no priority / previous Subgroup (x2)
    for flags in ("14", "18", "0c", "1d", "1e"):
        session_error(PV, lambda f=flags: FetchStreamParser(GroupOrder.ASCENDING).feed(
            bytes.fromhex(f"05 00 {f} 00 00 00 00 01 61")))


def test_group_id_below_zero() -> None:
    raw = bytes.fromhex("05 00 1c 01 00 07 00 08 01 00")  # {1,0} then Group 1-(1+1) = -1
    session_error(PV, lambda: FetchStreamParser(GroupOrder.DESCENDING).feed(raw))


def test_group_id_past_2_64() -> None:
    big = encode_vi64(MAX_VI64).hex()
    raw = bytes.fromhex(f"05 00 1c {big} 00 07 00 08 00 00")
    session_error(PV, lambda: FetchStreamParser(GroupOrder.ASCENDING).feed(raw))


def test_fin_inside_an_object() -> None:
    cut = bytes.fromhex("10 01 01 00 00 05 61 62")
    session_error(PV, lambda: UniStreamParser().feed(cut, True))
    session_error(PV, lambda: UniStreamParser().feed(bytes.fromhex("10 01 01 00 00"), True))
    p = FetchStreamParser(GroupOrder.ASCENDING)
    p.feed(bytes.fromhex("05 00 1c 00 00 00 04 61"))
    session_error(PV, p.end_of_stream)


def test_bad_datagrams() -> None:
    for hexed in ("10 01 01 61", "40 01 01 61", "22 01 01 00 00", "01 01 01 00 00 61"):
        session_error(PV, lambda h=hexed: decode_datagram(bytes.fromhex(h)))


# --- bad KVP values -----------------------------------------------------------------------


def test_bad_kvp_value_for_known_type() -> None:
    code = SessionErrorCode.KEY_VALUE_FORMATTING_ERROR
    # SUBSCRIBE_OK with DEFAULT_PUBLISHER_GROUP_ORDER = 3.
    session_error(code, lambda: control("04 00 04 01 00 22 03"))
    # SETUP whose AUTHORIZATION_TOKEN option is undecodable.
    session_error(code, lambda: control("af 00 00 03 03 01 09"))


def test_setup_path_from_server_or_bad_utf8() -> None:
    from relay.moqt import check_setup

    session_error(SessionErrorCode.INVALID_PATH,
                  lambda: check_setup(Setup(path="/x"), sender_is_client=False))
    session_error(SessionErrorCode.INVALID_AUTHORITY,
                  lambda: check_setup(Setup(authority="h"), sender_is_client=True,
                                      webtransport=True))
    session_error(SessionErrorCode.MALFORMED_PATH, lambda: control("af 00 00 03 01 01 ff"))


# --- range filters: request errors, not session errors ------------------------------------------

def test_range_filter_delta_overflow() -> None:
    big = encode_vi64(MAX_VI64).hex()
    n = 1 + 2 * len(bytes.fromhex(big))
    request_error(RequestErrorCode.INVALID_FILTER,
                  lambda: params_of(ParamScope.FETCH, f"01 26 {n:02x} 00 {big} {big}"))


def test_priority_filter_above_255() -> None:
    request_error(RequestErrorCode.INVALID_FILTER,
                  lambda: params_of(ParamScope.FETCH, "01 27 04 00 00 81 00"))


def test_odd_property_type() -> None:
    request_error(RequestErrorCode.INVALID_FILTER,
                  lambda: params_of(ParamScope.FETCH, "01 28 03 00 03 01"))


def test_same_type_setid_property_twice() -> None:
    request_error(RequestErrorCode.INVALID_FILTER,
                  lambda: params_of(ParamScope.FETCH, "02 26 02 00 01 00 02 00 05"))
    params_of(ParamScope.FETCH, "02 26 02 00 01 00 02 01 05")  # different SetID: fine


def test_max_filter_ranges() -> None:
    f = RangeFilter(ParameterType.OBJECTID_FILTER, 0, (Range(0, 1), Range(3, 4)))
    p = Params(range_filters=(f,), fill=Params(range_filters=(f,)))
    request_error(RequestErrorCode.INVALID_FILTER, lambda: check_filter_ranges(p, 0))
    request_error(RequestErrorCode.INVALID_FILTER, lambda: check_filter_ranges(p, 3))
    check_filter_ranges(p, 4)


def test_range_filter_error_reported_as_invalid_request() -> None:
    out = control(sub_params("01 27 04 00 00 81 00"))
    assert isinstance(out[0], InvalidRequest)
    assert out[0].error.code == RequestErrorCode.INVALID_FILTER and out[0].request_id == 0


def test_encode_message_body_limit() -> None:
    with pytest.raises(ValueError):
        encode_message(RequestOk(Params(), ((0x3801, b"x" * 65535),)))  # type: ignore[arg-type]


def test_session_error_wins_over_a_filter_error_in_the_same_list() -> None:
    # PRIORITY_FILTER 300 (request error) followed by an unknown parameter 0x2A (session error).
    session_error(PV, lambda: control(sub_params("02 27 04 00 00 81 00 03 00")))
