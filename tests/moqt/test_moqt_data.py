"""Data plane: subgroup / fetch streams and datagrams — round trips, every chunking, zero copy."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moqt_strategies import fetch_streams, raw_properties, subgroup_streams, u8, u64

from relay.moqt import (
    PADDING_DATAGRAM_TYPE,
    EndOfRange,
    EndOfRangeType,
    FetchHeader,
    FetchObject,
    FetchStreamEncoder,
    FetchStreamParser,
    GroupOrder,
    ObjectDatagram,
    ObjectStatus,
    SubgroupHeader,
    SubgroupIdMode,
    SubgroupObject,
    SubgroupStreamEncoder,
    SubgroupStreamParser,
    UniStreamParser,
    UniStreamType,
    decode_datagram,
    encode_datagram,
    encode_subgroup_object_header,
    encode_vi64,
)
from relay.moqt.dataplane import PADDING_STREAM_HEADER

VALID_SUBGROUP_FLAGS = [
    v
    for lo, hi in ((0x10, 0x15), (0x18, 0x1D), (0x30, 0x35), (0x38, 0x3D), (0x50, 0x55),
                   (0x58, 0x5D), (0x70, 0x75), (0x78, 0x7D))
    for v in range(lo, hi + 1)
]


def feed_chunks(parser: Any, raw: bytes, cuts: list[int]) -> list[Any]:
    out: list[Any] = []
    prev = 0
    for c in [*cuts, len(raw)]:
        out += parser.feed(raw[prev:c])
        prev = c
    out += parser.end_of_stream()
    return out


def split(raw: bytes, cuts: list[int]) -> list[bytes]:
    """``raw`` as a transport would hand it over: chunks, some possibly empty."""
    bounds = [0, *cuts, len(raw)]
    return [raw[a:b] for a, b in pairwise(bounds)]


def build_subgroup(hdr_kw: dict[str, Any], objs: list[Any]) -> tuple[bytes, list[Any]]:
    hdr = SubgroupHeader(**hdr_kw)
    enc = SubgroupStreamEncoder(hdr)
    parts = [enc.header_bytes()]
    expected: list[Any] = [hdr]
    for oid, payload, status, props in objs:
        if status == ObjectStatus.NORMAL:
            parts.append(enc.object_header(oid, len(payload), props))
            parts.append(payload)
        else:
            parts.append(enc.status_object(oid, status))
        expected.append(SubgroupObject(oid, payload, status, props))
    return b"".join(parts), expected


def build_fetch(rid: int, order: GroupOrder, elems: list[Any]) -> tuple[bytes, list[Any]]:
    enc = FetchStreamEncoder(rid, order)
    parts = [enc.header_bytes()]
    expected: list[Any] = [FetchHeader(rid)]
    for e in elems:
        if e[0] == "end":
            _, kind, g, o = e
            parts.append(enc.end_of_range(kind, g, o))
            expected.append(EndOfRange(kind, g, o))
        else:
            _, g, sub, o, prio, payload, props = e
            parts.append(enc.object_header(g, sub, o, prio, len(payload), props))
            parts.append(payload)
            expected.append(FetchObject(g, sub, o, prio, payload, props or None))
    return b"".join(parts), expected


@settings(max_examples=300, deadline=None)
@given(subgroup_streams(), st.data())
def test_subgroup_streams_round_trip_any_chunking(stream: Any, data: st.DataObject) -> None:
    raw, expected = build_subgroup(*stream)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    parser = UniStreamParser()
    assert feed_chunks(parser, raw, cuts) == expected
    assert parser.kind == UniStreamType.SUBGROUP
    # as the session reads a data stream: a batch of chunks at a time, payloads spanning
    # many chunks taken whole
    batched = SubgroupStreamParser()
    chunks = split(raw, cuts)
    out = batched.feed_chunks(chunks[:2]) + batched.feed_chunks(chunks[2:])
    assert out + batched.end_of_stream() == expected
    sub = parser.parser.subgroup_id  # type: ignore[union-attr]
    hdr = expected[0]
    if hdr.subgroup_id_mode == SubgroupIdMode.FIRST_OBJECT_ID:
        assert sub == (expected[1].object_id if len(expected) > 1 else None)
    else:
        assert sub == hdr.subgroup_id


@pytest.mark.parametrize("flags", VALID_SUBGROUP_FLAGS)
def test_every_valid_subgroup_flag_value(flags: int) -> None:
    mode = SubgroupIdMode((flags & 0x06) >> 1)
    hdr = SubgroupHeader(
        7, 9, {SubgroupIdMode.ZERO: 0, SubgroupIdMode.FIRST_OBJECT_ID: None}.get(mode, 3),
        None if flags & 0x20 else 5, first_object=bool(flags & 0x40),
        end_of_group=bool(flags & 0x08), has_properties=bool(flags & 0x01),
        subgroup_id_mode=mode,
    )
    assert hdr.type_flags == flags
    props = b"\x02\x05" if flags & 0x01 else None
    raw, expected = build_subgroup(
        hdr.__dict__, [(4, b"abc", ObjectStatus.NORMAL, props),
                       (6, b"", ObjectStatus.END_OF_GROUP, b"" if props else None)])
    assert raw[0] == flags
    assert UniStreamParser().feed(raw, True) == expected


@settings(max_examples=300, deadline=None)
@given(fetch_streams(), st.data())
def test_fetch_streams_round_trip_both_orders(stream: Any, data: st.DataObject) -> None:
    rid, order, elems = stream
    raw, expected = build_fetch(rid, order, elems)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    assert feed_chunks(FetchStreamParser(order), raw, cuts) == expected
    batched = FetchStreamParser(order)
    assert batched.feed_chunks(split(raw, cuts)) + batched.end_of_stream() == expected
    # Group Order learned late (fill stream before SUBSCRIBE_OK): bytes are held, then parsed.
    late = UniStreamParser()
    out = []
    prev = 0
    for c in [*cuts, len(raw)]:
        out += late.feed(raw[prev:c])
        prev = c
    out += late.end_of_stream()
    assert out == expected[: len(out)]
    out += late.set_group_order(order)
    assert out == expected


def _fixed_subgroup() -> tuple[bytes, list[Any]]:
    return build_subgroup(
        dict(track_alias=300, group_id=5000, subgroup_id=2, publisher_priority=9,
             has_properties=True),
        [(0, b"x" * 130, ObjectStatus.NORMAL, b"\x02\x05\x03\x02hi"),
         (1, b"", ObjectStatus.NORMAL, b""),
         (200, b"yz", ObjectStatus.NORMAL, b""),
         (201, b"", ObjectStatus.END_OF_TRACK, b"")],
    )


def _fixed_fetch() -> tuple[bytes, list[Any]]:
    return build_fetch(5, GroupOrder.DESCENDING, [
        ("obj", 90, 0, 0, 3, b"a" * 140, None),
        ("obj", 90, 2, 1, 3, b"b", b"\x04\x01"),
        ("obj", 90, 3, 7, 4, b"", None),
        ("end", EndOfRangeType.TIMED_OUT, 80, 2),
        ("obj", 80, 3, 3, 4, b"c", None),
        ("obj", 2, None, 0, 1, b"d", None),
        ("end", EndOfRangeType.NON_EXISTENT, 0, 5),
    ])


@pytest.mark.parametrize("build", [_fixed_subgroup, _fixed_fetch])
def test_data_streams_split_at_every_offset_and_byte_by_byte(build: Any) -> None:
    raw, expected = build()
    order = GroupOrder.DESCENDING
    for i in range(len(raw) + 1):
        assert feed_chunks(UniStreamParser(order), raw, [i]) == expected, i
    assert feed_chunks(UniStreamParser(order), raw, list(range(len(raw)))) == expected


def test_payload_inside_one_chunk_is_a_zero_copy_view() -> None:
    payload = bytes(range(256)) * 128
    enc = SubgroupStreamEncoder(SubgroupHeader(1, 2, 0, 3))
    raw = enc.header_bytes() + enc.object_header(0, len(payload)) + payload
    items = SubgroupStreamParser().feed(raw)
    obj = items[1]
    assert isinstance(obj.payload, memoryview)
    assert obj.payload.obj is raw  # a view of the received chunk, not a copy
    assert obj.payload == payload


def test_payload_after_a_cut_header_is_still_a_view_of_the_next_chunk() -> None:
    payload = b"p" * 5000
    enc = SubgroupStreamEncoder(SubgroupHeader(1, 2, 0, 3))
    head = enc.header_bytes() + enc.object_header(0, len(payload))
    chunk2 = head[-2:] + payload
    parser = SubgroupStreamParser()
    assert len(parser.feed(head[:-2])) == 1
    obj = parser.feed(chunk2)[0]
    assert isinstance(obj.payload, memoryview) and obj.payload.obj is chunk2


def test_payload_spanning_chunks_is_joined_once() -> None:
    payload = bytes(range(256)) * 40
    enc = SubgroupStreamEncoder(SubgroupHeader(1, 2, 0, 3))
    raw = enc.header_bytes() + enc.object_header(0, len(payload)) + payload
    parser = SubgroupStreamParser()
    out = []
    for i in range(0, len(raw), 1200):
        out += parser.feed(raw[i : i + 1200])
    assert out[1].payload == payload and isinstance(out[1].payload, bytes)


def test_encoder_returns_framing_only() -> None:
    assert encode_subgroup_object_header(0, 32836) == bytes.fromhex("00 c0 80 44")
    assert encode_subgroup_object_header(2, 0, status=ObjectStatus.END_OF_GROUP) == b"\x02\x00\x03"
    assert encode_subgroup_object_header(0, 0) == b"\x00\x00\x00"  # empty Normal Object
    enc = FetchStreamEncoder(1)
    assert enc.object_header(3, 0, 0, 7, 32836) == bytes.fromhex("1c 03 00 07 c0 80 44")
    assert enc.object_header(3, 0, 1, 7, 10) == bytes.fromhex("00 0a")
    assert enc.object_header(3, 4, 2, 7, 10) == bytes.fromhex("03 04 0a")
    assert enc.object_header(3, 4, 3, 7, 10) == bytes.fromhex("01 0a")
    assert enc.object_header(3, 5, 9, 8, 10) == bytes.fromhex("16 06 08 0a")


def test_fetch_encoder_rejects_bad_orders() -> None:
    enc = FetchStreamEncoder(1, GroupOrder.ASCENDING)
    enc.object_header(5, 0, 0, 1, 1)
    with pytest.raises(ValueError):
        enc.object_header(4, 0, 0, 1, 1)
    with pytest.raises(ValueError):
        enc.end_of_range(EndOfRangeType.UNKNOWN, 5, 9)  # cannot end in the same Group


@st.composite
def datagrams(draw: Any) -> ObjectDatagram:
    status = draw(st.none() | st.sampled_from(ObjectStatus))
    props = draw(st.none() | raw_properties.filter(bool))
    if status not in (None, ObjectStatus.NORMAL):
        props = None
    return ObjectDatagram(
        draw(u64), draw(u64), draw(st.just(0) | u64), draw(st.none() | u8),
        b"" if status is not None else draw(st.binary(max_size=30)), status, props,
        status is None and draw(st.booleans()),
    )


@settings(max_examples=300)
@given(datagrams())
def test_datagrams_round_trip(d: ObjectDatagram) -> None:
    assert decode_datagram(encode_datagram(d)) == d


def test_padding_datagram_and_stream_are_discarded() -> None:
    assert decode_datagram(encode_vi64(PADDING_DATAGRAM_TYPE) + bytes(95)) is None
    parser = UniStreamParser()
    assert parser.feed(PADDING_STREAM_HEADER[:2]) == []
    assert parser.feed(PADDING_STREAM_HEADER[2:] + bytes(50)) == []
    assert parser.kind == UniStreamType.PADDING
    assert parser.feed(bytes(10), True) == []


def test_control_stream_dispatch() -> None:
    from relay.moqt import Setup, encode_message

    raw = encode_message(Setup(max_filter_ranges=8))
    parser = UniStreamParser()
    assert parser.feed(raw[:1]) == []
    assert parser.feed(raw[1:]) == [Setup(max_filter_ranges=8)]
    assert parser.kind == UniStreamType.CONTROL


@pytest.mark.parametrize("tail", [[40, 50], [40, 49], [40, 51], [90], [30, 30, 30, 7]])
def test_feed_chunks_at_and_around_a_payload_end(tail: list[int]) -> None:
    """A batch of chunks ending exactly at, just before or just after the end of the payload
    being collected (the cases where feed_chunks keeps or joins the batch)."""
    enc = SubgroupStreamEncoder(SubgroupHeader(1, 0, 0, 0, first_object=True))
    payloads = [bytes([i]) * 100 for i in range(3)]
    heads = [enc.header_bytes()] + [enc.object_header(i, 100) for i in range(3)]
    raw = heads[0] + b"".join(h + p for h, p in zip(heads[1:], payloads, strict=True))
    first = len(heads[0]) + len(heads[1]) + 10  # inside Object 0's payload
    cuts = [first]
    for n in tail:
        cuts.append(cuts[-1] + n)
    chunks = split(raw, cuts)
    parser = SubgroupStreamParser()
    out = parser.feed(chunks[0])
    out += parser.feed_chunks(chunks[1:len(tail) + 1])
    out += parser.feed_chunks(chunks[len(tail) + 1:]) + parser.end_of_stream()
    assert [bytes(o.payload) for o in out[1:]] == payloads
