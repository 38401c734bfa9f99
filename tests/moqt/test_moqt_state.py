"""The session's rules on two sans-IO states paired in memory (Appendix B's session items,
§1.3-§1.5, §4, §5, §7, §8.3): the states the asyncio session runs decide every case here,
without QUIC, in milliseconds. ``tests/session`` keeps the few loopback cases that show a
decision really closes a session over the network."""

from __future__ import annotations

import pytest
from state_pair import Pair, closes, raw

from relay.moqt import (
    Fetch,
    FetchOk,
    GoAway,
    Location,
    LocationFilter,
    Namespace,
    NamespaceDone,
    ParameterType,
    Params,
    Publish,
    PublishDone,
    PublishStateNotify,
    Range,
    RangeFilter,
    Refuse,
    RequestErrorCode,
    RequestErrorMessage,
    RequestOk,
    RequestUpdate,
    SessionErrorCode,
    SessionState,
    Setup,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeTracks,
    TrackStatus,
    UniStreamType,
    encode_vi64,
)
from relay.moqt.messages import Redirect

PV = SessionErrorCode.PROTOCOL_VIOLATION
NS = (b"a",)


def subscribe(rid: int, params: Params = Params()) -> Subscribe:  # noqa: B008
    return Subscribe(rid, NS, b"t", params)


# --- SETUP and the control stream (§1.3, §4.1-§4.3) -----------------------------------------

def test_setup_both_ways_gives_each_side_the_peers_limits() -> None:
    p = Pair(Setup(max_filter_ranges=8, max_request_updates=2),
             Setup(max_filter_ranges=16, max_request_updates=4))
    assert p.client.peer_max_filter_ranges == 16 and p.client.peer_max_request_updates == 4
    assert p.server.peer_max_filter_ranges == 8 and p.server.peer_max_request_updates == 2


def test_setup_options_that_belong_to_the_other_role() -> None:
    client = SessionState(is_client=True, setup=Setup())
    closes(SessionErrorCode.INVALID_PATH, client.peer_uni_stream().receive,
           raw(Setup(path="/x")))  # PATH from a server
    wt_server = SessionState(is_client=False, setup=Setup(), webtransport=True)
    closes(SessionErrorCode.INVALID_AUTHORITY, wt_server.peer_uni_stream().receive,
           raw(Setup(authority="h")))  # AUTHORITY over WebTransport


def test_second_control_stream() -> None:
    p = Pair()
    closes(PV, p.server.peer_uni_stream().receive, raw(Setup()))


def test_control_stream_closed_or_reset() -> None:
    closes(PV, Pair().client_control.receive, b"", True)
    closes(PV, Pair().client_control.reset)


def test_goaway_uri_from_client() -> None:
    p = Pair()
    closes(PV, p.client_control.receive, raw(GoAway("moqt://elsewhere")))
    # from the server it names where to go
    assert p.server_control.receive(raw(GoAway("moqt://elsewhere"))) == \
        [GoAway("moqt://elsewhere")]
    assert p.client.goaway_received == GoAway("moqt://elsewhere") and p.client.going_away


def test_second_goaway_on_control_stream() -> None:
    p = Pair()
    first = p.server.goaway(GoAway())
    assert first is not None and p.server.goaway(GoAway()) is None  # we send one at most
    p.server_control.receive(first)
    closes(PV, p.server_control.receive, raw(GoAway()))


def test_other_messages_on_the_control_stream() -> None:
    closes(PV, Pair().client_control.receive, raw(subscribe(0)))


# --- unidirectional stream dispatch (§1.3) ---------------------------------------------------

def test_unknown_unidirectional_stream_type() -> None:
    s = Pair().server
    closes(PV, s.peer_uni_stream().receive, encode_vi64(0x7F))
    closes(PV, s.peer_uni_stream().receive, bytes.fromhex("16 01 00"))  # mode 0b11


def test_stream_ended_inside_its_type() -> None:
    s = Pair().server
    u = s.peer_uni_stream()
    assert u.receive(b"\xc0\x00") == [] and u.kind is None
    closes(PV, u.receive, b"", True)
    empty = s.peer_uni_stream()
    assert empty.receive(b"", True) == [] and empty.kind is None  # no byte: nothing to say
    s.peer_uni_stream().reset()  # reset before its type (§18 rule 3): fine


