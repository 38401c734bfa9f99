"""Control messages and parameters: hypothesis round trips and chunk-boundary independence."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moqt_strategies import location_filters, messages, params, tokens

from relay.moqt import (
    ControlStreamParser,
    InvalidRequest,
    Location,
    LocationFilter,
    Message,
    Params,
    ParamScope,
    RequestOk,
    Setup,
    Subscribe,
    decode_message,
    decode_params,
    decode_token,
    decode_vi64,
    encode_message,
    encode_params,
    encode_token,
)
from relay.moqt.location_filter import decode_location_filter, encode_location_filter
from relay.moqt.reader import Reader


def _parse_chunks(raw: bytes, cuts: list[int]) -> list[Any]:
    p = ControlStreamParser()
    out: list[Any] = []
    prev = 0
    for c in [*cuts, len(raw)]:
        out += p.feed(raw[prev:c])
        prev = c
    out += p.end_of_stream()
    return out


@settings(max_examples=400, deadline=None)
@given(messages())
def test_every_message_round_trips(msg: Message) -> None:
    raw = encode_message(msg)
    msg_type, p = decode_vi64(raw)
    assert msg_type == msg.TYPE
    assert int.from_bytes(raw[p : p + 2], "big") == len(raw) - p - 2
    assert decode_message(msg_type, raw[p + 2 :]) == msg
    assert ControlStreamParser().feed(raw, True) == [msg]


@settings(max_examples=60, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=4), st.data())
def test_message_sequences_any_chunking(msgs: list[Message], data: st.DataObject) -> None:
    raw = b"".join(encode_message(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    assert _parse_chunks(raw, cuts) == msgs


@settings(max_examples=25, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=3))
def test_split_at_every_offset_and_byte_by_byte(msgs: list[Message]) -> None:
    raw = b"".join(encode_message(m) for m in msgs)
    for i in range(len(raw) + 1):
        assert _parse_chunks(raw, [i]) == msgs
    assert _parse_chunks(raw, list(range(len(raw)))) == msgs


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(ParamScope)).flatmap(lambda s: st.tuples(st.just(s), params(s))))
def test_params_round_trip_in_every_scope(arg: tuple[ParamScope, Params]) -> None:
    scope, p = arg
    raw = encode_params(p, scope)
    r = Reader(raw)
    assert decode_params(r, scope) == p
    assert r.at_end()


@settings(max_examples=200)
@given(location_filters())
def test_location_filter_round_trip(f: LocationFilter) -> None:
    raw = encode_location_filter(f)
    r = Reader(raw)
    assert decode_location_filter(r) == f
    assert r.at_end()


@settings(max_examples=200)
@given(tokens())
def test_token_round_trip(t: Any) -> None:
    assert decode_token(encode_token(t)) == t


def test_fill_parameters_nested_and_empty() -> None:
    p = Params(location_filter=LocationFilter.next_object(), fill=Params())
    raw = encode_params(p, ParamScope.SUBSCRIBE)
    assert raw == bytes.fromhex("02 21 05 02 01 00")  # Length 1, count 0
    assert decode_params(Reader(raw), ParamScope.SUBSCRIBE) == p
    # A zero-length value (no count byte) is read leniently as an empty list.
    assert decode_params(Reader(bytes.fromhex("01 23 00")), ParamScope.SUBSCRIBE) == Params(
        fill=Params()
    )


def test_setup_ignores_unknown_and_grease_options() -> None:
    grease = 0x7F * 3 + 0x9D
    raw = encode_message(Setup(max_filter_ranges=2, unknown_options=((grease, 7), (grease, 8))))
    msg = ControlStreamParser().feed(raw)[0]
    assert msg.max_filter_ranges == 2
    assert [p.type for p in msg.unknown_options] == [grease, grease]


def test_request_ok_with_properties_round_trips() -> None:
    msg = RequestOk(Params(largest_object=Location(1, 2)), ((0x22, 1), (0x3801, b"x")))
    assert ControlStreamParser().feed(encode_message(msg)) == [msg]


def test_invalid_request_keeps_the_stream_usable() -> None:
    bad = Subscribe(6, (b"a",), b"t")
    raw = bytearray(encode_message(bad))
    # Replace the empty parameter list by a PRIORITY_FILTER starting at 300 (> 255).
    raw[-1] = 1  # one parameter
    raw += bytes.fromhex("27 03 00 82 2c")  # PRIORITY_FILTER: SetID 0, start 300
    raw[2] += 5
    good = encode_message(Subscribe(8, (b"a",), b"t"))
    out = ControlStreamParser().feed(bytes(raw) + good)
    assert isinstance(out[0], InvalidRequest)
    assert out[0].request_id == 6
    assert out[0].error.code == 0x36
    assert out[1] == Subscribe(8, (b"a",), b"t")


def test_encoder_refuses_disallowed_parameter() -> None:
    with pytest.raises(ValueError):
        encode_message(Subscribe(0, (), b"", Params(largest_object=Location(0, 0))))
