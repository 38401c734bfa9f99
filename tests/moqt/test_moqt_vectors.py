"""The worked byte examples of §16 (and §2.7, §6.5) as fixed vectors, both directions."""

from __future__ import annotations

import pytest

from relay.moqt import (
    ControlStreamParser,
    EndOfRange,
    EndOfRangeType,
    Fetch,
    FetchHeader,
    FetchObject,
    FetchOk,
    FetchStreamEncoder,
    GoAway,
    GroupOrder,
    Location,
    LocationFilter,
    Message,
    Namespace,
    ObjectStatus,
    ParameterType,
    Params,
    Publish,
    PublishDone,
    PublishNamespace,
    Range,
    RangeFilter,
    RequestErrorCode,
    RequestErrorMessage,
    RequestOk,
    RequestUpdate,
    Setup,
    SubgroupHeader,
    SubgroupObject,
    SubgroupStreamEncoder,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    Token,
    TrackStatus,
    UniStreamParser,
    encode_message,
    format_full_track_name,
)
from relay.moqt.params import ParamScope, encode_params

S, C, A, PUB = b"\x11" * 8, b"\x22" * 8, b"\x33" * 8, b"\x44" * 8
NS5 = (b"kvcs-1", S, C, A, PUB)
NS5_HEX = (
    "05 06 6b 76 63 73 2d 31 08" + " 11" * 8 + " 08" + " 22" * 8 + " 08" + " 33" * 8
    + " 08" + " 44" * 8
)
PAYLOAD = bytes(range(256)) * 128 + bytes(68)  # 32836 bytes
assert len(PAYLOAD) == 32836


def h(s: str) -> bytes:
    return bytes.fromhex(s.replace("NS5", NS5_HEX))


def _control_vectors() -> list[tuple[str, str, Message]]:
    return [
        (
            "16.1 client SETUP",
            "af 00 00 35 01 05 2f 6b 76 63 73 02 09 03 00 74 6f 6b 2d 61 62 63 "
            "02 12 72 65 6c 61 79 2e 65 78 61 6d 70 6c 65 3a 34 34 34 33 01 08 "
            "01 0b 6b 76 63 73 2d 70 79 2f 30 2e 31",
            Setup(path="/kvcs", authorization_tokens=(Token.use_value(b"tok-abc"),),
                  authority="relay.example:4443", max_filter_ranges=8,
                  moqt_implementation="kvcs-py/0.1"),
        ),
        (
            "16.1 relay SETUP",
            "af 00 00 14 06 10 01 0e 6b 76 63 73 2d 72 65 6c 61 79 2f 30 2e 31 01 04",
            Setup(max_filter_ranges=16, moqt_implementation="kvcs-relay/0.1",
                  max_request_updates=4),
        ),
        (
            "16.1 WebTransport client SETUP",
            "af 00 00 1a 03 09 03 00 74 6f 6b 2d 61 62 63 03 08 "
            "01 0b 6b 76 63 73 2d 70 79 2f 30 2e 31",
            Setup(authorization_tokens=(Token.use_value(b"tok-abc"),), max_filter_ranges=8,
                  moqt_implementation="kvcs-py/0.1"),
        ),
        (
            "16.2 SUBSCRIBE_NAMESPACE",
            "50 00 25 00 04 06 6b 76 63 73 2d 31 08" + " 11" * 8 + " 08" + " 22" * 8
            + " 08" + " 33" * 8 + " 00",
            SubscribeNamespace(0, (b"kvcs-1", S, C, A)),
        ),
        ("16.2 REQUEST_OK", "07 00 01 00", RequestOk()),
        ("16.2 NAMESPACE", "08 00 0a 01 08" + " 44" * 8, Namespace((PUB,))),
        (
            "16.3 SUBSCRIBE",
            "03 00 40 04 NS5 08 6b 2e 72 61 77 2e 73 30 02 21 05 02 05 01 21 02 00 00",
            Subscribe(4, NS5, b"k.raw.s0", Params(
                location_filter=LocationFilter.next_object(),
                fill=Params(location_filter=LocationFilter.absolute_start(0, 0)))),
        ),
        (
            "16.3 manifest SUBSCRIBE",
            "03 00 44 04 NS5 0d " + b"manifest.cose".hex() + " 02 21 05 02 04 01 21 01 01",
            Subscribe(4, NS5, b"manifest.cose", Params(
                location_filter=LocationFilter.next_object(),
                fill=Params(location_filter=LocationFilter.relative_start(1)))),
        ),
        ("16.3 SUBSCRIBE_OK", "04 00 05 01 01 09 03 28",
         SubscribeOk(1, Params(largest_object=Location(3, 40)))),
        (
            "16.4 FETCH",
            "16 00 43 06 NS5 08 76 2e 72 61 77 2e 73 30 03 21 03 04 00 03 01 01 04 03 00 00 09",
            Fetch(6, NS5, b"v.raw.s0", Params(
                location_filter=LocationFilter.absolute_group_end(4, 0, 7),
                group_order=GroupOrder.ASCENDING,
                range_filters=(RangeFilter(ParameterType.OBJECTID_FILTER, 0, (Range(0, 9),)),))),
        ),
        ("16.4 FETCH_OK", "18 00 04 00 07 40 00", FetchOk(False, Location(7, 64))),
        (
            "16.6 REQUEST_ERROR",
            "05 00 10 10 00 0d 6e 6f 20 73 75 63 68 20 74 72 61 63 6b",
            RequestErrorMessage(RequestErrorCode.DOES_NOT_EXIST, 0, "no such track"),
        ),
        ("16.6 PUBLISH_NAMESPACE", "06 00 2e 00 NS5 00", PublishNamespace(0, NS5)),
        ("16.6 PUBLISH", "1d 00 38 02 NS5 08 6b 2e 72 61 77 2e 73 30 01 00",
         Publish(2, NS5, b"k.raw.s0", 1)),
        ("16.6 REQUEST_UPDATE", "02 00 04 0a 01 20 40",
         RequestUpdate(10, Params(subscriber_priority=64))),
        ("16.6 PUBLISH_DONE", "0b 00 03 02 22 00", PublishDone(2, 34, "")),
        ("16.6 GOAWAY", "10 00 04 00 c0 75 30", GoAway("", 30000)),
        ("16.6 TRACK_STATUS", "0d 00 37 08 NS5 08 6d 61 6e 69 66 65 73 74 00",
         TrackStatus(8, NS5, b"manifest")),
    ]


