"""Track Aliases on the subscriber side of a real session (§8.3, Appendix B): a publisher
that names two different live Tracks with one Track Alias is closed with
DUPLICATE_TRACK_ALIAS; the same Track under its alias again, or an alias freed by the end
of its subscription, is fine."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from session_helpers import TIMEOUT, served_by

from relay.moqt.codes import SessionErrorCode
from relay.session import (
    IncomingSubscribe,
    MoqtSession,
    ServedSubscription,
    SessionFailure,
    SessionHandler,
    SubscriptionDone,
)
from relay.transport import ensure_self_signed

NS = (b"kvcs-1", os.urandom(32))
ALIAS = 7


class OneAliasPublisher(SessionHandler):
    """Answers every SUBSCRIBE with the same Track Alias, as a faulty publisher would."""

    def __init__(self) -> None:
        self.served: dict[bytes, list[ServedSubscription]] = {}

    async def subscribe(self, req: IncomingSubscribe) -> None:
        served = await req.accept(None, track_alias=ALIAS)
        self.served.setdefault(req.name, []).append(served)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[OneAliasPublisher, MoqtSession]]:
    publisher = OneAliasPublisher()
    async with served_by(publisher, ensure_self_signed(tmp_path).certfile.parent) as client:
        yield publisher, client


async def test_one_alias_for_two_live_tracks_closes_the_session(pair) -> None:  # type: ignore[no-untyped-def]
    _publisher, client = pair
    x = await asyncio.wait_for(client.subscribe(NS, b"x"), TIMEOUT)
    assert x.track_alias == ALIAS
    # the same Track again under its alias: no conflict
    again = await asyncio.wait_for(client.subscribe(NS, b"x"), TIMEOUT)
    assert again.track_alias == ALIAS and not client.closed
    with pytest.raises(SessionFailure):
        await asyncio.wait_for(client.subscribe(NS, b"y"), TIMEOUT)
    code, _ = await asyncio.wait_for(client.wait_closed(), TIMEOUT)
    assert code == SessionErrorCode.DUPLICATE_TRACK_ALIAS


async def test_an_alias_freed_by_publish_done_names_another_track(pair) -> None:  # type: ignore[no-untyped-def]
    publisher, client = pair
    x = await asyncio.wait_for(client.subscribe(NS, b"x"), TIMEOUT)
    await publisher.served[b"x"][0].done()
    async with asyncio.timeout(TIMEOUT):
        events = [ev async for ev in x]
    assert isinstance(events[-1], SubscriptionDone)
    y = await asyncio.wait_for(client.subscribe(NS, b"y"), TIMEOUT)
    assert y.track_alias == ALIAS and not client.closed
