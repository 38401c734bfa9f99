"""A minimal in-memory publisher for session tests: one Track, answered from a list."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from relay.moqt.codes import (
    GroupOrder,
    LocationFilterType,
    ObjectStatus,
    ParameterType,
    RequestErrorCode,
)
from relay.moqt.location_filter import resolve_fetch_range, resolve_subscription_range
from relay.moqt.primitives import FullTrackName, Location
from relay.session import (
    IncomingFetch,
    IncomingSubscribe,
    MoqtSession,
    ServedSubscription,
    SessionConfig,
    SessionHandler,
    open_session,
)
from relay.session.wire import MOQT
from relay.transport import serve

TIMEOUT = 10.0


@dataclass(frozen=True)
class Obj:
    group: int
    object_id: int
    payload: bytes
    status: ObjectStatus = ObjectStatus.NORMAL

    @property
    def location(self) -> Location:
        return Location(self.group, self.object_id)


class TrackPublisher(SessionHandler):
    """Publishes one Track group by group; answers SUBSCRIBE (with fill) and FETCH."""

    def __init__(self, track: FullTrackName, priority: int = 7) -> None:
        self.track = track
        self.priority = priority
        self.objects: list[Obj] = []
        self.live: list[ServedSubscription] = []
        self.subscribed = asyncio.Event()
        self.lock = asyncio.Lock()

    @property
    def largest(self) -> Location | None:
        return self.objects[-1].location if self.objects else None

    async def produce_group(self, group: int, payloads: list[bytes], *, end_of_track: bool = False
                            ) -> None:
        async with self.lock:
            objs = [Obj(group, i, p) for i, p in enumerate(payloads)]
            objs.append(Obj(group, len(payloads), b"", ObjectStatus.END_OF_GROUP))
            self.objects.extend(objs)
            for served in list(self.live):
                if served.cancelled.is_set():
                    continue
                w = await served.open_subgroup(group, 0, self.priority)
                for o in objs[:-1]:
                    await w.write_object(o.object_id, o.payload)
                await w.write_status(objs[-1].object_id, ObjectStatus.END_OF_GROUP, fin=True)
            if end_of_track:
                end = Obj(group + 1, 0, b"", ObjectStatus.END_OF_TRACK)
                self.objects.append(end)
                for served in list(self.live):
                    w = await served.open_subgroup(group + 1, 0, self.priority)
                    await w.write_status(0, ObjectStatus.END_OF_TRACK, fin=True)
                    await served.done()

    async def subscribe(self, req: IncomingSubscribe) -> None:
        if req.full_name != self.track:
            await req.reject(RequestErrorCode.DOES_NOT_EXIST, "no such track")
            return
        async with self.lock:  # L and the live start evaluated atomically (§9.6)
            largest = self.largest
            served = await req.accept(largest)
            fill = req.params.fill
            if fill is not None and largest is not None:
                rng = resolve_fetch_range(fill.location_filter or req.params.location_filter,
                                          largest)
                if rng is not None and not rng.is_empty:
                    w = await served.open_fill()
                    for o in self.objects:
                        if o.status == ObjectStatus.NORMAL and rng.contains(o.location):
                            await w.write_object(o.group, 0, o.object_id, self.priority,
                                                 o.payload)
                    await w.finish()
            live = resolve_subscription_range(req.params.location_filter, largest)
            assert live.start > (largest or Location(0, 0)) or largest is None
            self.live.append(served)
            self.subscribed.set()

    async def fetch(self, req: IncomingFetch) -> None:
        if req.full_name != self.track:
            await req.reject(RequestErrorCode.DOES_NOT_EXIST, "no such track")
            return
        rng = resolve_fetch_range(req.params.location_filter, self.largest)
        if rng is None or rng.is_empty:
            await req.reject(RequestErrorCode.INVALID_RANGE, "nothing there")
            return
        ids = next((f for f in req.params.range_filters
                    if f.key == (ParameterType.OBJECTID_FILTER, 0, None)), None)
        chosen = [o for o in self.objects
                  if o.status == ObjectStatus.NORMAL and rng.contains(o.location)
                  and (ids is None or ids.matches(o.object_id))]
        if req.group_order == GroupOrder.DESCENDING:
            chosen.sort(key=lambda o: (-o.group, o.object_id))
        end = min(rng.end, self.largest) if rng.end is not None else self.largest
        w = await req.accept(False, end)
        for o in chosen:
            await w.write_object(o.group, 0, o.object_id, self.priority, o.payload)
        await w.finish()


@asynccontextmanager
async def served_by(handler: SessionHandler, tls: Path, *, transport: str = "quic",
                    config: SessionConfig | None = None,
                    client_config: SessionConfig | None = None) -> AsyncIterator[MoqtSession]:
    """A client session to a server on 127.0.0.1 whose sessions ``handler`` answers
    (``tls``: the folder of cert.pem and key.pem; ``config`` is the server sessions')."""

    async def on_conn(conn):  # type: ignore[no-untyped-def]
        s = await MoqtSession.start(conn, config, handler)
        await s.wait_closed()

    server = await serve("127.0.0.1", 0, tls / "cert.pem", tls / "key.pem", on_conn,
                         application=MOQT)
    url = f"moqt://127.0.0.1:{server.port}/" if transport == "quic" else \
        f"https://127.0.0.1:{server.port}/moq"
    try:
        client = await asyncio.wait_for(
            open_session(url, ca_file=tls / "cert.pem", config=client_config), TIMEOUT)
        try:
            yield client
        finally:
            await client.aclose()
    finally:
        await server.close()


__all__ = ["TIMEOUT", "LocationFilterType", "Obj", "TrackPublisher", "served_by"]