CONTROL = _control_vectors()


@pytest.mark.parametrize(("name", "hexed", "msg"), CONTROL, ids=[c[0] for c in CONTROL])
def test_control_vectors(name: str, hexed: str, msg: Message) -> None:
    raw = h(hexed)
    assert encode_message(msg) == raw
    assert ControlStreamParser().feed(raw, end_stream=True) == [msg]


def test_real_sized_namespace_grows_length_by_80() -> None:
    ns = (b"kvcs-1", b"\x11" * 32, b"\x22" * 32, b"\x33" * 32, b"\x44" * 16)
    raw = encode_message(CONTROL[6][2].__class__(4, ns, b"k.raw.s0", CONTROL[6][2].params))
    assert raw[1:3] == bytes.fromhex("00 90")


def _expand(s: str) -> bytes:
    parts = s.split("<P>")
    return PAYLOAD.join(h(p) for p in parts)


def test_fill_fetch_stream_16_3() -> None:
    raw = _expand("05 04 1c 00 00 00 c0 80 44 <P> 00 c0 80 44 <P> 1c 00 00 04 c0 80 44 <P>")
    enc = FetchStreamEncoder(4)
    built = (enc.header_bytes() + enc.encode_object(0, 0, 0, 0, PAYLOAD)
             + enc.encode_object(0, 0, 1, 0, PAYLOAD) + enc.encode_object(1, 0, 0, 4, PAYLOAD))
    assert built == raw
    items = UniStreamParser(GroupOrder.ASCENDING).feed(raw, True)
    assert items == [
        FetchHeader(4),
        FetchObject(0, 0, 0, 0, PAYLOAD),
        FetchObject(0, 0, 1, 0, PAYLOAD),
        FetchObject(1, 0, 0, 4, PAYLOAD),
    ]


