"""The Original Publisher (MOQT-PROFILE 15.1): push a PublicationPlan to one or more relays.

Order on each relay: PUBLISH of every track of the publication, then PUBLISH_NAMESPACE, then
the Objects in production order. The tracks go first because NAMESPACE is what tells
consumers the publication exists: a consumer that SUBSCRIBEs as soon as it hears of it must
find the tracks at the relay, not race a PUBLISH still in flight. While connected, the
publisher answers the relays' FETCHes (and SUBSCRIBEs of ended Tracks) from what it wrote
(15.1 step 6, ``serving``): a relay that evicted Groups before its LMDB commit gets them
again.

Data plane per track and Group: one subgroup stream (Subgroup 0, priority floor(128 g / L)),
Objects in order, End of Group at {g, N}, FIN; after the last Group End of Track alone on
its own stream at {L, 0}, then PUBLISH_DONE (TRACK_ENDED). The manifest track follows the
same rules with one Object per Group.

Confirmation: ``confirm="fetch"`` (default) FETCHes every track back from every relay once
production ends and compares the SHA-256 of each Object with what was sent, so success means
the relay holds every Object bit for bit. ``"status"`` only checks with TRACK_STATUS that each
track's Largest Object is its End of Track location (cheap, but blind to gaps); ``"none"``
trusts QUIC.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from relay.kvcs.namespace import KvcsNamespace
from relay.kvcs.plan import PlannedObject, PublicationPlan
from relay.moqt.codes import ObjectStatus, RequestErrorCode
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import Location
from relay.session import (
    MoqtSession,
    PublishedNamespace,
    ReceivedObject,
    RequestRejected,
    ServedSubscription,
    SessionFailure,
    SubgroupWriter,
)
from relay.transport import TransportError

from .connect import RelayAccess, connect
from .errors import PeerError, Unauthorized, Unconfirmed
from .serving import PublishedTracks

REQUEST_TIMEOUT = 10.0
CONFIRM_MODES = ("fetch", "status", "none")
STATUS_POLL = 0.05  # TRACK_STATUS re-check interval while the relay catches up


@dataclass
class PublishOptions:
    layer_ms: float = 0.0  # emulated prefill time per layer, before the layer is published
    confirm: str = "fetch"
    confirm_timeout: float = 60.0
    # Keep the namespace announced (and the sessions open) until this event is set, e.g. so
    # that consumers can still discover the publication; None = leave once confirmed.
    hold: asyncio.Event | None = None
    confirmed: asyncio.Event | None = None  # set once every relay confirmed every Object
    # Called after the last Object of each data layer was handed to QUIC: (segment, layer).
    on_layer: Callable[[int, int], Awaitable[None] | None] | None = None


@dataclass
class PublishSummary:
    namespace: KvcsNamespace
    relays: list[str]
    tracks: dict[str, int] = field(default_factory=dict)  # Objects per track
    objects: int = 0
    bytes: int = 0
    segments: int = 0
    layers: int = 0
    elapsed_s: float = 0.0
    confirmed: str = "none"

    def to_json(self) -> dict[str, object]:
        from .inputs import format_namespace

        return {"namespace": format_namespace(self.namespace), "relays": self.relays,
                "tracks": self.tracks, "objects": self.objects, "bytes": self.bytes,
                "segments": self.segments, "layers": self.layers,
                "elapsed_s": round(self.elapsed_s, 4), "confirmed": self.confirmed}


class RelayPush:
    """Our PUBLISHed tracks on one relay and the subgroup stream currently open per track."""

    def __init__(self, url: str, session: MoqtSession) -> None:
        self.url = url
        self.session = session
        self.served: dict[str, ServedSubscription] = {}
        self.open: dict[str, tuple[int, SubgroupWriter]] = {}
        self.announced: PublishedNamespace | None = None
        self.last_problem = ""

    async def start(self, ns: KvcsNamespace, tracks: list[str]) -> None:
        for name in tracks:
            self.served[name] = await asyncio.wait_for(
                self.session.publish(ns.fields, name.encode()), REQUEST_TIMEOUT)
        self.announced = await asyncio.wait_for(
            self.session.publish_namespace(ns.fields), REQUEST_TIMEOUT)

    async def write(self, obj: PlannedObject) -> None:
        served = self.served[obj.track]
        current = self.open.get(obj.track)
        if current is None or current[0] != obj.group:
            w = await served.open_subgroup(obj.group, obj.subgroup, obj.priority)
            self.open[obj.track] = current = (obj.group, w)
        w = current[1]
        await w.write_object(obj.object_id, obj.payload)
        if obj.ends_group:
            await w.write_status(obj.object_id + 1, ObjectStatus.END_OF_GROUP, fin=True)
            del self.open[obj.track]
        if obj.ends_track:
            end = await served.open_subgroup(obj.group + 1, 0, obj.priority)
            await end.write_status(0, ObjectStatus.END_OF_TRACK, fin=True)
            await served.done()


async def publish_plan(plan: PublicationPlan, access: RelayAccess,
                       options: PublishOptions | None = None) -> PublishSummary:
    """Publish ``plan`` to every relay of ``access`` (all of them get the same Objects)."""
    opts = options or PublishOptions()
    if opts.confirm not in CONFIRM_MODES:
        raise PeerError(f"confirm must be one of {', '.join(CONFIRM_MODES)}")
    if not access.urls:
        raise PeerError("no relay given")
    started = time.monotonic()
    pushes: list[RelayPush] = []
    written = PublishedTracks()
    try:
        for url in access.urls:
            pushes.append(RelayPush(url, await connect(url, access, written)))
        tracks = [plan.manifest_track] + [t for s in plan.segments
                                          for t in plan.track_names(s.segment)]
        for p in pushes:
            await _guarded(p.url, p.start(plan.namespace, tracks))
        summary = PublishSummary(plan.namespace, list(access.urls),
                                 segments=len(plan.segments), layers=plan.descriptor.layers)
        sent = await _produce(plan, pushes, opts, summary, written)
        if opts.confirm != "none":
            await asyncio.wait_for(
                asyncio.gather(*(_confirm(p, plan.namespace, sent, opts.confirm)
                                 for p in pushes)), opts.confirm_timeout)
        summary.confirmed = opts.confirm
        summary.elapsed_s = time.monotonic() - started
        if opts.confirmed is not None:
            opts.confirmed.set()
        if opts.hold is not None:
            await opts.hold.wait()
        return summary
    except TimeoutError:
        problems = "; ".join(f"{p.url}: {p.last_problem}" for p in pushes if p.last_problem)
        raise Unconfirmed(f"relays did not confirm every Object within "
                          f"{opts.confirm_timeout:g} s ({problems})") from None
    finally:
        for p in pushes:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(p.session.aclose(), 5.0)


async def _guarded(url: str, aw: Awaitable[None]) -> None:
    try:
        await aw
    except RequestRejected as e:
        if e.code == RequestErrorCode.UNAUTHORIZED:
            raise Unauthorized(f"relay {url}: not authorized to publish ({e}); check --token"
                               ) from None
        raise PeerError(f"relay {url}: {e}") from None
    except (SessionFailure, TransportError) as e:
        raise PeerError(f"relay {url}: {e}") from None


async def _produce(plan: PublicationPlan, pushes: list[RelayPush], opts: PublishOptions,
                   summary: PublishSummary, written: PublishedTracks
                   ) -> dict[str, dict[Location, bytes]]:
    """Write every Object to every relay; return the SHA-256 of each, per track."""
    sent: dict[str, dict[Location, bytes]] = {}
    layer: tuple[int, int] | None = None
    for obj in plan:
        if obj.track != plan.manifest_track:
            key = (int(obj.track.rsplit(".s", 1)[1]), obj.group)
            if key != layer:
                if layer is not None:
                    await _layer_done(opts, layer)
                layer = key
                if opts.layer_ms > 0:
                    await asyncio.sleep(opts.layer_ms / 1000)  # emulated compute time
        written.wrote(plan.namespace.fields, obj)  # served from here on (15.1 step 6)
        for p in pushes:
            await _guarded(p.url, p.write(obj))
        sent.setdefault(obj.track, {})[Location(obj.group, obj.object_id)] = \
            hashlib.sha256(obj.payload).digest()
        summary.tracks[obj.track] = summary.tracks.get(obj.track, 0) + 1
        summary.objects += 1
        summary.bytes += len(obj.payload)
    if layer is not None:
        await _layer_done(opts, layer)
    return sent


async def _layer_done(opts: PublishOptions, layer: tuple[int, int]) -> None:
    if opts.on_layer is not None:
        result = opts.on_layer(*layer)
        if result is not None:
            await result


async def _confirm(push: RelayPush, ns: KvcsNamespace, sent: dict[str, dict[Location, bytes]],
                   mode: str) -> None:
    for track, objects in sent.items():
        end = Location(max(loc.group for loc in objects) + 1, 0)  # End of Track
        if mode == "status":
            await _confirm_status(push, ns, track, end)
        else:
            await _confirm_fetch(push, ns, track, objects, end)


async def _confirm_status(push: RelayPush, ns: KvcsNamespace, track: str, end: Location
                          ) -> None:
    while True:
        try:
            ok = await push.session.track_status(ns.fields, track.encode())
            largest = ok.params.largest_object
            if largest == end:
                return
            problem = f"TRACK_STATUS says Largest Object {largest}, End of Track is {end}"
        except SessionFailure as e:
            if push.session.closed:
                raise PeerError(f"relay {push.url}: {e}") from None
            problem = f"TRACK_STATUS refused: {e}"
        # what the timeout's message names: a relay that never confirms says why
        push.last_problem = f"{track}: {problem}"
        await asyncio.sleep(STATUS_POLL)  # no event to wait for: the relay is polled


async def _confirm_fetch(push: RelayPush, ns: KvcsNamespace, track: str,
                         objects: dict[Location, bytes], end: Location) -> None:
    # A relay may still be draining its receive queue when PUBLISH_DONE was processed, and
    # then answers with a reset (UNKNOWN_OBJECT_STATUS) or a short response: ask again,
    # backing off, until it holds everything or the caller's confirm timeout ends it.
    delay = 0.02
    while True:
        try:
            resp = await push.session.fetch(ns.fields, track.encode(), Params(
                location_filter=LocationFilter.absolute_start(0, 0)))
            got = {e.location: hashlib.sha256(e.payload).digest()
                   async for e in resp if isinstance(e, ReceivedObject)}
            if got == objects and resp.end_of_track and resp.end_location == end:
                return
            problem = (f"FETCH answered to {resp.end_location} "
                       f"{'with' if resp.end_of_track else 'without'} End of Track (at {end}): "
                       f"{len(set(objects) - set(got))} Objects missing, "
                       f"{sum(1 for loc, d in got.items() if objects.get(loc) != d)} differ")
        except (SessionFailure, TransportError) as e:
            if push.session.closed:
                raise Unconfirmed(f"relay {push.url}: confirming {track}: {e}") from None
            problem = str(e)
        push.last_problem = f"{track}: {problem}"
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
