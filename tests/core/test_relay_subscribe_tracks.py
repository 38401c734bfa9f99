"""SUBSCRIBE_TRACKS (draft-22; docs/relay.md, "Discovery"): after REQUEST_OK the relay
PUBLISHes each Track under the prefix it can serve, live or ended, now and as they appear,
also what LMDB held across a restart; a subscriber's REQUEST_ERROR ends that PUBLISH only;
REQUEST_UPDATE changes the PUBLISHes to come; cancelling stops them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    client,
    complete_track,
    drain,
    group_payloads,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.moqt.codes import PublishDoneCode, RequestErrorCode
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.service import RunningRelay
from relay.session import (
    IncomingPublish,
    MoqtSession,
    RequestRejected,
    SessionHandler,
    Subscription,
)


@dataclass
class _Offer:
    name: FullTrackName
    params: Params
    sub: Subscription | None  # None: refused


class _Subscriber(SessionHandler):
    """Accepts every PUBLISH but those named in ``refuse`` (UNINTERESTED)."""

    def __init__(self, refuse: tuple[bytes, ...] = ()) -> None:
        self.refuse = refuse
        self.offers: asyncio.Queue[_Offer] = asyncio.Queue()

    async def publish(self, req: IncomingPublish) -> None:
        if req.name in self.refuse:
            await req.reject(RequestErrorCode.UNINTERESTED, "not this one")
            await self.offers.put(_Offer(req.full_name, req.params, None))
            return
        await self.offers.put(_Offer(req.full_name, req.params, await req.accept()))

    async def next(self) -> _Offer:
        return await asyncio.wait_for(self.offers.get(), TIMEOUT)


async def _subscriber(r: RunningRelay, refuse: tuple[bytes, ...] = ()
                      ) -> tuple[MoqtSession, _Subscriber]:
    h = _Subscriber(refuse)
    return await client(r, handler=h), h


async def test_a_publish_per_track_now_and_later_until_cancelled(tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "r")
    ns = make_ns()
    live, ended = FullTrackName(ns, b"k.raw.s0"), FullTrackName(ns, b"manifest")
    other = FullTrackName(make_ns(), b"k.raw.s0")  # not under the prefix
    try:
        pub = await client(r)
        t = await push_track(pub, live, layers=2)
        await complete_track(pub, ended, layers=1, per_group=2)
        await complete_track(pub, other, layers=1, per_group=1)
        await wait_cached(r, ended, Location(1, 0))
        c, h = await _subscriber(r, refuse=(b"k.raw.s2",))
        ts = await asyncio.wait_for(c.subscribe_tracks(ns[:4]), TIMEOUT)
        first = {o.name: o for o in (await h.next(), await h.next())}
        assert set(first) == {live, ended}
        # the ended Track: its Largest Object, then PUBLISH_DONE TRACK_ENDED at once
        sub_ended = first[ended].sub
        assert sub_ended is not None and sub_ended.largest == Location(1, 0)
        async with asyncio.timeout(TIMEOUT):
            done = (await drain(sub_ended)).done
        assert done is not None and done.status == PublishDoneCode.TRACK_ENDED
        # the live one delivers what is published from now on
        sub_live = first[live].sub
        assert sub_live is not None
        payloads = group_payloads(0, 2, size=100)
        await t.group(0, payloads)
        # a Track appearing later is PUBLISHed too (with the updated FORWARD); one the
        # subscriber refuses is not, and the next one still is
        await asyncio.wait_for(ts.update(Params(forward=False)), TIMEOUT)
        await push_track(pub, FullTrackName(ns, b"k.raw.s2"), layers=1, announce=False)
        refused = await h.next()
        assert refused.sub is None and refused.name.name == b"k.raw.s2"
        await push_track(pub, FullTrackName(ns, b"k.raw.s1"), layers=1, announce=False)
        later = await h.next()
        assert later.name.name == b"k.raw.s1" and later.params.forward is False
        assert not c.closed and not pub.closed
        # cancelled: nothing more is PUBLISHed
        ts.cancel()
        handler = next(s.handler for s in r.relay.sessions if s.handler.track_offers)
        async with asyncio.timeout(TIMEOUT):
            while handler.track_offers:
                await asyncio.sleep(0.01)
        await push_track(pub, FullTrackName(ns, b"k.raw.s3"), layers=1, announce=False)
        async with asyncio.timeout(TIMEOUT):
            while FullTrackName(ns, b"k.raw.s3") not in r.relay.tracks or \
                    not r.relay.tracks[FullTrackName(ns, b"k.raw.s3")].live:
                await asyncio.sleep(0.01)
        await t.group(1, payloads)
        await t.end()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub_live)
        assert got.objects == {Location(g, i): p for g in (0, 1) for i, p in enumerate(payloads)}
        assert h.offers.empty()
    finally:
        await r.close()


async def test_tracks_lmdb_held_across_a_restart_are_published(tmp_path: Path) -> None:
    ns = make_ns()
    name = FullTrackName(ns, b"k.raw.s0")
    r = await relay_at(tmp_path / "r")
    try:
        pub = await client(r)
        await complete_track(pub, name, layers=2, per_group=2, size=100)
        assert await r.relay.wait_committed(name)
    finally:
        await r.close()
    r = await relay_at(tmp_path / "r")
    try:
        c, h = await _subscriber(r)
        await asyncio.wait_for(c.subscribe_tracks(ns[:2]), TIMEOUT)
        offer = await h.next()
        assert offer.name == name and offer.sub is not None
        assert offer.sub.largest == Location(2, 0)
        async with asyncio.timeout(TIMEOUT):
            done = (await drain(offer.sub)).done
        assert done is not None and done.status == PublishDoneCode.TRACK_ENDED
    finally:
        await r.close()


async def test_overlapping_prefixes_are_refused(tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "r")
    ns = make_ns()
    try:
        c, _ = await _subscriber(r)
        await asyncio.wait_for(c.subscribe_tracks(ns[:2]), TIMEOUT)
        # SUBSCRIBE_NAMESPACE has its own overlap space
        await asyncio.wait_for(c.subscribe_namespace(ns[:2]), TIMEOUT)
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(c.subscribe_tracks(ns[:3]), TIMEOUT)
        assert e.value.code == RequestErrorCode.PREFIX_OVERLAP
    finally:
        await r.close()