def test_live_subgroup_stream_16_3() -> None:
    raw = _expand("10 01 03 0c 29 c0 80 44 <P> 00 c0 80 44 <P>")
    hdr = SubgroupHeader(1, 3, 0, 12)
    enc = SubgroupStreamEncoder(hdr)
    built = enc.header_bytes() + enc.encode_object(41, PAYLOAD) + enc.encode_object(42, PAYLOAD)
    assert built == raw
    items = UniStreamParser().feed(raw, True)
    assert items == [hdr, SubgroupObject(41, PAYLOAD), SubgroupObject(42, PAYLOAD)]


def test_fetch_stream_with_unknown_range_16_4() -> None:
    objs = " 00 c0 80 44 <P>" * 9
    raw = _expand(
        "05 06 1c 04 00 10 c0 80 44 <P>" + objs + " 81 0c 00 09 00 1c 00 00 18 c0 80 44 <P>"
    )
    enc = FetchStreamEncoder(6)
    built = enc.header_bytes()
    built += b"".join(enc.encode_object(4, 0, o, 16, PAYLOAD) for o in range(10))
    built += enc.end_of_range(EndOfRangeType.UNKNOWN, 5, 9)
    built += enc.encode_object(6, 0, 0, 24, PAYLOAD)
    assert built == raw
    items = UniStreamParser(GroupOrder.ASCENDING).feed(raw, True)
    assert items[0] == FetchHeader(6)
    assert items[1:11] == [FetchObject(4, 0, o, 16, PAYLOAD) for o in range(10)]
    assert items[11] == EndOfRange(EndOfRangeType.UNKNOWN, 5, 9)
    assert items[12] == FetchObject(6, 0, 0, 24, PAYLOAD)


def test_subgroup_end_of_group_16_5() -> None:
    raw = _expand("50 01 01 04 00 c0 80 44 <P> 00 c0 80 44 <P> 00 00 03")
    hdr = SubgroupHeader(1, 1, 0, 4, first_object=True)
    enc = SubgroupStreamEncoder(hdr)
    built = (enc.header_bytes() + enc.encode_object(0, PAYLOAD) + enc.encode_object(1, PAYLOAD)
             + enc.status_object(2, ObjectStatus.END_OF_GROUP))
    assert built == raw
    assert UniStreamParser().feed(raw, True) == [
        hdr, SubgroupObject(0, PAYLOAD), SubgroupObject(1, PAYLOAD),
        SubgroupObject(2, b"", ObjectStatus.END_OF_GROUP),
    ]
    eog = SubgroupHeader(1, 1, 0, 4, first_object=True, end_of_group=True)
    assert SubgroupStreamEncoder(eog).header_bytes()[:1] == b"\x58"


def test_end_of_track_stream_16_5() -> None:
    raw = h("50 01 20 80 00 00 04")
    hdr = SubgroupHeader(1, 32, 0, 128, first_object=True)
    enc = SubgroupStreamEncoder(hdr)
    assert enc.header_bytes() + enc.status_object(0, ObjectStatus.END_OF_TRACK) == raw
    eot = SubgroupObject(0, b"", ObjectStatus.END_OF_TRACK)
    assert UniStreamParser().feed(raw, True) == [hdr, eot]


def test_objectid_filter_examples_6_5() -> None:
    two = RangeFilter(ParameterType.OBJECTID_FILTER, 0, (Range(3, 5), Range(10, 15)))
    raw = encode_params(Params(range_filters=(two,)), ParamScope.FETCH)
    assert raw == h("01 26 05 00 03 02 05 05")
    kvcs = RangeFilter(ParameterType.OBJECTID_FILTER, 0, (Range(0, 15),))
    assert encode_params(Params(range_filters=(kvcs,)), ParamScope.FETCH) == h("01 26 03 00 00 0f")


def test_log_text_form_departs_from_2_7() -> None:
    # The profile's log form (kvcs.2d1-.11.11…--k.2eraw.2es0) is not used: logs write the one
    # namespace text form that tokens, the admin API and the peers read (docs/configuration.md,
    # "Track Namespaces as text"), so a namespace in a log line can be pasted into them.
    assert format_full_track_name(NS5, b"k.raw.s0") == (
        "kvcs-1/hex:" + "11" * 8 + "/hex:" + "22" * 8 + "/33333333/DDDDDDDD k.raw.s0"
    )
