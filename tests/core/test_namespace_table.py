"""The namespace table's prefix indexes answer what a scan over every namespace would:
routing lookups, the namespaces a new SUBSCRIBE_NAMESPACE is told of, and which listeners
hear of a change (NAMESPACE / NAMESPACE_DONE), through any sequence of announcements,
withdrawals, purges and listeners coming and going."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from relay.core.namespaces import NamespaceListener, NamespaceTable, PublisherEntry, own_source
from relay.moqt.primitives import TrackNamespace, namespace_matches_prefix

FIELDS = st.sampled_from([b"a", b"b", b"c"])
NAMESPACES = st.lists(FIELDS, min_size=1, max_size=4).map(tuple)
PREFIXES = st.lists(FIELDS, min_size=0, max_size=4).map(tuple)
OPS = st.lists(st.one_of(
    st.tuples(st.just("announce"), NAMESPACES, st.booleans()),
    st.tuples(st.just("withdraw"), st.integers(0, 50)),
    st.tuples(st.just("purge"), NAMESPACES),
    st.tuples(st.just("listen"), PREFIXES, st.booleans()),
    st.tuples(st.just("unlisten"), st.integers(0, 50)),
), max_size=40)


def _expected_told(entries: list[PublisherEntry], lst: NamespaceListener) -> set[TrackNamespace]:
    return {e.namespace for e in entries
            if namespace_matches_prefix(e.namespace, lst.prefix) and lst.shows(e)}


@settings(max_examples=300, deadline=None)
@given(OPS, NAMESPACES)
def test_indexed_lookups_equal_a_scan(ops: list[tuple], probe: TrackNamespace) -> None:
    table = NamespaceTable()
    entries: list[PublisherEntry] = []
    listeners: list[NamespaceListener] = []
    heard: dict[int, set[TrackNamespace]] = {}
    for op in ops:
        if op[0] == "announce":
            e = PublisherEntry(op[1], object(), upstream=op[2])
            entries.append(e)
            table.add_publisher(e)
        elif op[0] == "withdraw" and entries:
            e = entries.pop(op[1] % len(entries))
            table.remove_publisher(e)
        elif op[0] == "purge":
            assert table.remove_namespace(op[1]) == any(e.namespace == op[1] for e in entries)
            entries = [e for e in entries if e.namespace != op[1]]
        elif op[0] == "listen":
            key = len(heard)
            heard[key] = set()

            def note(ns: TrackNamespace, active: bool, key: int = key) -> None:
                assert (ns in heard[key]) != active  # DONE only after NAMESPACE, never twice
                (heard[key].add if active else heard[key].discard)(ns)

            lst = NamespaceListener(op[1], note, **({"shows": own_source} if op[2] else {}))
            lst.session = key
            listeners.append(lst)
            now = table.add_listener(lst)
            assert set(now) == _expected_told(entries, lst)
            assert len(now) == len(set(now))
            heard[key].update(now)
        elif op[0] == "unlisten" and listeners:
            table.remove_listener(listeners.pop(op[1] % len(listeners)))
        for lst in listeners:
            assert lst.told == _expected_told(entries, lst) == heard[lst.session]
            assert table.listeners_of(lst.session) == [lst]
        assert table.listener_count() == len(listeners)
        assert sorted(map(id, table.publishers_for(probe))) == sorted(
            id(e) for e in entries if namespace_matches_prefix(probe, e.namespace))
    found = table.publishers_for(probe)
    assert [(e.upstream, -len(e.namespace)) for e in found] == sorted(
        (e.upstream, -len(e.namespace)) for e in found)
    assert set(table.namespaces()) == {e.namespace for e in entries}