def test_data_streams_are_dispatched_to_their_parsers() -> None:
    s = Pair().server
    sub = s.peer_uni_stream()
    items = sub.receive(bytes.fromhex("10 01 02 07 00 03 61 62 63"))
    assert sub.kind == UniStreamType.SUBGROUP and items[1].payload == b"abc"
    fetch = s.peer_uni_stream()
    assert fetch.receive(bytes.fromhex("05 07"))[0].request_id == 7
    assert fetch.kind == UniStreamType.FETCH
    pad = s.peer_uni_stream()
    assert pad.receive(bytes.fromhex("f0 13 2b 3e 28") + bytes(9), True) == []
    assert pad.kind == UniStreamType.PADDING


# --- Request IDs (§4.4) ------------------------------------------------------------------------

def test_wrong_parity_request_id() -> None:
    p = Pair()
    closes(SessionErrorCode.INVALID_REQUEST_ID, p.bidi().to_responder, raw(subscribe(1)))
    closes(SessionErrorCode.INVALID_REQUEST_ID, p.bidi(from_client=False).to_responder,
           raw(subscribe(2)))


def test_duplicate_request_id_out_of_order_is_fine() -> None:
    p = Pair()
    p.bidi().to_responder(raw(subscribe(4)))
    p.bidi().to_responder(raw(subscribe(0)))  # out of order
    closes(SessionErrorCode.INVALID_REQUEST_ID, p.bidi().to_responder, raw(subscribe(4)))


def test_request_update_ids_are_request_ids() -> None:
    p = Pair()
    b, _ = p.request(subscribe)
    b.to_requester(SubscribeOk(1))
    closes(SessionErrorCode.INVALID_REQUEST_ID, b.to_responder, raw(RequestUpdate(0)))


def test_request_id_bookkeeping_stays_bounded() -> None:
    p = Pair()
    ids = p.client.peer_ids  # the server's IDs, as the client checks them
    for rid in range(3, 40_000, 4):  # out of order: 3, 1, 7, 5, ...
        ids.use(rid)
        ids.use(rid - 2)
    assert len(ids._used) <= 1
    for reused in (1, 39_997):
        closes(SessionErrorCode.INVALID_REQUEST_ID, ids.use, reused)
    for rid in range(40_001, 40_001 + 2 * 5000, 2):  # skipping one: the window moves on
        ids.use(rid + 2 * 5000)
    assert len(ids._used) <= 4097
    closes(SessionErrorCode.INVALID_REQUEST_ID, ids.use, 40_001)


# --- Track Aliases (§8.3) ----------------------------------------------------------------------

def test_reused_track_alias_for_another_track() -> None:
    p = Pair()
    x, _ = p.request(lambda rid: Subscribe(rid, NS, b"x"))
    x.to_requester(SubscribeOk(7))
    again, _ = p.request(lambda rid: Subscribe(rid, NS, b"x"))
    again.to_requester(SubscribeOk(7))  # the same Track may share its alias
    assert p.client.aliases.route(7) == 2  # the latest subscription gets the streams
    y, _ = p.request(lambda rid: Subscribe(rid, NS, b"y"))
    closes(SessionErrorCode.DUPLICATE_TRACK_ALIAS, y.to_requester, SubscribeOk(7))


def test_an_alias_freed_by_its_subscriptions_names_another_track() -> None:
    p = Pair()
    x, _ = p.request(lambda rid: Subscribe(rid, NS, b"x"))
    x.to_requester(SubscribeOk(7))
    p.client.aliases.release(7, 0)
    y, _ = p.request(lambda rid: Subscribe(rid, NS, b"y"))
    y.to_requester(SubscribeOk(7))  # no DUPLICATE_TRACK_ALIAS: 7 was free
    assert p.client.aliases.route(7) == 2
    # and now 7 is y's: x again under 7 is another Track
    x2, _ = p.request(lambda rid: Subscribe(rid, NS, b"x"))
    closes(SessionErrorCode.DUPLICATE_TRACK_ALIAS, x2.to_requester, SubscribeOk(7))


