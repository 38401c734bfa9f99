"""Pull-through at any size and depth (docs/relay.md, "Trees"; issue 35 item 3): a Track larger
than a session's receive window (32 MiB) crosses every hop of a deep tree, bit for bit, and an
upstream FETCH a relay stops reading is ended, never left to hold receive credit."""

from __future__ import annotations

import asyncio
from pathlib import Path

from relay_helpers import (
    TIMEOUT,
    PushedTrack,
    client,
    complete_track,
    make_ns,
    relay_at,
    wait_namespace,
)

from relay.core.relay import RelayOptions
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName
from relay.service import RunningRelay
from relay.session import MoqtSession, QuicSettings, ReceivedObject, StreamAborted

# 64 MiB in 16 Groups (layers) of 64 Objects of 64 KiB: twice the connection window, and
# more Objects than a request's event queue holds (256), so a fetch stream nobody reads
# any more holds unread bytes in QUIC
GROUPS, PER_GROUP, SIZE = 16, 64, 64 << 10
# Large datagrams: at 1200 bytes one aioquic process took 15 s to move 64 MiB across three
# hops (1.5 s at 16384); the stall does not depend on the datagram size.
DATAGRAM = 16384
# The consumer's budget, passed on by every hop; each relay's own default (used for a
# request that names none) is far shorter than the transfer, as 5 s is for 64 MiB through a
# tree at 1200-byte datagrams on aioquic.
BUDGET_MS = 30_000
DEFAULT_BUDGET = 0.5


async def tree_relay(tmp_path: Path, name: str, parent: RunningRelay | None) -> RunningRelay:
    return await relay_at(tmp_path / name, upstream=[parent.url] if parent else [],
                          options=RelayOptions(default_fill_timeout=DEFAULT_BUDGET),
                          max_datagram_size=DATAGRAM, memory_bytes=512 << 20,
                          lmdb_bytes=512 << 20)


async def fast_client(r: RunningRelay) -> MoqtSession:
    return await client(r, settings=QuicSettings(max_datagram_size=DATAGRAM))


async def publish(at: RunningRelay, groups: int, per_group: int, size: int) -> PushedTrack:
    name = FullTrackName(make_ns(), b"k.raw.s0")
    session = await fast_client(at)
    async with asyncio.timeout(TIMEOUT):
        return await complete_track(session, name, groups, per_group, size)


async def fetched(session: MoqtSession, name: FullTrackName, budget_ms: int
                  ) -> dict[object, bytes]:
    resp = await asyncio.wait_for(
        session.fetch(name.namespace, name.name, Params(fill_timeout=budget_ms)), TIMEOUT)
    async with asyncio.timeout(TIMEOUT):
        return {e.location: bytes(e.payload) for e in await resp.collect()
                if isinstance(e, ReceivedObject)}


async def test_64_mib_crosses_every_hop_of_a_four_level_tree(tmp_path: Path) -> None:
    # R <- M <- N <- L, and S under R: L's Track crosses four hops to S (three of them as
    # R <- M <- L would)
    r = await tree_relay(tmp_path, "r", None)
    m = await tree_relay(tmp_path, "m", r)
    n = await tree_relay(tmp_path, "n", m)
    leaf = await tree_relay(tmp_path, "l", n)
    s = await tree_relay(tmp_path, "s", r)
    relays = [r, m, n, leaf, s]
    try:
        t = await publish(leaf, GROUPS, PER_GROUP, SIZE)
        await wait_namespace(await client(s), t.full_name.namespace)
        # FETCH, as `kvcs fetch` retrieves a completed cache
        assert await fetched(await fast_client(s), t.full_name, BUDGET_MS) == t.sent
        # the consumer's budget reached every hop: none ran out and reported a range unknown
        assert [x.relay.counters.fetch.unknown_ranges for x in relays] == [0] * 5
        assert [x.relay.counters.upstream_fetched_objects for x in (s, r, m, n)] == \
            [len(t.sent)] * 4  # each Object crossed each hop once
    finally:
        for x in reversed(relays):
            await x.close()


async def test_a_pull_through_cut_short_ends_its_upstream_fetch(tmp_path: Path) -> None:
    # L -> R -> S: S's pull-through is cut by the consumer's budget long before the Track
    # has crossed; every FETCH it set off upstream ends at once. Before, on aioquic, a
    # fetch stream left unread held its bytes against the link's 32 MiB window until the
    # session ended, and the relay above went on serving it: a few such cuts and nothing
    # more crossed the link. 16 MiB of 16 KiB Objects: more than a request's event queue
    # (256 Objects) and a stream's window (4 MiB) hold.
    r = await tree_relay(tmp_path, "r", None)
    leaf = await tree_relay(tmp_path, "l", r)
    s = await tree_relay(tmp_path, "s", r)
    relays = [r, leaf, s]
    try:
        t = await publish(leaf, 8, 128, 16 << 10)
        await wait_namespace(await client(s), t.full_name.namespace)
        consumer = await fast_client(s)
        try:
            part = await fetched(consumer, t.full_name, 50)
        except StreamAborted:  # the budget ran out inside a Group (§17 item 20)
            part = {}
        assert len(part) < len(t.sent)
        async with asyncio.timeout(TIMEOUT):
            for x in (leaf, r, s):
                await x.relay.counters.wait_idle()
        assert await fetched(consumer, t.full_name, BUDGET_MS) == t.sent
    finally:
        for x in reversed(relays):
            await x.close()
