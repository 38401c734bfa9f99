"""A REQUEST_ERROR to a request the relay makes ends that request, never the session
(docs/relay.md, "Requests the relay makes"): a publisher refusing the relay's REQUEST_UPDATE
(Forward 1 on a PUBLISH offered with Forward 0) ends that request, with a logged reason; its
session, that Track and its other Tracks go on."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from relay_helpers import TIMEOUT, client, drain, group_payloads, make_ns, push_track, relay_at

from relay.moqt.codes import RequestErrorCode
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.session import RequestRejected


async def _refuse(msg: object) -> Params:
    raise RequestRejected(RequestErrorCode.NOT_SUPPORTED, "REQUEST_UPDATE not supported")


async def test_a_refused_request_update_ends_that_subscription_only(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    r = await relay_at(tmp_path / "r")
    ns = make_ns()
    kept, refused = FullTrackName(ns, b"k.raw.s0"), FullTrackName(ns, b"k.raw.s1")
    try:
        pub = await client(r)
        t = await push_track(pub, kept, layers=1)
        c = await client(r)
        sub = await asyncio.wait_for(c.subscribe(kept.namespace, kept.name), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            served = await pub.publish(refused.namespace, refused.name, Params(forward=False))
            served.on_update = _refuse  # set before the relay's REQUEST_UPDATE is read
            # the refusal is logged (no event tells; a bounded poll)
            while not [rec for rec in caplog.records if "refused Forward 1" in rec.getMessage()]:
                await asyncio.sleep(0.01)
        assert r.relay.tracks[refused].live and not served.cancelled.is_set()
        payloads = group_payloads(0, 2, size=100)
        await t.group(0, payloads)
        await t.end()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(sub)
        assert got.objects == {Location(0, i): p for i, p in enumerate(payloads)}
        assert not pub.closed and not c.closed
    finally:
        await r.close()
    lines = [rec for rec in caplog.records if "refused Forward 1" in rec.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "NOT_SUPPORTED" in lines[0].getMessage()
    assert not [rec for rec in caplog.records if rec.exc_info or "internal error" in
                rec.getMessage()]