def test_publish_binds_its_alias_on_arrival() -> None:
    p = Pair()
    _, got = p.request(lambda rid: Publish(rid, NS, b"y", 5))
    assert isinstance(got[0], Publish) and p.server.aliases.route(5) == 0
    # each side checks the aliases its peer chose: the server's own alias 5 is another one
    _, got = p.request(lambda rid: Publish(rid, NS, b"x", 5), from_client=False)
    assert isinstance(got[0], Publish) and p.client.aliases.route(5) == 1
    # but the client naming another Track with its alias 5 is not
    z, _ = p.request(lambda rid: Subscribe(rid, NS, b"z"), from_client=False)
    closes(SessionErrorCode.DUPLICATE_TRACK_ALIAS, z.to_requester, SubscribeOk(5))


# --- request streams (§5, §7) ------------------------------------------------------------------

def test_request_stream_closed_before_its_request() -> None:
    closes(PV, Pair().bidi().to_responder, fin=True)


def test_response_as_the_first_message() -> None:
    closes(PV, Pair().bidi().to_responder, raw(SubscribeOk(1)))


def test_request_update_opening_a_stream() -> None:
    closes(PV, Pair().bidi().to_responder, raw(RequestUpdate(0)))


def test_request_update_on_track_status() -> None:
    p = Pair()
    b, _ = p.request(lambda rid: TrackStatus(rid, NS, b"t"))
    closes(PV, b.to_responder, raw(RequestUpdate(p.client.next_request_id())))
    with pytest.raises(ValueError):  # and we never send one
        b.requester.send(RequestUpdate(p.client.next_request_id()))


def test_second_response() -> None:
    p = Pair()
    b, _ = p.request(subscribe)
    b.to_requester(SubscribeOk(1))
    closes(PV, b.to_requester, raw(SubscribeOk(1)))
    with pytest.raises(ValueError):
        b.responder.send(SubscribeOk(1))


def test_wrong_response_type() -> None:
    p = Pair()
    b, _ = p.request(subscribe)
    closes(PV, b.to_requester, raw(RequestOk()))
    f, _ = p.request(lambda rid: Fetch(rid, NS, b"t"))
    closes(PV, f.to_requester, raw(SubscribeOk(1)))


def test_unsolicited_request_ok() -> None:
    """REQUEST_OK / REQUEST_ERROR only answer a REQUEST_UPDATE, one each, in order (§5.1)."""
    p = Pair()
    b, _ = p.request(subscribe)
    b.to_requester(SubscribeOk(1))
    closes(PV, b.to_requester, raw(RequestOk()))
    b2, _ = p.request(subscribe)
    b2.to_requester(SubscribeOk(2))
    b2.to_responder(RequestUpdate(p.client.next_request_id()))
    assert b2.to_requester(RequestOk()) == [RequestOk()]
    closes(PV, b2.to_requester, raw(RequestErrorMessage(0)))


def test_nothing_after_request_error() -> None:
    p = Pair()
    b, _ = p.request(subscribe)
    b.to_requester(RequestErrorMessage(RequestErrorCode.DOES_NOT_EXIST))
    closes(PV, b.to_requester, raw(GoAway()))


def test_publish_done_is_the_last_message() -> None:
    p = Pair()
    b, _ = p.request(subscribe)
    b.to_requester(SubscribeOk(1), PublishStateNotify(), PublishDone(2, 0))
    closes(PV, b.to_requester, raw(PublishDone(2, 0)))


def test_publish_state_notify_only_from_the_publisher() -> None:
    p = Pair()
    b, _ = p.request(subscribe)
    closes(PV, b.to_responder, raw(PublishStateNotify()))


def test_second_goaway_on_request_stream() -> None:
    p = Pair()
    b, _ = p.request(subscribe)
    b.to_responder(GoAway())
    closes(PV, b.to_responder, raw(GoAway()))


def test_fetch_ok_end_below_request_start() -> None:
    p = Pair()
    start = Params(location_filter=LocationFilter.absolute_start(5, 3))
    b, _ = p.request(lambda rid: Fetch(rid, NS, b"t", start))
    closes(PV, b.to_requester, raw(FetchOk(False, Location(5, 2))))
    ok, _ = p.request(lambda rid: Fetch(rid, NS, b"t", start))
    assert ok.to_requester(FetchOk(False, Location(5, 3))) == [FetchOk(False, Location(5, 3))]


