"""Filter evaluation (§6.3 table, §6.5 combination) and namespace matching (§2.7)."""

from __future__ import annotations

import pytest

from relay.moqt import (
    MAX_VI64,
    Location,
    LocationFilter,
    LocationRange,
    ParameterType,
    Range,
    RangeFilter,
    evaluate_range_filters,
    namespace_matches_prefix,
    namespace_suffix,
    prefixes_overlap,
    resolve_fetch_range,
    resolve_subscription_range,
)
from relay.moqt.kvp import encode_kvps
from relay.moqt.range_filter import ObjectFilter, override_filters

L = Location(3, 40)
P = ParameterType
EOG7 = Location(7, MAX_VI64)  # "every Object of Group 7"

TABLE = [
    # filter, L, subscription range, fetch/fill range
    (None, L, LocationRange(Location(0, 0), None), LocationRange(Location(0, 0), L)),
    (LocationFilter.none(), L, LocationRange(Location(0, 0), None),
     LocationRange(Location(0, 0), L)),
    (LocationFilter.relative_start(0), L, LocationRange(Location(4, 0), None),
     LocationRange(Location(4, 0), L)),
    (LocationFilter.relative_start(1), L, LocationRange(Location(3, 0), None),
     LocationRange(Location(3, 0), L)),
    (LocationFilter.relative_start(2), L, LocationRange(Location(2, 0), None),
     LocationRange(Location(2, 0), L)),
    (LocationFilter.relative_start(99), L, LocationRange(Location(0, 0), None),
     LocationRange(Location(0, 0), L)),
    (LocationFilter.absolute_start(0, 0), L, LocationRange(Location(0, 0), None),
     LocationRange(Location(0, 0), L)),
    (LocationFilter.absolute_start(2, 5), L, LocationRange(Location(2, 5), None),
     LocationRange(Location(2, 5), L)),
    (LocationFilter.absolute_group_end(1, 2, 7), L, LocationRange(Location(1, 2), EOG7),
     LocationRange(Location(1, 2), L)),
    (LocationFilter.absolute_group_end(1, 2, 2), L,
     LocationRange(Location(1, 2), Location(2, MAX_VI64)),
     LocationRange(Location(1, 2), Location(2, MAX_VI64))),
    (LocationFilter.absolute_range(Location(1, 2), Location(3, 10)), L,
     LocationRange(Location(1, 2), Location(3, 10)),
     LocationRange(Location(1, 2), Location(3, 10))),
    (LocationFilter.absolute_range(Location(1, 2), Location(9, 0)), L,
     LocationRange(Location(1, 2), Location(9, 0)), LocationRange(Location(1, 2), L)),
    (LocationFilter.next_object(), L, LocationRange(Location(3, 41), None),
     LocationRange(Location(3, 41), L)),
]


@pytest.mark.parametrize(("f", "largest", "sub", "fetch"), TABLE)
def test_section_6_3_table(f: LocationFilter | None, largest: Location, sub: LocationRange,
                           fetch: LocationRange) -> None:
    assert resolve_subscription_range(f, largest) == sub
    assert resolve_fetch_range(f, largest) == fetch


def test_without_largest_object() -> None:
    for f in (LocationFilter.relative_start(1), LocationFilter.next_object(), None):
        assert resolve_subscription_range(f, None) == LocationRange(Location(0, 0), None)
        assert resolve_fetch_range(f, None) is None  # nothing published: INVALID_RANGE / no fill


def test_next_object_fetch_is_empty_and_exactly_once_split() -> None:
    fill = resolve_fetch_range(LocationFilter.absolute_start(0, 0), L)
    live = resolve_subscription_range(LocationFilter.next_object(), L)
    assert resolve_fetch_range(LocationFilter.next_object(), L).is_empty  # type: ignore[union-attr]
    for loc in (Location(0, 0), Location(3, 40), Location(3, 41), Location(4, 0)):
        assert fill.contains(loc) != live.contains(loc)  # type: ignore[union-attr]


