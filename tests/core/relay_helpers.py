"""Shared pieces of the relay tests: an in-process relay on 127.0.0.1 with LMDB in a temp
dir, and a test publisher that pushes a Track with PUBLISH."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from relay.core.relay import RelayOptions
from relay.moqt.codes import ObjectStatus
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location
from relay.service import RelayConfig, RunningRelay, start_relay
from relay.session import (
    FetchResponse,
    MoqtSession,
    NamespaceEvent,
    ReceivedObject,
    ServedSubscription,
    SessionHandler,
    Source,
    StreamEnded,
    Subscription,
    SubscriptionDone,
    open_session,
)
from relay.session.wire import MOQT
from relay.transport import Connection, Server, ensure_self_signed, serve

TIMEOUT = 15.0


def make_ns(tag: bytes = b"") -> tuple[bytes, ...]:
    return (b"kvcs-1", os.urandom(32), os.urandom(32), os.urandom(32) + tag, os.urandom(16))


async def relay_at(data_dir: Path, *, upstream: Sequence[str] = (), port: int = 0,
                   options: RelayOptions | None = None, memory_bytes: int = 256 << 20,
                   auth_tokens: list[dict[str, object]] | None = None,
                   send_buffer_bytes: int = 1 << 20, lmdb_bytes: int = 256 << 20,
                   lmdb_max_age: float | None = None,
                   clock: Callable[[], float] = time.time, upstream_token: bytes | None = None,
                   upstream_announce_fields: int = 1,
                   upstream_idle_timeout: float = RelayConfig.upstream_idle_timeout,
                   peer: Sequence[str] = (), peer_token: bytes | None = None,
                   max_datagram_size: int = RelayConfig.max_datagram_size
                   ) -> RunningRelay:
    """``upstream_idle_timeout`` also bounds each dial: a test whose upstream never answers
    gives a short one instead of waiting out the default at every dial."""
    cfg = RelayConfig(send_buffer_bytes=send_buffer_bytes, listen_port=port,
                      data_dir=data_dir, upstream=list(upstream), upstream_insecure=True,
                      peer=list(peer), peer_insecure=True, peer_token=peer_token,
                      memory_bytes=memory_bytes, lmdb_max_age=lmdb_max_age, clock=clock,
                      lmdb_bytes=lmdb_bytes, options=options or RelayOptions(),
                      auth_tokens=auth_tokens or [], upstream_token=upstream_token,
                      upstream_announce_fields=upstream_announce_fields,
                      upstream_idle_timeout=upstream_idle_timeout,
                      max_datagram_size=max_datagram_size)
    return await start_relay(cfg)


async def client(r: RunningRelay, *, wt: bool = False, **kw: object) -> MoqtSession:
    url = r.wt_url if wt else r.url
    return await asyncio.wait_for(open_session(url, ca_file=r.certfile, **kw), TIMEOUT)  # type: ignore[arg-type]


async def serve_peer(tls_dir: Path, handler: SessionHandler) -> Server:
    """A stand-in MOQT peer on 127.0.0.1 (an upstream relay, say) whose every session answers
    with ``handler``; its URL is ``moqt://127.0.0.1:<port>/``."""

    async def on_conn(conn: Connection) -> None:
        s = await MoqtSession.start(conn, None, handler)
        await s.wait_closed()

    tls = ensure_self_signed(tls_dir)
    return await serve("127.0.0.1", 0, tls.certfile, tls.keyfile, on_conn, application=MOQT)


def group_payloads(group: int, n: int, size: int = 2000) -> list[bytes]:
    return [os.urandom(size) + bytes([group % 256, i % 256]) for i in range(n)]


@dataclass
class PushedTrack:
    """A Track pushed to a relay with PUBLISH, written group by group."""

    session: MoqtSession
    served: ServedSubscription
    full_name: FullTrackName
    layers: int
    sent: dict[Location, bytes] = field(default_factory=dict)

    def priority(self, g: int) -> int:
        return (128 * g) // self.layers

    async def group(self, g: int, payloads: list[bytes]) -> None:
        w = await self.served.open_subgroup(g, 0, self.priority(g))
        for i, p in enumerate(payloads):
            await w.write_object(i, p)
            self.sent[Location(g, i)] = p
        await w.write_status(len(payloads), ObjectStatus.END_OF_GROUP, fin=True)

    async def end(self) -> None:
        w = await self.served.open_subgroup(self.layers, 0, 128)
        await w.write_status(0, ObjectStatus.END_OF_TRACK, fin=True)
        await self.served.done()