def test_namespace_done_before_namespace() -> None:
    p = Pair()
    b, _ = p.request(lambda rid: SubscribeNamespace(rid, NS))
    b.to_requester(RequestOk())
    closes(PV, b.to_requester, raw(NamespaceDone((b"x",))))
    b2, _ = p.request(lambda rid: SubscribeNamespace(rid, NS))
    assert len(b2.to_requester(RequestOk(), Namespace((b"y",)), NamespaceDone((b"y",)))) == 3


def test_track_properties_in_request_ok_other_than_track_status() -> None:
    p = Pair()
    props = ((0x3800, 1),)
    b, _ = p.request(lambda rid: SubscribeNamespace(rid, NS))
    closes(PV, b.to_requester, raw(RequestOk(Params(), props)))  # type: ignore[arg-type]
    ts, _ = p.request(lambda rid: TrackStatus(rid, NS, b"t"))
    ok = RequestOk(Params(largest_object=Location(1, 1)), props)  # type: ignore[arg-type]
    assert ts.to_requester(ok) == [ok]


def test_redirect_rules() -> None:
    p = Pair()
    b, _ = p.request(lambda rid: SubscribeNamespace(rid, NS))
    bad = RequestErrorMessage(RequestErrorCode.REDIRECT, 0, "", Redirect("", NS, b"name"))
    closes(PV, b.to_requester, raw(bad))  # a Track Name on a namespace request
    s, _ = p.request(lambda rid: Publish(rid, NS, b"t", 1), from_client=False)
    uri = RequestErrorMessage(RequestErrorCode.REDIRECT, 0, "", Redirect("moqt://x", NS, b"t"))
    closes(PV, s.to_requester, raw(uri))  # a URI from a client


# --- requests the session refuses (REQUEST_ERROR, the session stays) -----------------------------

RANGE = RangeFilter(ParameterType.OBJECTID_FILTER, 0, (Range(0, 3),))
BAD_PRIORITY = "01 27 04 00 00 81 00"  # PRIORITY_FILTER 0..256: INVALID_FILTER (§6.5)


def frame(msg_type: int, body_hex: str) -> bytes:
    body = bytes.fromhex(body_hex)
    return encode_vi64(msg_type) + len(body).to_bytes(2, "big") + body


def test_range_filters_beyond_max_filter_ranges_are_refused() -> None:
    p = Pair(server_setup=Setup(max_filter_ranges=0))
    _, got = p.request(lambda rid: subscribe(rid, Params(range_filters=(RANGE,))))
    assert got == [Refuse(RequestErrorCode.INVALID_FILTER, got[0].reason, True)]
    ok = Pair(server_setup=Setup(max_filter_ranges=1))
    _, got = ok.request(lambda rid: subscribe(rid, Params(range_filters=(RANGE,))))
    assert isinstance(got[0], Subscribe)


def test_an_undecodable_range_filter_is_refused_and_its_id_used() -> None:
    p = Pair(server_setup=Setup(max_filter_ranges=8))
    b = p.bidi()
    got = b.to_responder(frame(0x03, "00 01 01 61 01 74" + BAD_PRIORITY))
    assert isinstance(got[0], Refuse) and got[0].code == RequestErrorCode.INVALID_FILTER
    b.responder.send(got[0].reply)  # REQUEST_ERROR answers the request
    closes(SessionErrorCode.INVALID_REQUEST_ID, p.bidi().to_responder, raw(subscribe(0)))


def test_requests_after_goaway_are_refused() -> None:
    p = Pair()
    p.client_control.receive(raw(GoAway()))
    _, got = p.request(subscribe)
    assert [g.code for g in got] == [RequestErrorCode.GOING_AWAY]


def test_subscribe_tracks_reaches_the_responder() -> None:
    """Served, not refused by the rules (the relay answers it, track_offers.py)."""
    p = Pair()
    _, got = p.request(lambda rid: SubscribeTracks(rid, NS))
    assert [type(g) for g in got] == [SubscribeTracks]


def test_a_refused_update_is_answered_in_order() -> None:
    p = Pair(server_setup=Setup(max_filter_ranges=8))
    b, _ = p.request(subscribe)
    b.to_requester(SubscribeOk(1))
    got = b.to_responder(frame(0x02, "02" + BAD_PRIORITY))
    assert [type(g) for g in got] == [Refuse] and not got[0].final
    b.responder.send(got[0].reply)  # the update's one reply
    with pytest.raises(ValueError):
        b.responder.send(RequestOk())


