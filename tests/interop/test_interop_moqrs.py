"""Interop through OUR relay with moq-rs 0.5.1 (the Rust moq library, PyPI ``moq-rs``).

moq-rs concepts on the wire (checked against the relay's view of its messages):

* a broadcast path ``"a/b"`` is the Track Namespace ``(b"a", b"b")`` (split on ``/``), a track
  name is the Track Name, a group is a Group (one subgroup, 0), a frame is an Object (Object
  IDs 0, 1, 2... in frame order); a frame's ``timestamp_us`` travels as Object Property 0x10
  and is only decoded when the SUBSCRIBE_OK carries the Track Property 0x08 (timescale).
* publishing: ``create_broadcast`` + ``announce`` sends PUBLISH_NAMESPACE; the track is served
  on SUBSCRIBE (moq-rs never sends PUBLISH). ``TrackProducer.finish`` sends End of Track
  alone on its own stream, then PUBLISH_DONE.
* every moq-rs session sends SUBSCRIBE_NAMESPACE (empty prefix) on connect and learns
  broadcasts from NAMESPACE; ``announced_broadcast(path)`` resolves on it.
* subscribing: ``subscribe_track`` sends SUBSCRIBE with Next Object + FILL_PARAMETERS
  (Relative Start 1: the current Group from its first Object), Descending (and priority 255
  for the default ``Subscription``); ``group_start``/``group_end`` never reach the wire, and
  it returns after SUBSCRIBE_OK. A second ``subscribe_track`` on the same session is served
  from moq-rs's own cache (no new SUBSCRIBE). ``Subscription.max_age_us`` is a consumer-side
  knob: with the default 0 a group overtaken by a newer one is skipped locally, so these
  tests raise it. Iterating a TrackConsumer (``next_group``) returns groups in sequence
  order and never one that arrives after a newer one; ``groups_as_arrived`` returns all.
* a moq-rs publisher answers a SUBSCRIBE's FILL_PARAMETERS of Relative Start 1 (the
  current group) with a fill stream, and sends none for Absolute Start {0,0}.
* ``fetch_group(name, g)`` sends a SUBSCRIBE first (the same as ``subscribe_track``'s),
  then, unless that SUBSCRIBE's fill brought Group g, FETCH with LOCATION_FILTER 0x03
  (Absolute Start {g, 0} + Group End, delta 0), Ascending. It cancels the SUBSCRIBE as soon
  as it returns, which cuts a fill still arriving (docs/interop.md, "moq-rs").
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

import interop_sys_path  # noqa: F401  (before relay_helpers: puts tests/core on sys.path)
import pytest
from relay_helpers import (
    TIMEOUT,
    client,
    drain,
    fetch_objects,
    group_payloads,
    live_params,
    push_track,
    relay_at,
    wait_cached,
    wait_namespace,
)

from relay.core.relay import RelayOptions, relay_session_config
from relay.moqt.codes import ObjectStatus
from relay.moqt.primitives import FullTrackName, Location
from relay.service import RunningRelay
from storage.interface import Tier

try:
    import moq
except ImportError as e:  # moq-rs is a declared test dependency: its absence is a failure
    raise ImportError(f"moq-rs (module `moq`) is missing: run `make install` ({e})") from e

# moq-rs consumers skip a group that a newer group overtook unless it is younger than this.
NO_SKIP = moq.Subscription(max_age_us=3_600_000_000)


def moq_client(r: RunningRelay) -> Any:
    """A one-shot moq-rs client on native QUIC (ALPN moqt-22) trusting the relay's cert."""
    return moq.connect(r.url, tls_roots=[str(r.certfile)], websocket_enabled=False,
                       reconnect=False)


async def moq_announce(mpub: Any, msub: Any, path: str) -> tuple[Any, Any, Any]:
    """A moq-rs publisher's broadcast ``path`` with Track ``t0`` announced through the relay,
    as ``msub`` sees it: (broadcast, its track producer, the broadcast consumer)."""
    bcast = mpub.create_broadcast(path)
    track = bcast.publish_track("t0")
    bcast.announce()
    return bcast, track, await asyncio.wait_for(msub.announced_broadcast(path), TIMEOUT)