async def push_track(session: MoqtSession, full_name: FullTrackName, layers: int,
                     announce: bool = True, properties: tuple[object, ...] = ()
                     ) -> PushedTrack:
    if announce:
        await asyncio.wait_for(session.publish_namespace(full_name.namespace), TIMEOUT)
    served = await asyncio.wait_for(session.publish(full_name.namespace, full_name.name,
                                                    properties=properties), TIMEOUT)
    return PushedTrack(session, served, full_name, layers)


async def complete_track(session: MoqtSession, full_name: FullTrackName, layers: int,
                         per_group: int, size: int = 2000) -> PushedTrack:
    """A whole Track pushed with PUBLISH: ``layers`` Groups of ``per_group`` Objects, then
    End of Track."""
    t = await push_track(session, full_name, layers)
    for g in range(layers):
        await t.group(g, group_payloads(g, per_group, size))
    await t.end()
    return t


def live_params() -> Params:
    """KVCS live retrieval (kvcs-draft 5.2): Next Object + fill from {0,0}."""
    return Params(location_filter=LocationFilter.next_object(),
                  fill=Params(location_filter=LocationFilter.absolute_start(0, 0)))


@dataclass
class Received:
    objects: dict[Location, bytes] = field(default_factory=dict)
    duplicates: list[Location] = field(default_factory=list)
    statuses: dict[Location, int] = field(default_factory=dict)
    done: SubscriptionDone | None = None
    resets: list[int] = field(default_factory=list)


async def drain(sub: Subscription, until_end_of_track: bool = True) -> Received:
    """Collect a subscription until PUBLISH_DONE (every Object checked for duplicates)."""
    got = Received()
    async for ev in sub:
        if isinstance(ev, ReceivedObject):
            if ev.status != ObjectStatus.NORMAL:
                got.statuses[ev.location] = ev.status
            elif ev.location in got.objects:
                got.duplicates.append(ev.location)
            else:
                got.objects[ev.location] = bytes(ev.payload)
        elif isinstance(ev, StreamEnded):
            if not ev.fin:
                got.resets.append(ev.reset_code or 0)
        elif isinstance(ev, SubscriptionDone):
            got.done = ev
    return got


async def fill_objects(sub: Subscription) -> list[tuple[Location, bytes]]:
    """The Objects of ``sub``'s fill stream, in the order they came, until its FIN."""
    got: list[tuple[Location, bytes]] = []
    async with asyncio.timeout(TIMEOUT):
        async for ev in sub:
            if isinstance(ev, ReceivedObject) and ev.stream.source is Source.FILL:
                got.append((ev.location, bytes(ev.payload)))
            elif isinstance(ev, StreamEnded) and ev.stream.source is Source.FILL:
                assert ev.fin, ev
                return got
    raise AssertionError("the subscription ended before its fill")


async def wait_cached(running: RunningRelay, name: FullTrackName, loc: Location) -> None:
    """Until the relay's Largest Object for ``name`` reaches ``loc`` (event-driven)."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            track = running.relay.tracks.get(name)
            if track is not None and (track.largest() or Location(0, 0)) >= loc:
                return
            if track is None:
                await asyncio.sleep(0)
            else:
                await track.wait_change(TIMEOUT)


async def fetch_objects(session: MoqtSession, name: FullTrackName, params: Params | None = None
                        ) -> tuple[FetchResponse, dict[Location, bytes]]:
    """FETCH the whole Track: the response (FETCH_OK fields) and its Objects by Location."""
    resp = await asyncio.wait_for(session.fetch(name.namespace, name.name, params), TIMEOUT)
    async with asyncio.timeout(TIMEOUT):
        return resp, {e.location: bytes(e.payload) for e in await resp.collect()}


async def wait_namespace(s: MoqtSession, namespace: tuple[bytes, ...]) -> None:
    """Until the relay announces ``namespace`` to ``s`` (discovery, as a consumer does)."""
    nsub = await asyncio.wait_for(s.subscribe_namespace(namespace[:1]), TIMEOUT)
    async with asyncio.timeout(TIMEOUT):
        async for ev in nsub:
            if isinstance(ev, NamespaceEvent) and ev.active and ev.namespace == namespace:
                break
    nsub.cancel()
