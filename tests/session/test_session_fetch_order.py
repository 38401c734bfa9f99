"""A FETCH whose streams arrive out of the usual order. The whole fetch stream before FETCH_OK
(§10 item 4: data may come before the reply; seen when a qh3 relay's transmits coalesced
differently: the requester released the request stream when the fetch stream ended and then
read no FETCH_OK, "FETCH cancelled"). A fetch stream that never arrives: reset before its
header named the request, or never opened (the requester waited to its deadline)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest
from session_helpers import TIMEOUT, Obj, TrackPublisher, served_by

import relay.session.fetch as fetch_module
from relay.moqt.messages import FetchOk
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.session import IncomingFetch, RequestCancelled, StreamAborted
from relay.session.writers import FetchWriter
from relay.transport import StreamReset, TransportError, ensure_self_signed

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


class ResetAtOnce(TrackPublisher):
    """Takes the FETCH (FETCH_OK), then resets its fetch stream before anything of it was
    sent: the stream never names the request at the requester (§18 rule 3)."""

    async def fetch(self, req: IncomingFetch) -> None:
        w = await req.accept(False, self.objects[-1].location)
        await w.write_object(0, 0, 0, self.priority, self.objects[0].payload)
        w.reset()


class FinWithoutStream(TrackPublisher):
    """FETCH_OK and a FIN on the request stream, and no fetch stream at all."""

    async def fetch(self, req: IncomingFetch) -> None:
        req._answer()
        await req.rs.send(FetchOk(False, self.objects[-1].location, Params(), ()))
        await req.rs.finish()


@pytest.mark.parametrize("responder", [ResetAtOnce, FinWithoutStream])
async def test_a_fetch_whose_stream_never_arrives_ends_instead_of_waiting(
        certs: Path, monkeypatch: pytest.MonkeyPatch, responder: type[TrackPublisher]) -> None:
    # a short grace keeps the FIN case quick; the reset case never waits for it
    monkeypatch.setattr(fetch_module, "FETCH_STREAM_GRACE", 0.2)
    publisher = responder(TRACK)
    publisher.objects.append(Obj(0, 0, os.urandom(3000)))
    async with served_by(publisher, certs) as client:
        for _ in range(2):  # and the session goes on serving the next FETCH
            # the FETCH fails, either way, instead of waiting for a stream that cannot come:
            # a reset request stream may also have taken FETCH_OK with it (RequestCancelled)
            with pytest.raises(StreamAborted if responder is FinWithoutStream else
                               (StreamAborted, RequestCancelled)):
                resp = await asyncio.wait_for(client.fetch(NS, TRACK.name), TIMEOUT)
                await asyncio.wait_for(resp.collect(), TIMEOUT)


class DataFirstNoReply(TrackPublisher):
    """Sends its fetch stream at once and holds FETCH_OK back: the requester gives up
    before any reply. Records whether the request was cancelled (§10 item 9)."""

    def __init__(self) -> None:
        super().__init__(TRACK)
        self.cancelled = asyncio.Event()

    async def fetch(self, req: IncomingFetch) -> None:
        stream = await req.session.conn.open_uni()
        w = FetchWriter(stream, req.request_id, req.group_order)
        await stream.write(w.header_bytes())
        with contextlib.suppress(TransportError):  # a requester that gave up may stop it
            for o in self.objects:
                await w.write_object(o.group, 0, o.object_id, self.priority, o.payload)
        with contextlib.suppress(StreamReset):
            while await req.rs.recv() is not None:
                continue  # nothing else comes on a FETCH's request stream
            return  # a FIN: the request was not cancelled
        self.cancelled.set()


async def test_a_fetch_given_up_before_its_reply_is_cancelled(
        certs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its fetch stream arrived first and was routed to it: left so, nobody would ever read
    # it again, and its unread bytes would hold the session's receive window (a relay's
    # upstream link) until the session ended.
    routed = asyncio.Event()
    opened = fetch_module.FetchResponse.stream_opened

    def observed(self):  # type: ignore[no-untyped-def]
        opened(self)
        routed.set()

    monkeypatch.setattr(fetch_module.FetchResponse, "stream_opened", observed)
    publisher = DataFirstNoReply()
    # more than the request's event queue holds (256): the stream's reader then waits
    publisher.objects.extend(Obj(0, i, os.urandom(4096)) for i in range(1024))
    async with served_by(publisher, certs) as client:
        asked = asyncio.ensure_future(client.fetch(NS, TRACK.name))
        await asyncio.wait_for(routed.wait(), TIMEOUT)
        asked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asked
        await asyncio.wait_for(publisher.cancelled.wait(), TIMEOUT)