def test_range_filter_combination() -> None:
    low_ids = RangeFilter(P.OBJECTID_FILTER, 0, (Range(0, 9),))
    prio = RangeFilter(P.PRIORITY_FILTER, 0, (Range(0, 3),))
    sub2 = RangeFilter(P.SUBGROUP_FILTER, 1, (Range(2, None),))
    prop = RangeFilter(P.OBJECT_PROPERTY_FILTER, 2, (Range(5, 5),), property_type=0x3C)
    fs = (low_ids, prio, sub2, prop)

    def ok(sub: int | None, oid: int, pr: int, props: dict[int, int] | None = None) -> bool:
        return evaluate_range_filters(fs, subgroup_id=sub, object_id=oid, priority=pr,
                                      properties=props)

    assert ok(0, 5, 1)  # set 0: both match
    assert not ok(0, 5, 9)  # set 0 fails on priority, set 1 on subgroup
    assert ok(4, 50, 9)  # set 1 matches
    assert not ok(None, 50, 9)  # datagram Object never matches SUBGROUP_FILTER
    assert ok(0, 50, 9, {0x3C: 5})  # set 2
    assert evaluate_range_filters((), subgroup_id=0, object_id=0, priority=0)
    cleared = (RangeFilter.clear(P.OBJECTID_FILTER),)
    assert evaluate_range_filters(cleared, subgroup_id=0, object_id=99, priority=0)


def test_object_filter_bounds_object_ids_and_updates_replace_per_type() -> None:
    ids = RangeFilter(P.OBJECTID_FILTER, 0, (Range(0, 3),))
    ids1 = RangeFilter(P.OBJECTID_FILTER, 1, (Range(9, None),))
    sub = RangeFilter(P.SUBGROUP_FILTER, 1, (Range(2, 2),))
    assert ObjectFilter.of(()) is None
    assert ObjectFilter.of((RangeFilter.clear(P.SUBGROUP_FILTER),)) is None
    # every SetID group bounds the Object IDs: their union is what a walk need visit
    both = ObjectFilter.of((ids, ids1, sub))
    assert both is not None and both.object_ids() == [(0, 3), (9, None)]
    # a SetID group without OBJECTID_FILTER may pass any Object ID: no bound
    only_sub = ObjectFilter.of((ids, RangeFilter(P.SUBGROUP_FILTER, 2, (Range(1, 1),))))
    assert only_sub is not None and only_sub.object_ids() is None
    props = ObjectFilter.of((RangeFilter(P.OBJECT_PROPERTY_FILTER, 0, (Range(5, 6),), 0x3C),))
    assert props is not None
    assert props.passes(0, 1, 0, encode_kvps([(0x3C, 6)]))
    assert not props.passes(0, 1, 0, encode_kvps([(0x3E, 6)]))
    assert not props.passes(0, 1, 0, b"\xff")  # undecodable Properties match nothing
    # REQUEST_UPDATE / FILL_PARAMETERS: a type given replaces it, zero length removes it
    assert override_filters((ids, sub), (RangeFilter.clear(P.OBJECTID_FILTER),)) == (sub,)
    assert override_filters((ids, sub), (ids1,)) == (sub, ids1)
    assert override_filters((ids,), ()) == (ids,)


def test_prefix_matching_and_overlap() -> None:
    ns = (b"foo", b"bar")
    for prefix in ((), (b"foo",), (b"foo", b"bar")):
        assert namespace_matches_prefix(ns, prefix)
    assert not namespace_matches_prefix(ns, (b"foob",))
    assert not namespace_matches_prefix(ns, (b"foo", b"bar", b"x"))
    assert namespace_suffix((b"k", b"s", b"c", b"a", b"p"), (b"k", b"s", b"c", b"a")) == (b"p",)
    a1 = (b"kvcs-1", b"S", b"C", b"A1")
    a2 = (b"kvcs-1", b"S", b"C", b"A2")
    assert not prefixes_overlap(a1, a2)
    assert prefixes_overlap(a1, a1[:2]) and prefixes_overlap(a1[:2], a1)
