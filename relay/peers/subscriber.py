"""The End Subscriber (kvcs-draft 5, MOQT-PROFILE 15.2): find a publication of the prompt's
longest prefix, retrieve it live or completed, verify everything, recover, and stop in time.

Order of attempts: relays in the order given; on each, the publications named by the caller
(an index record) and then those found by discovery, longest prefix first. The first
publication whose manifest verifies is the primary. If blocks are still missing afterwards
(invalid Objects, reset streams, unknown ranges, a stall), recovery tries the same
publication on the other relays, then the other publications; a publication is mixed into a
partly received segment only if both manifests say "deterministic": true, otherwise that
segment starts over. Recovery is bounded by the time recomputation would take:
``recompute_ms_per_layer`` x the number of layers still missing, from the moment recovery
starts, but never less than a retry needs on this path (``recovery_rtts`` round trips, the
shortest request round trip seen, and at least ``recovery_floor``); past that the consumer
gives up and reports which layers to recompute.

A publication still being produced is not a failure to recover from: ``kvcs fetch`` FETCHes
what the relay holds, and if the manifest track has not ended (or has no version yet) it
follows the rest live, as ``kvcs subscribe`` does, within the deadline. Recovery starts
only once production has ended, stalled (``stall_timeout``) or its publisher is gone.

Nothing found is "no publication" (exit 3) only if every relay could look: a relay that
answers REQUEST_ERROR TIMEOUT could not reach its upstream (an edge whose origin is dead),
and then the consumer says so (exit 9). Discovery cannot tell (SUBSCRIBE_NAMESPACE is
accepted before the relay asks upstream), so after a discovery that found nothing the
consumer asks that relay one FETCH under the prompt's longest prefix, which the relay must
look up upstream.

Two more bounds: ``deadline`` (seconds from the start, ``--deadline-ms``) ends the whole
retrieval, discovery and recovery included, with what is usable by then (a "hit but late"
is reported as layers to recompute, never waited out); and with ``require_cose`` an Object
is used only once a verified signed manifest version lists its digest, so the retrieval
waits (bounded) for that version, and what no version listed is reported as unverified.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relay.kvcs.cose import KeyStore
from relay.kvcs.descriptor import Descriptor
from relay.kvcs.errors import KvcsError
from relay.kvcs.identifiers import block_keys, scope_id
from relay.kvcs.namespace import KvcsNamespace, content_prefix
from relay.kvcs.track_names import MANIFEST_COSE
from relay.moqt.codes import RequestErrorCode, SessionErrorCode
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.session import MoqtSession, RequestRejected, SessionClosed, SessionFailure
from relay.transport import TransportError

from .completed import PublicationGone, fetch_manifest, retrieve_completed
from .connect import RelayAccess, connect
from .discovery import Candidate, discover
from .errors import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_REFUSED,
    EXIT_UNVERIFIED,
    NotFound,
    PeerError,
    Unauthorized,
    UpstreamUnreachable,
)
from .live import LiveRetrieval, await_listing
from .report import build_report
from .state import RetrievalState, Tamper, Target
from .verification import ManifestRefused, ManifestVerifier

MODES = ("live", "completed")
# Recovery gets at least this many round trips of the path (a retry on another relay costs a
# handshake and SETUP, then the FETCH and its data) ...
RECOVERY_RTTS = 10.0
# ... and at least this long: on loopback a round trip is well under a millisecond, while a
# retry still costs the host's own work (a FETCH served, Objects verified).
RECOVERY_FLOOR = 0.25


@dataclass
class RetrieveOptions:
    access: RelayAccess
    descriptor: Descriptor
    scope_key: bytes
    tokens: Sequence[int]
    mode: str = "completed"
    codec: str = "raw"
    joint: bool = False
    require_cose: bool = False
    keys: KeyStore | None = None
    progress: Callable[[RetrievalState], None] | None = None  # called as Objects arrive
    # Publications known from elsewhere (a KVSP Index record): namespace and, if the record
    # says so, how many leading blocks it shares with the prompt.
    publications: Sequence[tuple[KvcsNamespace, int | None]] = ()
    max_blocks: int | None = None
    recompute_ms_per_layer: float = 50.0
    recovery_rtts: float = RECOVERY_RTTS
    recovery_floor: float = RECOVERY_FLOOR  # seconds
    discovery_window: float = 0.5
    stall_timeout: float = 10.0
    deadline: float | None = None  # seconds for the whole retrieval; None: unbounded
    # QUIC connections per relay that FETCH layers (split across them): a loss-based
    # congestion controller's rate falls with loss per connection, so N of them on a lossy
    # path move about N times as much (docs/deployment.md)
    connections: int = 1
    tamper: Tamper | None = None
    # Called in a thread with the result while the sessions close (e.g. writing the output
    # file): a closing client waits out QUIC's closing period, which need not delay it.
    deliver: Callable[[Retrieval], None] | None = None
    # Allocates the retrieval's K and V, given their shape (RetrievalState.allocate).
    allocate: Callable[[tuple[int, int, int, int]], tuple[np.ndarray, np.ndarray]] | None = None


@dataclass
class Retrieval:
    k: np.ndarray
    v: np.ndarray
    tokens: list[int]
    report: dict[str, Any]
    exit_code: int
    recompute_layers: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        # Short on purpose: asyncio.run() formats its finished main task, result included,
        # twice as it puts SIGINT's handler back (signal's enum conversion of the old
        # handler); the arrays' and the report's repr cost about 0.1 s at the end of every
        # 64 MiB `kvcs fetch`.
        return (f"Retrieval(exit_code={self.exit_code}, k={self.k.shape}, v={self.v.shape}, "
                f"tokens={len(self.tokens)}, recompute_layers={self.recompute_layers})")


class _Sessions:
    def __init__(self, access: RelayAccess) -> None:
        self.access = access
        self.open: dict[str, MoqtSession] = {}
        self.extra: dict[str, list[MoqtSession]] = {}  # --connections beyond the first
        # every connection made, in order, numbered per relay for the report ("url#n"); held
        # to the end so that a number (keyed by id) never passes to a later session
        self.made: list[MoqtSession] = []
        self._numbers: dict[int, str] = {}
        self._count: dict[str, int] = {}
        self.failed: dict[str, str] = {}
        # relays that refused this command's requests as UNAUTHORIZED (url -> reason)
        self.denied: dict[str, str] = {}
        # relays that answered TIMEOUT: they could not reach their upstream (url -> reason)
        self.unreachable: dict[str, str] = {}

    async def get(self, url: str) -> MoqtSession | None:
        s = self.open.get(url)
        if s is not None and not s.closed:
            return s
        if url in self.failed:
            return None
        try:
            s = self.open[url] = await self._connect(url)
        except PeerError as e:
            self.failed[url] = str(e)
            return None
        return s

    def broken(self) -> dict[str, str]:
        """Relays whose session ended with an error code (a protocol violation either side
        found, the relay closing it): what they did not answer is unknown, not absent."""
        out = {}
        for url, s in self.open.items():
            info = s.close_info
            if s.closed and info is not None and info[0] != SessionErrorCode.NO_ERROR:
                out[url] = str(SessionClosed(*info))
        return out

    async def fetching(self, url: str, session: MoqtSession, n: int) -> list[MoqtSession]:
        """``session`` and up to ``n - 1`` more connections to ``url`` for FETCHes (fewer
        if some cannot be made: the FETCHes then share those that exist)."""
        extra = [s for s in self.extra.get(url, []) if not s.closed]
        while len(extra) < n - 1:
            try:
                extra.append(await self._connect(url))
            except PeerError:
                break
        self.extra[url] = extra
        return [session, *extra]

    async def _connect(self, url: str) -> MoqtSession:
        s = await connect(url, self.access)
        n = self._count[url] = self._count.get(url, -1) + 1
        self._numbers[id(s)] = f"{url}#{n}"
        self.made.append(s)
        return s

    def label(self, s: MoqtSession) -> str:
        return self._numbers.get(id(s), "?")

    async def close(self) -> None:
        # drain=0: a consumer has nothing in flight worth waiting for (its requests are
        # answered or abandoned), and the wait for the last ACKs delays the caller's output.
        await asyncio.gather(*(asyncio.wait_for(s.aclose(drain=0), 5.0) for s in self.made),
                             return_exceptions=True)


async def retrieve(opts: RetrieveOptions) -> Retrieval:
    if opts.mode not in MODES:
        raise PeerError(f"mode must be one of {', '.join(MODES)}")
    d = opts.descriptor
    keys = block_keys(opts.scope_key, d.compat_id, list(opts.tokens), d.block_tokens)
    if opts.max_blocks is not None:
        keys = keys[:opts.max_blocks]
    if not keys:
        raise NotFound("the prompt is shorter than one block: nothing can be reused")
    trusted = max((n for _, n in opts.publications if n is not None), default=None)
    state = RetrievalState(d, keys, opts.codec, opts.joint, opts.tamper, trusted,
                           require_listed=opts.require_cose)
    state.on_progress = opts.progress
    state.allocate = opts.allocate
    if opts.deadline is not None:
        state.deadline = state.t0 + opts.deadline
    sessions = _Sessions(opts.access)
    refusals: list[str] = []
    found: list[tuple[str, Candidate]] = []
    try:
        async with asyncio.timeout(opts.deadline):
            primary_url = await _primary(opts, state, sessions, keys, refusals, found)
            if not state.targets:
                if sessions.failed and len(sessions.failed) == len(opts.access.urls):
                    raise PeerError("; ".join(sessions.failed.values()))
                if sessions.denied:
                    raise Unauthorized("; ".join(f"relay {u}: not authorized ({r})" for u, r
                                                 in sessions.denied.items()) +
                                       "; check --token")
                if refusals:
                    raise ManifestRefused("; ".join(dict.fromkeys(refusals)))
                if sessions.unreachable:
                    raise UpstreamUnreachable(
                        "the relay's upstream is unreachable (" +
                        "; ".join(f"relay {u}: {r}" for u, r in sessions.unreachable.items()) +
                        "); whether a publication exists is unknown: retry later or use "
                        "another relay")
                broken = sessions.broken()
                if broken and len(broken) + len(sessions.failed) == len(opts.access.urls):
                    # e.g. a relay that broke the session (issue 36: aiomoqt's relay ended
                    # a fill with an End of Range marker our parser rejects), not "not found"
                    raise PeerError("; ".join(f"relay {u}: {r}" for u, r in broken.items()))
                raise NotFound("no publication of this prompt's prefix on any relay")
            if not state.complete:
                await _recover(opts, state, sessions, found, primary_url)
    except TimeoutError:
        state.deadline_passed = True
        state.decide("deadline", missing_layers=state.missing_layers())
    except BaseException as e:
        if isinstance(e, PeerError):  # its --report: what was tried before nothing came of it
            e.report = build_report(state, opts.mode, state.missing_layers(), e.exit_code)
        await sessions.close()
        raise
    result = _result(opts, state, refusals)
    closing = asyncio.ensure_future(sessions.close())  # never raises
    try:
        if opts.deliver is not None:
            await asyncio.to_thread(opts.deliver, result)
    finally:
        await closing
    return result


async def _primary(opts: RetrieveOptions, state: RetrievalState, sessions: _Sessions,
                   keys: list[bytes], refusals: list[str],
                   found: list[tuple[str, Candidate]]) -> str | None:
    d = opts.descriptor
    explicit = [Candidate(ns, n if n is not None else 0, "index")
                for ns, n in opts.publications]
    for url in opts.access.urls:
        session = await sessions.get(url)
        if session is None:
            state.decide("relay-unreachable", relay=url, error=sessions.failed.get(url, ""))
            continue
        # Publications named by an index first; discovery only if none of them serves.
        found.extend((url, c) for c in explicit)
        if await _try_candidates(opts, state, sessions, url, explicit, refusals):
            return url
        candidates: list[Candidate] = []
        denied: list[str] = []
        with contextlib.suppress(SessionFailure, TransportError):
            candidates = await discover(session, scope_id(opts.scope_key), d.compat_id, keys,
                                        window=opts.discovery_window, denied=denied)
        if denied and not candidates:
            sessions.denied[url] = denied[0]
        elif not candidates:
            await _probe_upstream(opts, state, session, url, keys, sessions)
        found.extend((url, c) for c in candidates)
        if await _try_candidates(opts, state, sessions, url, candidates, refusals):
            return url
    return None


async def _try_candidates(opts: RetrieveOptions, state: RetrievalState, sessions: _Sessions,
                          url: str, candidates: list[Candidate], refusals: list[str]) -> bool:
    session = sessions.open[url]
    for cand in candidates:
        state.decide("try-publication", relay=url, via=cand.via,
                     prefix_blocks=cand.blocks, pub_id=cand.namespace.pub_id.hex())
        try:
            await _attempt(opts, state, sessions, session, url, cand.namespace, None)
        except ManifestRefused as e:
            refusals.append(str(e))
            state.decide("publication-refused", relay=url, reason=str(e))
            _drop_publication(state)
            continue
        except (PublicationGone, SessionFailure, TransportError, KvcsError) as e:
            state.decide("attempt-failed", relay=url, error=str(e))
            if isinstance(e, RequestRejected) and e.code == RequestErrorCode.UNAUTHORIZED:
                sessions.denied[url] = str(e)
            if isinstance(e, RequestRejected) and e.code == RequestErrorCode.TIMEOUT:
                sessions.unreachable[url] = str(e)
            if not state.targets:
                _drop_publication(state)
                continue
        if state.targets:
            return True
    return False


async def _probe_upstream(opts: RetrieveOptions, state: RetrievalState, session: MoqtSession,
                          url: str, keys: list[bytes], sessions: _Sessions) -> None:
    """Discovery found nothing on ``url``: is that because the relay could not look?
    One FETCH under the prompt's longest prefix (no publication's namespace, so the relay
    holds nothing of it and must ask upstream, within FILL_TIMEOUT = the time left): a relay
    answers TIMEOUT when its upstream is unreachable (TIMEOUT, never DOES_NOT_EXIST, for
    what only the upstream could answer); anything else leaves "nothing found" as it is.
    (FETCH rather than TRACK_STATUS: the relay decides a FETCH's refusal after its dial
    to the upstream has failed, so the first request of an outage is answered right too.)"""
    d = opts.descriptor
    prefix = content_prefix(scope_id(opts.scope_key), d.compat_id, keys[-1])
    with contextlib.suppress(SessionFailure, TransportError):
        try:
            resp = await session.fetch(prefix, MANIFEST_COSE.encode(), Params(
                location_filter=LocationFilter.relative_start(1),
                fill_timeout=state.fill_timeout_ms()))
        except RequestRejected as e:
            if e.code == RequestErrorCode.TIMEOUT:
                sessions.unreachable[url] = str(e)
            return
        resp.cancel()  # not expected: there is no such Track; nothing of it is wanted


def _drop_publication(state: RetrievalState) -> None:
    state.targets.clear()
    state.unlisted.clear()
    state.namespace = state.verifier = None


async def _attempt(opts: RetrieveOptions, state: RetrievalState, sessions: _Sessions,
                   session: MoqtSession, url: str, ns: KvcsNamespace,
                   layers: list[int] | None) -> None:
    """One retrieval of publication ``ns`` from one relay into ``state``.

    ``kvcs subscribe`` follows production live, then FETCHes what its subscriptions did not
    bring. ``kvcs fetch`` FETCHes what the relay holds, and if production is not over (the
    manifest track has not ended, or holds no version yet) it follows the rest live too:
    the layers still to come are on their way, and recomputing them would throw away what
    the deadline still allows (issue 26)."""
    if state.namespace != ns:
        _switch(opts, state, ns)
    if opts.mode == "completed":
        try:
            await _fetch_held(opts, state, sessions, session, url, layers, listing=False)
        except PublicationGone:
            if state.manifest is not None:
                raise  # a relay that lacks what another one served: recovery goes on
            # Announced, but no manifest version here yet: production may have just begun.
            state.decide("no-manifest-yet", relay=url)
        if state.complete or state.manifest_final:
            return  # recovery, if anything is missing: production is over
        state.decide("follow-production", relay=url, missing_layers=state.missing_layers())
    try:
        await LiveRetrieval(session, url, state, opts.stall_timeout).run()
    except PublicationGone:
        state.decide("publication-not-live", relay=url)
        if opts.mode == "completed":
            if state.manifest is None:
                raise  # neither held nor produced here
            return  # what the relay holds was FETCHed just before
    if state.complete:
        return
    # The subscriptions ended short of the cache (production over, stalled, or a relay that
    # ended them early): what is still missing is FETCHed, as for a completed cache.
    state.decide("fetch-after-live", relay=url)
    await _fetch_held(opts, state, sessions, session, url,
                      state.missing_layers() if state.targets else None, listing=True)


async def _fetch_held(opts: RetrieveOptions, state: RetrievalState, sessions: _Sessions,
                      session: MoqtSession, url: str, layers: list[int] | None, *,
                      listing: bool) -> None:
    """FETCH the manifest (unless final) and the wanted layers the relay holds. ``listing``:
    with --require-cose, then follow the manifest (bounded) until it lists what came."""
    if state.manifest is None or not state.manifest_final:
        await fetch_manifest(session, state)
    # no more connections than slices: a retry of two layers needs two, not --connections
    n = min(opts.connections, len(layers) if layers else state.descriptor.layers)
    fetching = [session] if n <= 1 else await sessions.fetching(url, session, n)
    # when the layers' FETCHes go out: what follows is the transfer (the report's times
    # before it are connecting, discovery and the manifest)
    state.decide("fetch-layers", relay=url, connections=len(fetching))
    await retrieve_completed(fetching, url, state, layers,
                             [sessions.label(s) for s in fetching])
    if listing and state.unverified_layers() and not state.manifest_final:
        left = state.remaining()
        await await_listing(session, url, state,
                            opts.stall_timeout if left is None else min(left, opts.stall_timeout))


def _switch(opts: RetrieveOptions, state: RetrievalState, ns: KvcsNamespace) -> None:
    """Make ``ns`` the current publication. Partly received segments are kept only if both
    publications turn out deterministic (checked when the new manifest arrives)."""
    previous = state.manifest
    state.use_publication(ns, ManifestVerifier(ns, opts.descriptor, keys=opts.keys,
                                               require_cose=opts.require_cose))
    if previous is None:
        return
    for seg, t in list(state.targets.items()):
        if not t.reasm.complete and not previous.deterministic:
            # 5.4: a segment never mixes non-deterministic publications: start it over.
            state.targets[seg] = Target(t.entry, t.blocks, t.tracks, state.reassembler(
                previous, t.entry, t.tracks, t.blocks), ns.pub_id)
            state.decide("segment-restarted", segment=seg)


def recovery_budget(missing_layers: int, recompute_ms_per_layer: float, rtt: float | None, *,
                    rtts: float = RECOVERY_RTTS, floor: float = RECOVERY_FLOOR) -> float:
    """Seconds recovery may take: as long as recomputing the missing layers would
    (kvcs-draft 5.4), but never less than a retry needs on this path, ``rtts`` round trips
    and at least ``floor``. A fixed per-layer figure alone is a few round trips on a real
    network: recovery would give up before its first retry could answer."""
    path = max(floor, rtts * (rtt or 0.0))
    return max(recompute_ms_per_layer * missing_layers / 1000, path)


async def _recover(opts: RetrieveOptions, state: RetrievalState, sessions: _Sessions,
                   found: list[tuple[str, Candidate]], primary_url: str | None) -> None:
    missing = state.missing_layers()
    budget = recovery_budget(len(missing), opts.recompute_ms_per_layer, state.rtt,
                             rtts=opts.recovery_rtts, floor=opts.recovery_floor)
    deadline = time.monotonic() + budget
    state.decide("recovery-start", missing_layers=missing, budget_ms=round(budget * 1000, 1),
                 rtt_ms=None if state.rtt is None else round(state.rtt * 1000, 3))
    primary = state.namespace
    assert primary is not None
    order: list[tuple[str, KvcsNamespace]] = [(u, primary) for u in opts.access.urls]
    order += [(u, c.namespace) for u, c in found if c.namespace != primary]
    # The primary relay just failed to deliver these blocks (a cache serves the same bytes
    # again): it comes last, for transient failures.
    if primary_url is not None and len(opts.access.urls) > 1:
        order.remove((primary_url, primary))
        order.append((primary_url, primary))
    seen: set[tuple[str, bytes]] = set()
    for url, ns in order:
        if state.complete:
            break
        if (url, ns.pub_id) in seen:
            continue
        seen.add((url, ns.pub_id))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            state.decide("recovery-deadline", missing_layers=state.missing_layers())
            break
        session = await sessions.get(url)
        if session is None:
            continue
        state.retries += 1
        state.decide("retry", relay=url, pub_id=ns.pub_id.hex(),
                     missing_layers=state.missing_layers())
        try:
            async with asyncio.timeout(remaining):
                await _attempt(opts, state, sessions, session, url, ns,
                               state.missing_layers())
        except TimeoutError:
            state.decide("recovery-deadline", missing_layers=state.missing_layers())
            break
        except (PeerError, SessionFailure, TransportError, KvcsError) as e:
            state.decide("retry-failed", relay=url, error=str(e))


def _result(opts: RetrieveOptions, state: RetrievalState, refusals: list[str]) -> Retrieval:
    k, v = state.arrays()
    missing = state.missing_layers()
    reused = state.reused_blocks() * opts.descriptor.block_tokens
    code = EXIT_OK if not missing else EXIT_PARTIAL
    if state.unverified_objects():
        code = EXIT_UNVERIFIED
    if not state.targets:
        # Past the deadline nothing is known to be absent: recompute everything.
        code = EXIT_PARTIAL if state.deadline_passed else \
            EXIT_REFUSED if refusals else EXIT_NOT_FOUND
    for g in missing:
        state.decide("recompute", layer=g)
    report = build_report(state, opts.mode, missing, code)
    return Retrieval(k, v, list(opts.tokens[:reused]), report, code, missing)
