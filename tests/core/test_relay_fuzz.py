"""Mutated requests against a running relay: whatever a peer sends, its session is either
served or closed with a protocol code — never an INTERNAL_ERROR (which would mean a bug on
our side) — and the relay keeps serving everyone else, cache intact."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from relay_helpers import (
    TIMEOUT,
    client,
    fetch_objects,
    group_payloads,
    make_ns,
    push_track,
    relay_at,
)

from relay.moqt.codes import ObjectStatus, ParameterType, SessionErrorCode
from relay.moqt.control import encode_message
from relay.moqt.dataplane.objects import SubgroupHeader
from relay.moqt.dataplane.subgroup import SubgroupStreamEncoder
from relay.moqt.location_filter import LocationFilter
from relay.moqt.messages import (
    Fetch,
    Publish,
    PublishNamespace,
    Setup,
    Subscribe,
    SubscribeNamespace,
    TrackStatus,
)
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName
from relay.moqt.range_filter import Range, RangeFilter
from relay.service import RunningRelay
from relay.session import MoqtSession
from relay.session.wire import MOQT
from relay.transport import SendStream, connect

SETUP = encode_message(Setup(max_filter_ranges=8))
ITERATIONS = 20


def _seeds(ns: tuple[bytes, ...]) -> list[bytes]:
    p = Params(location_filter=LocationFilter.next_object(),
               fill=Params(location_filter=LocationFilter.absolute_start(0, 0)),
               range_filters=(RangeFilter(ParameterType.OBJECTID_FILTER, 0, (Range(0, 3),)),))
    return [encode_message(m) for m in (
        Subscribe(0, ns, b"k.raw.s0", p),
        Fetch(0, ns, b"k.raw.s0", Params(location_filter=LocationFilter.absolute_group_end(
            0, 0, 1))),
        Publish(0, ns, b"v.raw.s0", 7),
        PublishNamespace(0, ns),
        SubscribeNamespace(0, ns[:2]),
        TrackStatus(0, ns, b"manifest"),
    )]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1 and len(b) > 1:
            del b[rng.randrange(len(b)):]
        elif op == 2:
            b[rng.randrange(len(b) + 1):0] = bytes(rng.randrange(256)
                                                   for _ in range(rng.randint(1, 8)))
        elif op == 3 and len(b) > 3:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


async def test_mutated_requests_never_cause_an_internal_error(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    rng = random.Random(20261129)
    try:
        pub = await client(r)
        track = await push_track(pub, name, layers=2)
        await track.group(0, group_payloads(0, 3))
        seeds = _seeds(name.namespace)
        codes: list[int] = []
        served = 0
        for _ in range(60):
            data = _mutate(rng, rng.choice(seeds))
            conn = await asyncio.wait_for(
                connect(r.url, ca_file=r.certfile, application=MOQT), TIMEOUT)
            ctl = await conn.open_uni()
            await ctl.write(SETUP)
            send, recv = await conn.open_bi()
            await send.write(data, end_stream=True)
            # served (a reply arrives) or closed: either way within the timeout
            done = asyncio.ensure_future(conn.wait_closed())
            reply = asyncio.ensure_future(recv.read())
            await asyncio.wait({done, reply}, timeout=TIMEOUT,
                               return_when=asyncio.FIRST_COMPLETED)
            assert done.done() or reply.done(), f"no answer to {data.hex()}"
            if done.done():
                code, reason = done.result()
                assert code != SessionErrorCode.INTERNAL_ERROR, (data.hex(), reason)
                codes.append(code)
            else:
                done.cancel()
                served += 1
            reply.cancel()
            conn.close()
        # both outcomes were exercised, or the test claims more than it checked
        assert codes, "no mutation was rejected: the mutator does nothing"
        assert served, "no mutated request was answered: only the refusal path was tried"
        # the relay still serves, and what it cached is intact
        await track.group(1, group_payloads(1, 3))
        await track.end()
        c = await client(r)
        _resp, got = await fetch_objects(c, name)
        assert got == track.sent
    finally:
        await r.close()


async def _fate(r: RunningRelay, name: FullTrackName, pub: MoqtSession, stream: SendStream
                ) -> tuple[str, int | None]:
    """What the relay did with one whole subgroup stream, decided on the relay's own events:
    ("closed", code) it closed the session; ("valid", None) it read the stream to its end
    and kept the session; ("ignored", None) it refused the stream (an unknown Track Alias)."""
    upstream = r.relay.tracks[name].upstreams[0]  # the relay's side of our PUBLISH
    # The relay's subscription counts the stream as ended after its last byte was parsed;
    # a violation closes the session in that same step, before any waiter runs.
    ended = asyncio.ensure_future(upstream._stream_ended.wait())
    stopped = asyncio.ensure_future(stream.wait_stopped())
    closed = asyncio.ensure_future(pub.wait_closed())
    waits = {ended, stopped, closed}
    try:
        done, _ = await asyncio.wait(waits, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    assert done, "the relay neither read the stream, refused it, nor closed the session"
    if upstream.session.closed:
        info = upstream.session.close_info
        return "closed", info[0] if info is not None else None
    return ("valid" if ended in done else "ignored"), None


async def test_mutated_subgroup_streams_never_cause_an_internal_error(tmp_path: Path) -> None:
    r = await relay_at(tmp_path)
    rng = random.Random(29112026)
    fates: dict[str, int] = {}
    try:
        for i in range(ITERATIONS):
            name = FullTrackName(make_ns(), b"k.raw.s0")
            pub = await client(r)
            track = await push_track(pub, name, layers=2)
            enc = SubgroupStreamEncoder(SubgroupHeader(track.served.track_alias, 0, 0, 5,
                                                       first_object=True))
            valid = enc.header_bytes() + b"".join(
                enc.object_header(j, 40) + bytes([j]) * 40 for j in range(3)) + \
                enc.status_object(3, ObjectStatus.END_OF_GROUP)
            stream = await pub.conn.open_uni()
            await stream.write(_mutate(rng, valid), end_stream=True)
            fate, code = await _fate(r, name, pub, stream)
            fates[fate] = fates.get(fate, 0) + 1
            assert code != SessionErrorCode.INTERNAL_ERROR, i
            await pub.aclose()
        # both sides of the claim were exercised: streams refused and streams served
        assert fates.get("closed", 0) >= 3, fates
        assert fates.get("valid", 0) >= 3, fates
        c = await client(r)  # the relay still serves
        assert c.peer_setup is not None
    finally:
        await r.close()