async def moq_track(mpub: Any, msub: Any, path: str) -> tuple[Any, Any, Any]:
    """``moq_announce``, and a moq-rs subscription to the Track: (broadcast, its track
    producer, the track consumer)."""
    bcast, track, consumer = await moq_announce(mpub, msub, path)
    tc = await asyncio.wait_for(consumer.subscribe_track("t0", NO_SKIP), TIMEOUT)
    return bcast, track, tc


def moq_group(track: Any, frames: list[bytes], finish: bool = True) -> Any:
    """Append a group of ``frames`` to a moq-rs TrackProducer (finished unless told not
    to); its producer."""
    grp = track.append_group()
    for p in frames:
        grp.write_frame(p)
    if finish:
        grp.finish()
    return grp


async def moq_groups(tc: Any) -> tuple[dict[int, list[bytes]], list[int]]:
    """Read a moq-rs TrackConsumer to its end: frames per group, and groups delivered twice."""
    groups: dict[int, list[bytes]] = {}
    again: list[int] = []
    async for grp in tc.groups_as_arrived():
        frames = [bytes(f.payload) async for f in grp]
        if grp.sequence in groups:
            again.append(grp.sequence)
            groups[grp.sequence] += frames
        else:
            groups[grp.sequence] = frames
    return groups, again


def by_group(objects: dict[Location, bytes]) -> dict[int, list[bytes]]:
    """Our subscriber's Objects as moq-rs sees them: per Group, in Object ID order (the IDs
    must be 0..n-1, since moq-rs frames carry no ID)."""
    out: dict[int, list[bytes]] = {}
    for loc in sorted(objects):
        frames = out.setdefault(loc.group, [])
        assert loc.object == len(frames), f"Object IDs of Group {loc.group} not 0..n-1"
        frames.append(objects[loc])
    return out


# -- 1. moq-rs publisher -> relay -> moq-rs subscriber + our subscriber -----------------------


async def test_moqrs_publisher_to_moqrs_and_kvcs_subscribers_bit_identical(
        tmp_path: Path) -> None:
    sent = {
        0: [b"", b"\x00", os.urandom(1500)],  # an empty frame is a zero-length Normal Object
        1: [os.urandom(100_000)],  # spans many QUIC packets
        2: [bytes(range(256)) * 4, os.urandom(7), os.urandom(3000), os.urandom(1)],
        3: [os.urandom(n) for n in (10, 20, 30, 40, 50)],
    }
    ns = (b"iop", b"live")
    r = await relay_at(tmp_path)
    try:
        async with moq_client(r) as mpub, moq_client(r) as msub:
            bcast = mpub.create_broadcast("iop/live")
            track = bcast.publish_track("t0")
            bcast.announce()

            ours = await client(r)
            await wait_namespace(ours, ns)
            sub = await asyncio.wait_for(ours.subscribe(ns, b"t0", live_params()), TIMEOUT)
            consumer = await asyncio.wait_for(msub.announced_broadcast("iop/live"), TIMEOUT)
            tc = await asyncio.wait_for(consumer.subscribe_track("t0", NO_SKIP), TIMEOUT)
            # both downstream subscriptions are registered; one upstream SUBSCRIBE serves both
            assert r.relay.counters.ok("SUBSCRIBE") == 2
            assert r.relay.counters.upstream_subscriptions == 1

            for g in sorted(sent):
                grp = track.append_group()
                assert grp.sequence == g
                for i, payload in enumerate(sent[g]):
                    grp.write_frame(payload, 1000 * g + i)
                grp.finish()
            track.finish()

            async with asyncio.timeout(TIMEOUT):
                got, (mgot, again) = await asyncio.gather(drain(sub), moq_groups(tc))
            await ours.aclose()
    finally:
        await r.close()

    assert got.duplicates == [] and got.resets == []
    assert by_group(got.objects) == sent
    assert got.statuses == {Location(len(sent), 0): ObjectStatus.END_OF_TRACK}
    assert got.done is not None and got.done.status == 0x2  # TRACK_ENDED
    assert again == []
    assert mgot == sent


