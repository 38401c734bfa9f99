"""A FETCH whose whole fetch stream arrives before FETCH_OK (§10 item 4: data may come before
the reply). Seen when a qh3 relay's transmits coalesced differently: the requester released
the request stream when the fetch stream ended and then read no FETCH_OK ("FETCH
cancelled")."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from session_helpers import TIMEOUT, Obj, TrackPublisher, served_by

import relay.session.fetch as fetch_module
from relay.moqt.messages import FetchOk
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.session import IncomingFetch
from relay.session.writers import FetchWriter
from relay.transport import ensure_self_signed

NS = (b"kvcs-1", os.urandom(32), b"compat", b"anchor", b"pub")
TRACK = FullTrackName(NS, b"k.raw.s0")


class FetchOkLast(TrackPublisher):
    """Answers FETCH with the complete fetch stream first and FETCH_OK only once the
    requester has seen that stream end: the order the network may deliver them in."""

    def __init__(self, data_seen: asyncio.Event) -> None:
        super().__init__(TRACK)
        self.data_seen = data_seen

    async def fetch(self, req: IncomingFetch) -> None:
        stream = await req.session.conn.open_uni()
        w = FetchWriter(stream, req.request_id, req.group_order)
        await stream.write(w.header_bytes())
        for o in self.objects:
            await w.write_object(o.group, 0, o.object_id, self.priority, o.payload)
        await w.finish()
        await asyncio.wait_for(self.data_seen.wait(), TIMEOUT)
        req._answer()
        await req.rs.send(FetchOk(False, self.objects[-1].location, Params(), ()))
        await req.rs.finish()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_self_signed(tmp_path_factory.mktemp("tls")).certfile.parent


async def test_a_fetch_stream_that_ends_before_fetch_ok_still_reads_fetch_ok(
        certs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data_seen = asyncio.Event()
    ended = fetch_module.FetchResponse.fetch_stream_ended

    async def observed(self, info, fin, reset_code):  # type: ignore[no-untyped-def]
        await ended(self, info, fin, reset_code)
        data_seen.set()

    monkeypatch.setattr(fetch_module.FetchResponse, "fetch_stream_ended", observed)
    publisher = FetchOkLast(data_seen)
    payloads = [os.urandom(500 + i) for i in range(3)]
    publisher.objects.extend(Obj(0, i, p) for i, p in enumerate(payloads))
    async with served_by(publisher, certs) as client:
        resp = await asyncio.wait_for(client.fetch(NS, TRACK.name), TIMEOUT)
        assert resp.end_location == Location(0, 2)
        got = await asyncio.wait_for(resp.collect(), TIMEOUT)
        assert [bytes(e.payload) for e in got] == payloads
        assert data_seen.is_set()
