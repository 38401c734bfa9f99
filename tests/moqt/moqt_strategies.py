"""Hypothesis strategies for every MOQT codec form (shared by the tests/moqt modules)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from relay.moqt import (
    MAX_VI64,
    AliasType,
    EndOfRangeType,
    Fetch,
    FetchOk,
    GoAway,
    GroupOrder,
    KeyValuePair,
    Location,
    LocationFilter,
    LocationFilterType,
    Namespace,
    NamespaceDone,
    ObjectStatus,
    ParameterType,
    Params,
    ParamScope,
    Publish,
    PublishDone,
    PublishNamespace,
    PublishStateNotify,
    Range,
    RangeFilter,
    Redirect,
    RequestErrorCode,
    RequestErrorMessage,
    RequestOk,
    RequestUpdate,
    Setup,
    SubgroupIdMode,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeTracks,
    Token,
    TrackStatus,
    encode_kvps,
)
from relay.moqt.params import ALLOWED

P = ParameterType

u64 = st.one_of(st.integers(0, 300), st.integers(0, MAX_VI64))
small = st.integers(0, 1000)
u8 = st.integers(0, 255)
field_bytes = st.binary(min_size=1, max_size=9)
namespaces = st.lists(field_bytes, max_size=6).map(tuple)
names = st.binary(max_size=12)
locations = st.builds(Location, u64, u64)
text = st.text(max_size=20)


@st.composite
def tokens(draw: Any) -> Token:
    at = draw(st.sampled_from(AliasType))
    alias = draw(u64) if at != AliasType.USE_VALUE else None
    if at in (AliasType.REGISTER, AliasType.USE_VALUE):
        return Token(at, alias, draw(u64), draw(st.binary(max_size=12)))
    return Token(at, alias, None, b"")


@st.composite
def location_filters(draw: Any) -> LocationFilter:
    t = draw(st.sampled_from(LocationFilterType))
    n = 0 if t in (LocationFilterType.NONE, LocationFilterType.NEXT_OBJECT) else int(t)
    vals = [draw(u64) for _ in range(n)] + [0] * (4 - n)
    if n >= 3:
        vals[2] = draw(st.integers(0, MAX_VI64 - vals[0]))
    return LocationFilter(t, *vals)


@st.composite
def ranges(draw: Any, limit: int = MAX_VI64) -> tuple[Range, ...]:
    cuts = sorted(draw(st.lists(st.integers(0, limit), max_size=6)))
    out = [Range(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
    if draw(st.booleans()):
        lo = out[-1].end if out else 0
        out.append(Range(draw(st.integers(lo, limit)), None))  # type: ignore[arg-type]
    return tuple(out)


@st.composite
def range_filters(draw: Any, ptype: ParameterType) -> list[RangeFilter]:
    """0..2 filters of one type with distinct keys (or one zero-length 'clear')."""
    if draw(st.integers(0, 5)) == 0:
        return [RangeFilter.clear(ptype)]
    out = []
    for set_id in draw(st.sets(u8, max_size=2)):
        prop = None
        if ptype in (P.OBJECT_PROPERTY_FILTER, P.TRACK_PROPERTY_FILTER):
            prop = draw(st.integers(0, 1000)) * 2
        limit = 255 if ptype == P.PRIORITY_FILTER else MAX_VI64
        out.append(RangeFilter(ptype, set_id, draw(ranges(limit)), prop))
    return out


@st.composite
def params(draw: Any, scope: ParamScope) -> Params:
    allowed = ALLOWED[scope]
    kw: dict[str, Any] = {}
    filters: list[RangeFilter] = []

    def want(t: ParameterType) -> bool:
        return t in allowed and draw(st.integers(0, 2)) == 0

    for t, name in (
        (P.OBJECT_DELIVERY_TIMEOUT, "object_delivery_timeout"),
        (P.RENDEZVOUS_TIMEOUT, "rendezvous_timeout"),
        (P.SUBGROUP_DELIVERY_TIMEOUT, "subgroup_delivery_timeout"),
        (P.EXPIRES, "expires"),
        (P.FILL_TIMEOUT, "fill_timeout"),
        (P.NEW_GROUP_REQUEST, "new_group_request"),
    ):
        if want(t):
            kw[name] = draw(u64)
    if want(P.AUTHORIZATION_TOKEN):
        kw["authorization_tokens"] = tuple(draw(st.lists(tokens(), min_size=1, max_size=2)))
    if want(P.LARGEST_OBJECT):
        kw["largest_object"] = draw(locations)
    if want(P.FORWARD):
        kw["forward"] = draw(st.booleans())
    if want(P.INCLUDE_PROPERTIES):
        kw["include_properties"] = draw(st.booleans())
    if want(P.SUBSCRIBER_PRIORITY):
        kw["subscriber_priority"] = draw(u8)
    if want(P.GROUP_ORDER):
        kw["group_order"] = draw(st.sampled_from(GroupOrder))
    if want(P.LOCATION_FILTER):
        kw["location_filter"] = draw(location_filters())
    if want(P.FILL_PARAMETERS):
        kw["fill"] = draw(params(ParamScope.FILL))
    if want(P.TRACK_NAMESPACE_PREFIX):
        kw["track_namespace_prefix"] = draw(namespaces)
    for t in sorted(allowed):
        if t in (P.SUBGROUP_FILTER, P.OBJECTID_FILTER, P.PRIORITY_FILTER,
                 P.OBJECT_PROPERTY_FILTER, P.TRACK_PROPERTY_FILTER) and want(t):
            filters += draw(range_filters(t))
    return Params(range_filters=tuple(filters), **kw)


even_kvp = st.builds(KeyValuePair, st.integers(0, 2000).map(lambda v: v * 2), u64)
odd_kvp = st.builds(KeyValuePair, st.integers(0, 2000).map(lambda v: v * 2 + 1),
                    st.binary(max_size=10))
# Known Track Property types have checked values: keep random pairs clear of them.
_KNOWN = {0x0B, 0x0E, 0x22, 0x30}
kvps = st.lists(st.one_of(even_kvp, odd_kvp), max_size=5).map(
    lambda ps: tuple(sorted((p for p in ps if p.type not in _KNOWN), key=lambda p: p.type))
)
raw_properties = kvps.map(encode_kvps)


@st.composite
def setups(draw: Any) -> Setup:
    opt = st.none() | u64
    unknown = draw(kvps)
    unknown = tuple(p for p in unknown if p.type > 8)
    return Setup(
        path=draw(st.none() | text),
        authorization_tokens=tuple(draw(st.lists(tokens(), max_size=2))),
        max_auth_token_cache_size=draw(opt),
        authority=draw(st.none() | text),
        max_filter_ranges=draw(opt),
        moqt_implementation=draw(st.none() | text),
        max_request_updates=draw(opt),
        unknown_options=unknown,
    )


@st.composite
def request_errors(draw: Any) -> RequestErrorMessage:
    code = draw(st.one_of(st.sampled_from(RequestErrorCode), u64))
    redirect = None
    if code == RequestErrorCode.REDIRECT:
        redirect = Redirect(draw(text), draw(namespaces), draw(names))
    return RequestErrorMessage(code, draw(u64), draw(text), redirect)


def messages() -> st.SearchStrategy[Any]:
    S = ParamScope
    return st.one_of(
        setups(),
        st.builds(GoAway, text, u64),
        st.builds(Subscribe, u64, namespaces, names, params(S.SUBSCRIBE)),
        st.builds(SubscribeOk, u64, params(S.SUBSCRIBE_OK), kvps),
        st.builds(Publish, u64, namespaces, names, u64, params(S.PUBLISH), kvps),
        st.builds(PublishDone, u64, u64, text),
        st.builds(PublishStateNotify, params(S.PUBLISH_STATE_NOTIFY)),
        st.builds(Fetch, u64, namespaces, names, params(S.FETCH)),
        st.builds(FetchOk, st.booleans(), locations, params(S.FETCH_OK), kvps),
        st.builds(TrackStatus, u64, namespaces, names, params(S.TRACK_STATUS)),
        st.builds(PublishNamespace, u64, namespaces, params(S.PUBLISH_NAMESPACE)),
        st.builds(SubscribeNamespace, u64, namespaces, params(S.SUBSCRIBE_NAMESPACE)),
        st.builds(SubscribeTracks, u64, namespaces, params(S.SUBSCRIBE_TRACKS)),
        st.builds(Namespace, namespaces),
        st.builds(NamespaceDone, namespaces),
        st.builds(RequestOk, params(S.REQUEST_OK), kvps),
        request_errors(),
        st.builds(RequestUpdate, u64, params(S.REQUEST_UPDATE)),
    )


# --- data plane -------------------------------------------------------------------------------

SubgroupItem = tuple[int, bytes, ObjectStatus, bytes | None]


@st.composite
def subgroup_streams(draw: Any) -> tuple[dict[str, Any], list[SubgroupItem]]:
    """Header fields and Objects (id, payload, status, raw properties) of one stream."""
    mode = draw(st.sampled_from(SubgroupIdMode))
    sub: int | None = {SubgroupIdMode.ZERO: 0, SubgroupIdMode.FIRST_OBJECT_ID: None}.get(mode)
    if mode == SubgroupIdMode.EXPLICIT:
        sub = draw(u64)
    header = dict(
        track_alias=draw(u64), group_id=draw(u64), subgroup_id=sub,
        publisher_priority=draw(st.none() | u8), first_object=draw(st.booleans()),
        end_of_group=draw(st.booleans()), has_properties=draw(st.booleans()),
        subgroup_id_mode=mode,
    )
    ids = sorted(draw(st.sets(st.integers(0, 400), max_size=6)))
    objs = []
    for i, oid in enumerate(ids):
        last = i == len(ids) - 1
        status = ObjectStatus.NORMAL
        if last and draw(st.booleans()):
            status = draw(st.sampled_from([ObjectStatus.END_OF_GROUP, ObjectStatus.END_OF_TRACK]))
        payload = b"" if status != ObjectStatus.NORMAL else draw(st.binary(max_size=40))
        props = None
        if header["has_properties"]:
            props = b"" if status != ObjectStatus.NORMAL else draw(raw_properties)
        objs.append((oid, payload, status, props))
    return header, objs


@st.composite
def fetch_streams(draw: Any) -> tuple[int, GroupOrder, list[tuple[Any, ...]]]:
    """(request_id, order, elements): elements are ("obj", g, sub, o, prio, payload, props)
    or ("end", kind, g, o) in wire order."""
    order = draw(st.sampled_from(GroupOrder))
    groups = sorted(draw(st.sets(st.integers(0, 10**6), max_size=5)),
                    reverse=order == GroupOrder.DESCENDING)
    elems: list[tuple[Any, ...]] = []
    for g in groups:
        oids = sorted(draw(st.sets(st.integers(0, 300), max_size=4)))
        if draw(st.integers(0, 3)) == 0:
            lo = oids[0] - 1 if oids else 500
            if lo >= 0:
                elems.append(("end", draw(st.sampled_from(EndOfRangeType)), g,
                              draw(st.integers(0, lo))))
        for o in oids:
            sub = draw(st.one_of(st.none(), st.just(0), st.integers(0, 5), u64))
            elems.append(("obj", g, sub, o, draw(u8), draw(st.binary(max_size=30)),
                          draw(st.none() | raw_properties)))
    return draw(u64), order, elems