@pytest.mark.parametrize("join", ["before", "after_first_group"])
async def test_a_moqrs_group_with_no_frame_reaches_every_subscriber(
        tmp_path: Path, join: str) -> None:
    """A moq-rs Group finished without a frame is a subgroup stream with END_OF_GROUP, FIN
    and no Object. The relay passes it on as a stream that begins its Subgroup (FIRST_OBJECT,
    as received: moq-rs makes no Group of a stream without it) and caches the empty Group's
    end; before, it was dropped unless it was the Group the subscription started in, and a
    moq-rs subscriber waiting for every Group never completed (issue 36). Frames of 0 B to
    200 kB around it, the subscriber joining before anything is published or after the
    first Group."""
    sizes = (0, 1, 1000, 50_000, 200_000)
    sent = {g: [] if g == 2 else [os.urandom(sizes[(g + i) % 5]) for i in range(5)]
            for g in range(5)}
    name = FullTrackName((b"iop", b"empty"), b"t0")
    r = await relay_at(tmp_path)
    try:
        async with moq_client(r) as mpub, moq_client(r) as msub:
            _bcast, track, consumer = await moq_announce(mpub, msub, "iop/empty")
            first = 0 if join == "before" else 1
            if first:  # the relay learns Group 0 with the fill of its first SUBSCRIBE
                moq_group(track, sent[0])
            tc = await asyncio.wait_for(consumer.subscribe_track("t0", NO_SKIP), TIMEOUT)
            for g in range(first, 5):
                moq_group(track, sent[g])
            track.finish()
            async with asyncio.timeout(TIMEOUT):
                mgot, again = await moq_groups(tc)
            assert await r.relay.wait_committed(name, TIMEOUT)
    finally:
        await r.close()
    assert again == []
    assert mgot == sent
    r = await relay_at(tmp_path)  # the empty Group's end was cached and committed
    try:
        c = await client(r)
        _resp, got = await fetch_objects(c, name)
        assert by_group(got) == {g: f for g, f in sent.items() if f}
        assert r.relay.tracks[name].store.group_end(r.relay.tracks[name].key, 2) == 0
    finally:
        await r.close()