# --- MAX_REQUEST_UPDATES (§4.2, §5.1) --------------------------------------------------------

TOO_MANY = SessionErrorCode.TOO_MANY_REQUEST_UPDATES


def established(p: Pair, make=subscribe):  # type: ignore[no-untyped-def]
    b, _ = p.request(make)
    reply = {Subscribe: SubscribeOk(1), Fetch: FetchOk(False, Location(0, 0))}.get(
        type(b.requester.request), RequestOk())
    b.to_requester(reply)
    return b


def test_more_unanswered_request_updates_than_the_limit_close_the_session() -> None:
    p = Pair(server_setup=Setup(max_request_updates=2))
    b = established(p)
    rid = p.client.next_request_id
    b.to_responder(raw(RequestUpdate(rid())), raw(RequestUpdate(rid())))
    closes(TOO_MANY, b.to_responder, raw(RequestUpdate(rid())))


def test_answered_request_updates_make_room_again() -> None:
    p = Pair(server_setup=Setup(max_request_updates=2))
    b = established(p)
    for _ in range(10):
        got = b.to_responder(RequestUpdate(p.client.next_request_id()),
                             RequestUpdate(p.client.next_request_id()))
        assert [type(g) for g in got] == [RequestUpdate, RequestUpdate]
        assert not b.requester.update_room  # the client holds back a third
        with pytest.raises(ValueError):
            b.requester.send(RequestUpdate(p.client.next_request_id()))
        b.to_requester(RequestOk())
        assert b.requester.update_room
        b.to_requester(RequestErrorMessage(RequestErrorCode.INTERNAL_ERROR))


def test_the_limit_counts_per_request_stream() -> None:
    p = Pair(server_setup=Setup(max_request_updates=1))
    for _ in range(3):
        b = established(p)
        b.to_responder(raw(RequestUpdate(p.client.next_request_id())))
    closes(TOO_MANY, b.to_responder, raw(RequestUpdate(p.client.next_request_id())))


@pytest.mark.parametrize("limit", [None, 0])
def test_absent_or_zero_means_unlimited(limit: int | None) -> None:
    p = Pair(server_setup=Setup(max_request_updates=limit))
    b = established(p)
    ups = [RequestUpdate(p.client.next_request_id()) for _ in range(100)]
    assert len(b.to_responder(*ups)) == 100


@pytest.mark.parametrize("make", [
    lambda rid: Fetch(rid, NS, b"t"),
    lambda rid: SubscribeNamespace(rid, NS),
    lambda rid: Publish(rid, NS, b"t", 1),
])
def test_every_updatable_request_is_limited(make) -> None:  # type: ignore[no-untyped-def]
    p = Pair(server_setup=Setup(max_request_updates=1))
    b = established(p, make)
    b.to_responder(RequestUpdate(p.client.next_request_id()))
    closes(TOO_MANY, b.to_responder, raw(RequestUpdate(p.client.next_request_id())))


def test_the_subscriber_of_a_publish_is_limited_by_the_publisher() -> None:
    p = Pair(client_setup=Setup(max_request_updates=1))
    b = established(p, lambda rid: Publish(rid, NS, b"t", 1))
    b.to_requester(RequestUpdate(p.server.next_request_id()))  # e.g. Forward 1
    closes(TOO_MANY, b.to_requester, raw(RequestUpdate(p.server.next_request_id())))


def test_updates_crossing_our_fin_are_not_held_against_the_peer() -> None:
    """After PUBLISH_DONE and FIN nothing can answer a REQUEST_UPDATE; one the subscriber sent
    before it saw them is not counted against MAX_REQUEST_UPDATES (§5.1: FIN ends a
    direction)."""
    p = Pair(server_setup=Setup(max_request_updates=1))
    b = established(p)
    b.responder.send(PublishDone(2, 0))
    b.responder.send_ended()
    for _ in range(3):
        got = b.to_responder(raw(RequestUpdate(p.client.next_request_id())))
        assert [type(g) for g in got] == [RequestUpdate]