async def test_moqrs_frame_timestamps_survive_the_relay(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    try:
        async with moq_client(r) as mpub, moq_client(r) as msub:
            _bcast, track, tc = await moq_track(mpub, msub, "iop/ts")  # kept alive
            sent = {0: [(b"a", 1234), (b"b", 5678)], 1: [(b"c", 99)]}
            for g in sorted(sent):
                grp = track.append_group()
                for payload, ts in sent[g]:
                    grp.write_frame(payload, ts)
                grp.finish()
            track.finish()
            got: dict[int, list[tuple[bytes, int]]] = {}
            async with asyncio.timeout(TIMEOUT):
                async for grp in tc.groups_as_arrived():
                    got[grp.sequence] = [(bytes(f.payload), f.timestamp_us) async for f in grp]
    finally:
        await r.close()
    assert got == sent


# -- 2. a moq-rs subscriber joining late -----------------------------------------------------


@pytest.mark.parametrize("join", ["group_boundary", "mid_group"])
async def test_moqrs_late_subscriber_gets_the_current_group_then_live_once(
        tmp_path: Path, join: str) -> None:
    """moq-rs joins with Next Object + FILL_PARAMETERS Relative Start 1: the relay fills the
    current Group (L.Group) from its cache and forwards everything after L live. Nothing
    older than the current Group, nothing twice, the fill and the live tail of a Group
    spliced into one moq-rs group."""
    name = FullTrackName((b"iop", b"late"), b"t0")
    payload = {(g, i): os.urandom(50 + 10 * i) + bytes([g, i]) for g in range(4)
               for i in range(4)}
    r = await relay_at(tmp_path)
    try:
        pub = await client(r)
        track = await push_track(pub, name, layers=4)  # PUBLISH_NAMESPACE + PUBLISH
        await track.group(0, [payload[0, i] for i in range(4)])
        await track.group(1, [payload[1, i] for i in range(4)])
        if join == "mid_group":
            w = await track.served.open_subgroup(2, 0, track.priority(2))
            for i in range(2):
                await w.write_object(i, payload[2, i])
            await wait_cached(r, name, Location(2, 1))
        else:
            await wait_cached(r, name, Location(1, 4))  # Group 1's End of Group

        first = 2 if join == "mid_group" else 1  # L.Group when moq-rs joined
        async with moq_client(r) as msub:
            consumer = await asyncio.wait_for(msub.announced_broadcast("iop/late"), TIMEOUT)
            tc = await asyncio.wait_for(consumer.subscribe_track("t0", NO_SKIP), TIMEOUT)
            assert r.relay.counters.ok("SUBSCRIBE") == 1
            if join == "mid_group":
                for i in range(2, 4):
                    await w.write_object(i, payload[2, i])
                await w.write_status(4, ObjectStatus.END_OF_GROUP, fin=True)
            # the current Group is complete for moq-rs while the Track goes on: at a Group
            # boundary L is its End of Group, which the fill cannot carry; the relay says so
            # on the live path (an empty END_OF_GROUP stream), not only with PUBLISH_DONE
            groups = tc.groups_as_arrived().__aiter__()
            async with asyncio.timeout(TIMEOUT):
                grp = await groups.__anext__()
                assert grp.sequence == first
                current = [bytes(f.payload) async for f in grp]
            assert current == [payload[first, i] for i in range(4)]
            if join != "mid_group":
                await track.group(2, [payload[2, i] for i in range(4)])
            await track.group(3, [payload[3, i] for i in range(4)])
            await track.end()
            mgot = {first: current}
            async with asyncio.timeout(TIMEOUT):
                async for grp in groups:
                    assert grp.sequence not in mgot
                    mgot[grp.sequence] = [bytes(f.payload) async for f in grp]
        await pub.aclose()
    finally:
        await r.close()

    assert mgot == {g: [payload[g, i] for i in range(4)] for g in range(first, 4)}
    # the part of the current Group published before the join came from the relay's cache
    assert r.relay.counters.fill.objects[Tier.MEMORY] == (2 if join == "mid_group" else 4)


# -- 3. moq-rs fetching whole Groups ---------------------------------------------------------


async def test_moqrs_fetches_groups_a_moqrs_publisher_pushed(tmp_path: Path) -> None:
    """moq-rs ends its Groups with END_OF_GROUP + FIN, no End of Group Object. The relay
    caches the End of Group that implies (§14.1), so FETCH_OK for "all of Group G" ends at
    it (§7.10); {G, 2^64-1}, which the relay used to answer, makes moq-rs close with a
    protocol violation. The publisher's Track Properties travel in FETCH_OK (§12) and
    moq-rs takes them."""
    sent = {g: [os.urandom(40 + g) for _ in range(3)] for g in range(3)}
    r = await relay_at(tmp_path)
    try:
        async with moq_client(r) as mpub, moq_client(r) as msub:
            _bcast, track, _tc = await moq_track(mpub, msub, "iop/pushed")  # kept alive
            for g in sorted(sent):
                moq_group(track, sent[g])
            name = FullTrackName((b"iop", b"pushed"), b"t0")
            await wait_cached(r, name, Location(2, 2))
            assert {p.type for p in r.relay.tracks[name].properties} >= {0x08, 0x0E, 0x22}
            async with moq_client(r) as mc:
                fc = await asyncio.wait_for(mc.announced_broadcast("iop/pushed"), TIMEOUT)
                got = {}
                for g in (1, 0):
                    grp = await asyncio.wait_for(fc.fetch_group("t0", g), TIMEOUT)
                    async with asyncio.timeout(TIMEOUT):
                        got[g] = [bytes(f.payload) async for f in grp]
        assert got == {g: sent[g] for g in (1, 0)}
        assert r.relay.counters.ok("FETCH") == 2
    finally:
        await r.close()


async def test_moqrs_fetches_the_last_group_of_an_unfinished_track(tmp_path: Path) -> None:
    """Issue 26 item 12: moq-rs's fetch_group of the last Group of a Track that has not
    ended, once with that Group ended and once with it still open (its publisher writing),
    answered with every frame on each backend (the report saw "Cancelled" on aioquic).
    Group 2 comes by FETCH and spans many packets. Group 3, the current one, comes by the
    fill of moq-rs's own SUBSCRIBE, which moq-rs cancels as soon as fetch_group returns:
    its frames stay small enough to arrive before that cancel (docs/interop.md, "moq-rs",
    a moq-rs limitation the relay cannot avoid)."""
    sent = {g: [os.urandom(50_000 if g == 2 else 40 + g) for _ in range(3)] for g in range(4)}
    r = await relay_at(tmp_path)
    try:
        async with moq_client(r) as mpub, moq_client(r) as msub:
            _bcast, track, _tc = await moq_track(mpub, msub, "iop/last")  # kept alive
            open_groups = []  # Group 3 stays open: held here so nothing finishes it
            for g in sorted(sent):
                grp = track.append_group()
                for p in sent[g]:
                    grp.write_frame(p)
                if g == 3:
                    open_groups.append(grp)
                else:
                    grp.finish()
            name = FullTrackName((b"iop", b"last"), b"t0")
            await wait_cached(r, name, Location(3, 2))
            got = {}
            async with moq_client(r) as mc:
                fc = await asyncio.wait_for(mc.announced_broadcast("iop/last"), TIMEOUT)
                for g in (2, 3):
                    grp = await asyncio.wait_for(fc.fetch_group("t0", g), TIMEOUT)
                    async with asyncio.timeout(TIMEOUT):
                        got[g] = [bytes(f.payload) async for f in grp]
        assert got == {g: sent[g] for g in (2, 3)}
        assert r.relay.counters.ok("FETCH") >= 1  # Group 2's
    finally:
        await r.close()


# -- 4. moq-rs fetching whole Groups the relay holds in LMDB ----------------------------------


async def _stored_track(data_dir: Path, name: FullTrackName, layers: int,
                        blocks: int) -> dict[Location, bytes]:
    """Push a complete Track with our publisher, wait for LMDB, stop the relay."""
    r = await relay_at(data_dir)
    try:
        pub = await client(r)
        track = await push_track(pub, name, layers)
        for g in range(layers):
            await track.group(g, group_payloads(g, blocks, 3000))
        await track.end()
        assert await r.relay.wait_committed(name, TIMEOUT)
        await pub.aclose()
        return track.sent
    finally:
        await r.close()


async def test_moqrs_fetches_whole_groups_from_lmdb_after_restart(tmp_path: Path) -> None:
    name = FullTrackName((b"iop", b"stored"), b"t0")
    layers, blocks = 3, 4
    sent = await _stored_track(tmp_path, name, layers, blocks)

    r = await relay_at(tmp_path)  # restart on the same data directory
    try:
        # moq-rs routes by announcement and SUBSCRIBEs before it FETCHes: the publisher
        # comes back (PUBLISH, no new Objects) so that SUBSCRIBE finds an upstream.
        pub = await client(r)
        await push_track(pub, name, layers)
        async with moq_client(r) as mc:
            consumer = await asyncio.wait_for(mc.announced_broadcast("iop/stored"), TIMEOUT)
            got: dict[int, list[bytes]] = {}
            for g in (1, 0, 2):
                grp = await asyncio.wait_for(consumer.fetch_group("t0", g), TIMEOUT)
                assert grp.sequence == g
                async with asyncio.timeout(TIMEOUT):
                    got[g] = [bytes(f.payload) async for f in grp]
        await pub.aclose()
        assert got == {g: [sent[Location(g, i)] for i in range(blocks)] for g in range(layers)}
        assert r.relay.counters.ok("FETCH") == 3
        assert r.relay.counters.fetch.objects[Tier.LMDB] == layers * blocks
    finally:
        await r.close()


async def test_moqrs_fetches_from_lmdb_with_no_publisher(tmp_path: Path) -> None:
    """moq-rs 0.5.1 fetch_group SUBSCRIBEs before it FETCHes. With no publisher left, the
    relay accepts that SUBSCRIBE for a Track it holds ended in LMDB, serves its fill and ends
    the subscription at once with PUBLISH_DONE TRACK_ENDED (docs/relay.md). Whether moq-rs
    then sends its FETCH (served from LMDB) or raises Error.NotFound without sending it depends
    on which stream it handles first (a moq-rs limitation; both happen since request streams
    are released at once). Whenever moq-rs sends its FETCH, the Group must come exact and
    from LMDB."""
    name = FullTrackName((b"iop", b"orphan"), b"t0")
    sent = await _stored_track(tmp_path, name, 2, 3)
    r = await relay_at(tmp_path)
    try:
        ann = await client(r)  # only makes the namespace routable for moq-rs
        await asyncio.wait_for(ann.publish_namespace(name.namespace), TIMEOUT)
        frames: list[bytes] | None = None
        async with moq_client(r) as mc:
            consumer = await asyncio.wait_for(mc.announced_broadcast("iop/orphan"), TIMEOUT)
            try:
                grp = await asyncio.wait_for(consumer.fetch_group("t0", 1), TIMEOUT)
                async with asyncio.timeout(TIMEOUT):
                    frames = [bytes(f.payload) async for f in grp]
            except moq.Error:
                pass  # NotFound: moq-rs handled PUBLISH_DONE before the fill
            except TimeoutError:
                # a third outcome (seen once in CI): moq-rs hands out a Group it then never
                # ends, having handled PUBLISH_DONE first (the same moq-rs limitation)
                frames = None
        if frames is not None:  # moq-rs took its FETCH's answer: the Group, exact, from LMDB
            assert frames == [sent[Location(1, i)] for i in range(3)]
            assert r.relay.counters.fetch.objects[Tier.LMDB] == 3
        await ann.aclose()
    finally:
        await r.close()


# -- 5. relay pulling history it lacks from a moq-rs publisher --------------------------------


async def test_kvcs_subscriber_fill_pulls_history_from_a_moqrs_publisher(
        tmp_path: Path) -> None:
    ns = (b"iop", b"hist")
    sent = {g: [os.urandom(200) + bytes([g, i]) for i in range(3)] for g in range(3)}
    # moq-rs's PUBLISH_DONE counts the streams of Groups 0 and 1 too, which it sent before
    # the relay subscribed: the relay's upstream subscription waits done_linger for them
    # (§7.7) before it ends. 1 s instead of 5 s: Group 2's stream has long arrived by then.
    session = dataclasses.replace(relay_session_config(RelayOptions()), done_linger=1.0)
    r = await relay_at(tmp_path, options=RelayOptions(in_flight_wait=0.2,
                                                      default_fill_timeout=3.0, session=session))
    try:
        async with moq_client(r) as mpub:
            bcast = mpub.create_broadcast("iop/hist")
            track = bcast.publish_track("t0")
            bcast.announce()
            for g in (0, 1):  # published before anyone subscribed: only moq-rs has them
                moq_group(track, sent[g])
            ours = await client(r)
            await wait_namespace(ours, ns)
            sub = await asyncio.wait_for(ours.subscribe(ns, b"t0", live_params()), TIMEOUT)
            assert sub.largest == Location(1, 2)
            moq_group(track, sent[2])
            track.finish()
            async with asyncio.timeout(TIMEOUT):
                got = await drain(sub)
            await ours.aclose()
    finally:
        await r.close()
    assert got.duplicates == []
    assert by_group(got.objects) == sent


# -- a tree: a publisher at A -> A -> R -> B -> a moq-rs subscriber --------------------------


async def tree(tmp_path: Path) -> tuple[RunningRelay, RunningRelay, RunningRelay]:
    """R, and A and B under it (``--upstream R``)."""
    r = await relay_at(tmp_path / "r")
    a = await relay_at(tmp_path / "a", upstream=[r.url])
    b = await relay_at(tmp_path / "b", upstream=[r.url])
    return r, a, b


async def moq_first_arrival(tc: Any) -> tuple[Any, dict[int, list[bytes]]]:
    """The first Group to reach a moq-rs TrackConsumer, read whole, and the iterator of
    those after it. moq-rs applications read in sequence order by default (``next_group``),
    which never returns a Group that arrives after a newer one: to reach them, the current
    Group must arrive first. Later Groups travel on streams of their own, in any order."""
    groups = tc.groups_as_arrived().__aiter__()
    async with asyncio.timeout(TIMEOUT):
        grp = await groups.__anext__()
        return groups, {grp.sequence: [bytes(f.payload) async for f in grp]}


async def moq_rest(groups: Any, got: dict[int, list[bytes]]) -> None:
    async with asyncio.timeout(TIMEOUT):
        async for grp in groups:
            assert grp.sequence not in got, f"Group {grp.sequence} twice"
            got[grp.sequence] = [bytes(f.payload) async for f in grp]


async def test_moqrs_publisher_at_one_relay_moqrs_subscriber_at_another(tmp_path: Path) -> None:
    """A announces the moq-rs broadcast up to R; B's moq-rs subscriber discovers it through
    R and gets every frame, routed B -> R -> A -> publisher (docs/relay.md, "Trees")."""
    sent = {g: [os.urandom(n) for n in (100, 2000, 30_000)] for g in range(3)}
    r, a, b = await tree(tmp_path)
    try:
        async with moq_client(a) as mpub, moq_client(b) as msub:
            bcast = mpub.create_broadcast("iop/tree")
            track = bcast.publish_track("t0")
            bcast.announce()
            consumer = await asyncio.wait_for(msub.announced_broadcast("iop/tree"), TIMEOUT)
            tc = await asyncio.wait_for(consumer.subscribe_track("t0", NO_SKIP), TIMEOUT)
            for g in sorted(sent):
                grp = track.append_group()
                for i, payload in enumerate(sent[g]):
                    grp.write_frame(payload, 1000 * g + i)
                grp.finish()
            track.finish()
            async with asyncio.timeout(TIMEOUT):
                mgot, again = await moq_groups(tc)
            del bcast
    finally:
        for x in (b, a, r):
            await x.close()
    assert again == [] and mgot == sent
    # one subscription per hop: B -> R -> A -> the publisher
    for x in (b, r, a):
        assert x.relay.counters.upstream_subscriptions == 1


@pytest.mark.parametrize("join", ["group_boundary", "mid_group"])
async def test_moqrs_subscriber_across_a_tree_gets_the_current_group_first(
        tmp_path: Path, join: str) -> None:
    """Issue 35 item 7: our publisher at A (A holds the history), a moq-rs subscriber joining
    at B while the Track goes on. The current Group arrives first (read in sequence order,
    moq-rs's default, it is not dropped) and whole before the Track ends, then every later
    Group. Each cold relay on the way asks upstream for the fill its subscriber asked
    (Relative Start 1), so only the current Group crosses the tree: with fills from {0,0}
    the history crossed ahead of it and the next Group overtook it live. At a Group boundary
    the End of Group at L reaches B as the empty END_OF_GROUP stream, passed on at each hop:
    without it moq-rs kept the Group open until PUBLISH_DONE (docs/relay.md)."""
    name = FullTrackName((b"iop", b"treelate"), b"t0")
    history, layers = 6, 9
    payload = {(g, i): os.urandom(32 << 10) + bytes([g, i]) for g in range(layers)
               for i in range(4)}
    current = history - 1 if join == "group_boundary" else history
    r, a, b = await tree(tmp_path)
    try:
        pub = await client(a)
        track = await push_track(pub, name, layers)
        for g in range(history):
            await track.group(g, [payload[g, i] for i in range(4)])
        if join == "mid_group":
            w = await track.served.open_subgroup(current, 0, track.priority(current))
            for i in range(2):
                await w.write_object(i, payload[current, i])
            await wait_cached(a, name, Location(current, 1))
        else:
            await wait_cached(a, name, Location(current, 4))  # its End of Group
        async with moq_client(b) as msub:
            consumer = await asyncio.wait_for(msub.announced_broadcast("iop/treelate"),
                                              TIMEOUT)
            tc = await asyncio.wait_for(consumer.subscribe_track("t0", NO_SKIP), TIMEOUT)
            if join == "mid_group":
                for i in range(2, 4):
                    await w.write_object(i, payload[current, i])
                await w.write_status(4, ObjectStatus.END_OF_GROUP, fin=True)
            await track.group(current + 1, [payload[current + 1, i] for i in range(4)])
            groups, got = await moq_first_arrival(tc)
            assert list(got) == [current]
            for g in range(current + 2, layers):
                await track.group(g, [payload[g, i] for i in range(4)])
            await track.end()
            await moq_rest(groups, got)
        await pub.aclose()
    finally:
        for x in (b, a, r):
            await x.close()
    assert got == {g: [payload[g, i] for i in range(4)] for g in range(current, layers)}
    for x in (r, b):  # the current Group and what followed crossed the tree, no history
        assert x.relay.counters.objects_received == 4 * (layers - current)


async def test_moqrs_publisher_and_subscriber_across_a_tree_join_mid_group(
        tmp_path: Path) -> None:
    """Issue 35 item 7 with moq-rs at both ends: nothing subscribed at A before B's moq-rs
    subscriber joins in the middle of Group 2; the Track goes on at once. Group 2 arrives
    first and whole (its first frames from the fills, the rest live), then Group 3. moq-rs
    answers the relays' fill of the current Group (Relative Start 1) but not one from {0,0}:
    with that, the current Group came from an upstream FETCH after in_flight_wait, behind
    the next Group, and moq-rs dropped it."""
    sent = {g: [os.urandom(200) + bytes([g, i]) for i in range(4)] for g in range(4)}
    r, a, b = await tree(tmp_path)
    try:
        async with moq_client(a) as mpub, moq_client(b) as msub:
            bcast = mpub.create_broadcast("iop/treemid")
            track = bcast.publish_track("t0")
            bcast.announce()
            for g in (0, 1):
                moq_group(track, sent[g])
            current = moq_group(track, sent[2][:2], finish=False)
            consumer = await asyncio.wait_for(msub.announced_broadcast("iop/treemid"), TIMEOUT)
            tc = await asyncio.wait_for(consumer.subscribe_track("t0", NO_SKIP), TIMEOUT)
            for p in sent[2][2:]:
                current.write_frame(p)
            current.finish()
            moq_group(track, sent[3])
            groups, got = await moq_first_arrival(tc)
            assert list(got) == [2]
            track.finish()
            await moq_rest(groups, got)
            del bcast
    finally:
        for x in (b, a, r):
            await x.close()
    assert got == {2: sent[2], 3: sent[3]}


async def test_a_binary_namespace_does_not_break_moqrs_sessions(tmp_path: Path) -> None:
    """Issue 26 item 13: a KVCS publication (binary namespace fields) on the relay; moq-rs
    sessions connected before and after still discover and receive a text broadcast."""
    r = await relay_at(tmp_path)
    try:
        ours = await client(r)
        binary = (b"kvcs-1", bytes(range(200, 232)), b"\xff\xfe")
        early = moq_client(r)
        await early.__aenter__()
        try:
            await asyncio.wait_for(ours.publish_namespace(binary), TIMEOUT)
            async with moq_client(r) as mpub, moq_client(r) as msub:
                for i, sub_session in enumerate((msub, early)):
                    _b, track, tc = await moq_track(mpub, sub_session, f"iop/text{i}")
                    grp = track.append_group()
                    grp.write_frame(b"after a binary namespace", 0)
                    grp.finish()
                    track.finish()
                    async with asyncio.timeout(TIMEOUT):
                        got, again = await moq_groups(tc)
                    assert got == {0: [b"after a binary namespace"]} and again == [], i
                    del _b
        finally:
            await early.__aexit__(None, None, None)
        # our own clients still hear of the binary namespace
        await wait_namespace(await client(r), binary)
    finally:
        await r.close()
