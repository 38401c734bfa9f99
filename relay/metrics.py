"""Prometheus metrics and health endpoints on a separate HTTP listener.

Almost everything is read at scrape time from state the relay keeps anyway (``Relay.counters``,
its sessions and tracks, the stores' ``stats()``), so the data path pays nothing for metrics.
Only the two latency histograms are observed as requests end (``Counters.observe``).

Each relay has its own ``CollectorRegistry``, so several relays in one process (the tests)
never clash. The HTTP server runs on the relay's event loop, not in a thread: the collector
reads the relay's dicts and sets without locks, which is only safe from the loop itself.

Label values are bounded by construction: transport names, message type names, spec error
code names (a code the spec does not define: by its meaning, INTERNAL_ERROR), tiers and
operations — never a namespace, track name or token.
The contract (every name, type, label and unit) is docs/metrics.md; a test holds the two
together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import exposition as _expo
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.openmetrics import exposition as _om
from prometheus_client.registry import Collector

from relay.admin import PREFIX as ADMIN_PREFIX
from relay.http import Answer, Listener, text
from relay.moqt.codes import SessionErrorCode, request_error_meaning
from storage.interface import Tier

if TYPE_CHECKING:
    from relay.admin import AdminApi
    from relay.core.counters import Counters
    from relay.core.relay import Relay
    from storage.tiered import TieredStore

log = logging.getLogger("kvcs.metrics")

P = "kvcs_relay_"
TRANSPORTS = ("quic", "webtransport")
OPS = ("fill", "fetch")
# Per-subscriber backlog buckets (bytes queued, not yet written): 64 KiB … 256 MiB, the
# default TOO_FAR_BEHIND bound.
BACKLOG_BUCKETS = tuple(float(1 << s) for s in range(16, 29, 2))
# Fill and FETCH durations: a few ms from memory up to the default FILL_TIMEOUT and beyond.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)


LINKS = ("upstream", "sibling", "lower_relay", "client")


def request_streams_metric(relay: Relay) -> Metric:
    """Request streams per kind of link and direction (``out``: this relay's requests,
    bounded by what the peers grant; ``in``: the peers', bounded by what this relay grants),
    in use and granted, summed over the sessions of that kind."""
    g = GaugeMetricFamily(P + "request_streams", "Request (bidirectional) streams open and "
                          "granted, by kind of link, direction and state.",
                          labels=["link", "direction", "state"])
    sums = {(k, d, st): 0 for k in LINKS for d in ("out", "in") for st in ("in_use",
                                                                         "granted")}
    for kind, session in relay.links():
        rs = session.request_streams()
        for d, used, granted in (("out", rs.out_in_use, rs.out_granted),
                                 ("in", rs.in_in_use, rs.in_granted)):
            sums[kind, d, "in_use"] += used
            sums[kind, d, "granted"] += granted
    for labels, value in sums.items():
        g.add_metric(list(labels), value)
    return g


class RelayCollector(Collector):
    """Reads a Relay's counters and state when scraped."""

    def __init__(self, relay: Relay, store: TieredStore) -> None:
        self.relay = relay
        self.store = store

    def collect(self) -> Iterator[Metric]:
        relay = self.relay
        c = relay.counters
        yield from self._sessions(c)
        yield from self._requests(c)

        g = GaugeMetricFamily(P + "subscriptions_active",
                              "Downstream subscriptions being served.")
        g.add_metric([], sum(len(t.forwarders) for t in list(relay.tracks.values())))
        yield g
        for key, doc, served in (("fills_active", "Fills being served from the cache.", c.fill),
                                 ("fetches_active", "FETCHes being served from the cache.",
                                  c.fetch)):
            g = GaugeMetricFamily(P + key, doc)
            g.add_metric([], served.in_flight.count)
            yield g
        g = GaugeMetricFamily(P + "tracks", "Tracks the relay knows (cached or live).")
        g.add_metric([], len(relay.tracks))
        yield g

        yield _counter("objects_received", "Objects received from publishers and upstream "
                       "subscriptions.", c.objects_received)
        yield _counter("received_bytes", "Payload bytes of the Objects received.",
                       c.bytes_received)
        sent = CounterMetricFamily(P + "objects_sent", "Objects sent downstream, by path.",
                                   labels=["path"])
        sent_b = CounterMetricFamily(P + "sent_bytes", "Payload bytes sent downstream, by path.",
                                     labels=["path"])
        sent.add_metric(["subscription"], c.objects_sent)
        sent_b.add_metric(["subscription"], c.bytes_sent)
        for op, served in (("fill", c.fill), ("fetch", c.fetch)):
            sent.add_metric([op], sum(served.objects.values()))
            sent_b.add_metric([op], served.bytes)
        yield sent
        yield sent_b

        hits = CounterMetricFamily(P + "cache_hits", "Objects of fills and FETCHes served "
                                   "from a cache tier.", labels=["op", "tier"])
        misses = CounterMetricFamily(P + "cache_misses", "Ranges of fills and FETCHes no "
                                     "tier held, looked up upstream.", labels=["op"])
        unknown = CounterMetricFamily(P + "unknown_ranges", "Ranges of fills and FETCHes "
                                      "reported unknown or timed out.", labels=["op"])
        for op, served in (("fill", c.fill), ("fetch", c.fetch)):
            for tier in (Tier.MEMORY, Tier.LMDB):
                hits.add_metric([op, tier.name.lower()], served.objects[tier])
            misses.add_metric([op], served.upstream_lookups)
            unknown.add_metric([op], served.unknown_ranges)
        yield hits
        yield misses
        yield unknown

        yield _counter("upstream_subscriptions", "Subscriptions the relay made to publishers "
                       "or upstream relays.", c.upstream_subscriptions)
        yield _counter("upstream_fetches", "FETCHes the relay sent to publishers or upstream "
                       "relays (after coalescing).", c.upstream_fetches)
        yield _counter("upstream_fetched_objects", "Objects received by upstream FETCHes.",
                       c.upstream_fetched_objects)
        up = relay.upstream
        g = GaugeMetricFamily(P + "upstream_connected",
                              "1 while an upstream relay session is open.")
        g.add_metric([], 1 if up is not None and up.session is not None else 0)
        yield g
        yield _counter("upstream_sessions_lost", "Upstream relay sessions that ended without "
                       "the relay closing them (e.g. idle timeout: the upstream died).",
                       up.lost if up is not None else 0)
        ann = relay.announcer
        g = GaugeMetricFamily(P + "upstream_announcements",
                              "Namespace prefixes announced to the upstream relay now.")
        g.add_metric([], len(ann.announced) if ann is not None else 0)
        yield g
        yield _counter("upstream_announcements_refused", "PUBLISH_NAMESPACE the upstream "
                       "relay refused (served locally).",
                       c.upstream_announcements_refused)
        yield _counter("upstream_announcements_uncovered", "Namespaces not announced: the "
                       "upstream token does not cover them.",
                       c.upstream_announcements_uncovered)
        yield _counter("upstream_announcements_retried", "PUBLISH_NAMESPACE sent again to "
                       "the upstream relay after one failed (no answer in time).",
                       c.upstream_announcements_retried)
        held = relay.routing.upstream_namespaces
        g = GaugeMetricFamily(P + "upstream_namespace_subscriptions",
                              "SUBSCRIBE_NAMESPACE held at the upstream relay now, for "
                              "this relay's own listeners.")
        g.add_metric([], len(held.held) if held is not None else 0)
        yield g
        yield _counter("upstream_namespace_subscriptions_frozen", "SUBSCRIBE_NAMESPACE held "
                       "at the upstream relay released early to make room (its listeners "
                       "keep what it announced).", held.frozen if held is not None else 0)
        yield request_streams_metric(relay)
        g = GaugeMetricFamily(P + "sibling_links", "Sessions open to this relay's sibling "
                              "workers and peer relays (its own links to them).")
        g.add_metric([], sum(1 for s in list(relay.siblings) if not s.closed))
        yield g
        yield _counter("upstream_pushes", "Tracks pushed to the upstream relay (PUBLISH).",
                       c.upstream_pushes)
        yield _counter("upstream_pushes_failed", "Pushes to the upstream relay that could "
                       "not start.", c.upstream_pushes_failed)
        yield _counter("upstream_unreachable", "Requests refused with TIMEOUT because the "
                       "upstream relay was unreachable or did not answer in time.",
                       c.upstream_unreachable)
        yield _counter("upstream_loops", "Upstream relay sessions refused because they "
                       "lead back to this relay (a relay loop).", c.upstream_loops)

        yield from self._storage(c)
        yield from self._scopes()
        yield _counter("sessions_refused", "Sessions refused at once because max_sessions "
                       "were open.", c.sessions_refused)

        buckets, total = _backlog_buckets(relay)
        yield GaugeHistogramMetricFamily(
            P + "subscriber_backlog_bytes", "Bytes queued per downstream subscription, "
            "not yet written (distribution at scrape time).", buckets=buckets,
            gsum_value=total)
        yield _counter("too_far_behind", "Subscriptions ended as too far behind.",
                       c.too_far_behind)
        yield _counter("ingest_waits", "Times a Track's ingest waited for its least-behind "
                       "subscriber to drain (ingest_hold_bytes).", c.ingest_waits)
        yield _counter("ingest_wait_seconds", "Seconds Tracks' ingest spent waiting for "
                       "their subscribers to drain.", c.ingest_wait_seconds)
        yield _counter("authorization_failures", "Requests refused for want of a valid "
                       "token.", c.auth_failures)
        yield admin_unauthorized_metric(c.admin_unauthorized)
        yield _counter("admin_purged_tracks", "Tracks removed by admin purges.",
                       c.admin_purged_tracks)
        g = GaugeMetricFamily(P + "draining", "1 once GOAWAY was sent to every session.")
        g.add_metric([], 1 if relay.draining else 0)
        yield g

    def _sessions(self, c: Counters) -> Iterator[Metric]:
        open_ = GaugeMetricFamily(P + "sessions_open", "MOQT sessions open.",
                                  labels=["transport"])
        counts = dict.fromkeys(TRANSPORTS, 0)
        for s in list(self.relay.sessions):
            t = getattr(s.conn, "transport", "quic")
            counts[t] = counts.get(t, 0) + 1
        for t, n in counts.items():
            open_.add_metric([t], n)
        yield open_
        acc = CounterMetricFamily(P + "sessions_accepted", "MOQT sessions set up.",
                                  labels=["transport"])
        for t in TRANSPORTS:
            acc.add_metric([t], c.sessions_accepted.get(t, 0))
        yield acc
        closed = CounterMetricFamily(P + "sessions_closed", "MOQT sessions closed, by "
                                     "transport and session close code.",
                                     labels=["transport", "code"])
        for (t, code), n in sorted(c.sessions_closed.items()):
            # keys are known codes (Counters.session_closed gives each its meaning)
            closed.add_metric([t, SessionErrorCode(code).name.lower()], n)
        yield closed

    def _requests(self, c: Counters) -> Iterator[Metric]:
        fam = CounterMetricFamily(P + "requests", "Requests received, by message type and "
                                  "result (ok or the REQUEST_ERROR code name).",
                                  labels=["type", "result"])
        merged: dict[tuple[str, str], int] = {}
        for (mtype, code), n in list(c.requests.items()):
            result = "ok" if code is None else request_error_meaning(code).name.lower()
            k = (mtype.lower(), result)
            merged[k] = merged.get(k, 0) + n
        for (mtype, result), n in sorted(merged.items()):
            fam.add_metric([mtype, result], n)
        yield fam

    def _storage(self, c: Counters) -> Iterator[Metric]:
        stats = self.store.stats()
        mem = stats["memory"]
        lm = stats.get("lmdb")
        used = GaugeMetricFamily(P + "stored_bytes", "Bytes held per cache tier.",
                                 labels=["tier"])
        cap = GaugeMetricFamily(P + "capacity_bytes", "Byte bound per cache tier.",
                                labels=["tier"])
        ev = CounterMetricFamily(P + "evictions", "Evictions per tier (memory evicts "
                                 "Groups, LMDB whole Tracks).", labels=["tier"])
        ev_b = CounterMetricFamily(P + "evicted_bytes", "Bytes evicted per tier.",
                                   labels=["tier"])
        used.add_metric(["memory"], mem["bytes_used"])
        cap.add_metric(["memory"], mem["capacity"])
        ev.add_metric(["memory"], mem["evicted_groups"])
        ev_b.add_metric(["memory"], mem["evicted_bytes"])
        if lm is not None:
            used.add_metric(["lmdb"], lm["bytes_used"])
            cap.add_metric(["lmdb"], lm["capacity"])
            ev.add_metric(["lmdb"], lm["evicted_tracks"])
        yield from (used, cap, ev, ev_b)
        g = GaugeMetricFamily(P + "lmdb_tracks", "Tracks held in LMDB.")
        g.add_metric([], lm["tracks"] if lm is not None else 0)
        yield g
        g = GaugeMetricFamily(P + "lmdb_commits_waiting", "Complete Tracks waiting to be "
                              "written to LMDB (write-behind: for a quiet moment, at most "
                              "lmdb_commit_delay) or being written.")
        g.add_metric([], self.relay.persistence.waiting)
        yield g
        yield _counter("lmdb_committed_tracks", "Complete Tracks committed to LMDB.",
                       c.lmdb_committed_tracks)
        yield _counter("lmdb_committed_bytes", "Bytes committed to LMDB.",
                       c.lmdb_committed_bytes)
        yield _counter("lmdb_full", "Commit attempts refused because LMDB was full (the "
                       "Track stays in memory; the commit is retried unless the Track "
                       "exceeds the capacity).", c.lmdb_full)
        yield _counter("lmdb_expired_tracks", "Tracks removed from LMDB because their age "
                       "passed lmdb_max_age or their MAX_CACHE_DURATION.",
                       c.lmdb_expired_tracks)


    def _scopes(self) -> Iterator[Metric]:
        """Per-scope bytes, quotas and evictions. Only scopes with a quota of their own
        get a label value (their Scope ID in hex); all others are summed as "other"."""
        held = GaugeMetricFamily(P + "scope_stored_bytes", "Bytes held per scope and tier.",
                                 labels=["scope", "tier"])
        quota = GaugeMetricFamily(P + "scope_quota_bytes", "Byte quota per scope and tier "
                                  "(other: the default, per scope).", labels=["scope", "tier"])
        ev = CounterMetricFamily(P + "scope_evictions", "Evictions per scope and tier "
                                 "(memory: Groups, LMDB: Tracks).", labels=["scope", "tier"])
        tiers = [("memory", self.store.memory)]
        if self.store.durable is not None:
            tiers.append(("lmdb", self.store.durable))  # type: ignore[arg-type]
        for tier, t in tiers:
            q = t.quotas
            if q is None:
                continue
            named = set(q.overrides)
            for fam, values in ((held, t.scopes.held), (ev, t.scopes.evictions)):
                sums: dict[str, int] = {"other": 0}
                for scope, n in list(values.items()):
                    label = scope.hex() if scope in named else "other"
                    sums[label] = sums.get(label, 0) + n
                for label in sorted(named):
                    sums.setdefault(label.hex(), 0)
                for label, n in sorted(sums.items()):
                    fam.add_metric([label, tier], n)
            for scope in sorted(named):
                lim = q.limit(scope, tier)
                if lim is not None:
                    quota.add_metric([scope.hex(), tier], lim)
            lim = q.default(tier)
            if lim is not None:
                quota.add_metric(["other", tier], lim)
        yield from (held, quota, ev)


def admin_unauthorized_metric(value: int) -> CounterMetricFamily:
    """Admin API refusals: a relay's own, and with ``--workers`` also the supervisor's (its
    listener refuses a request without the token before any worker sees it), which it
    merges into the workers' family of the same name (relay/merge.py)."""
    return _counter("admin_unauthorized", "Admin API requests refused for a missing or "
                    "wrong token.", value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(P + name, doc, value=value)


def _backlog_buckets(relay: Relay) -> tuple[list[tuple[str, float]], float]:
    """Cumulative buckets and the sum of every live subscription's backlog."""
    backlogs = [f.backlog for t in list(relay.tracks.values()) for f in list(t.forwarders)]
    out = [(str(b), float(sum(1 for x in backlogs if x <= b))) for b in BACKLOG_BUCKETS]
    out.append(("+Inf", float(len(backlogs))))
    return out, float(sum(backlogs))


class RelayMetrics:
    """The per-relay registry: the collector plus the latency histograms."""

    def __init__(self, relay: Relay, store: TieredStore) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(RelayCollector(relay, store))
        for op in OPS:
            h = Histogram(P + f"{op}_duration_seconds",
                          f"Time to serve a {op} from the cache, from accept to the last "
                          "Object written.", buckets=LATENCY_BUCKETS, registry=self.registry)
            getattr(relay.counters, op).observe = h.observe

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition for an ``Accept`` header (OpenMetrics when asked for)."""
        if "application/openmetrics-text" in accept:
            return _om.generate_latest(self.registry), _om.CONTENT_TYPE_LATEST
        return _expo.generate_latest(self.registry), _expo.CONTENT_TYPE_LATEST


ReadyCheck = Callable[[], Awaitable[list[str]]]


class MetricsServer:
    """The relay's HTTP listener, on its loop: /metrics, /healthz, /readyz, and /admin/."""

    def __init__(self, metrics: RelayMetrics, ready: ReadyCheck,
                 admin: AdminApi | None = None) -> None:
        self.metrics = metrics
        self.ready = ready
        self.admin = admin  # None: /admin/ is off (404)
        self._listener = Listener(self._route, "metrics listener", self._head_too_large)

    async def start(self, host: str, port: int) -> None:
        await self._listener.start(host, port)

    @property
    def address(self) -> tuple[str, int]:
        return self._listener.address

    @property
    def port(self) -> int:
        return self.address[1]

    async def close(self) -> None:
        await self._listener.close()

    def _head_too_large(self, method: str, path: str) -> None:
        """On /admin/ a 431 is also a request refused without a token we could check:
        counted and logged as the other refusals are."""
        if self.admin is not None and path.startswith(ADMIN_PREFIX):
            self.admin.note_refused(method, path, "request head too large")

    async def _route(self, method: str, path: str, headers: dict[str, str],
                     reader: asyncio.StreamReader) -> Answer:
        if path.startswith(ADMIN_PREFIX):
            if self.admin is None:  # off: as if it did not exist
                return text(404, "not found")
            return await self.admin.route(method, path, headers, reader)
        if not path or method not in ("GET", "HEAD"):
            return text(405, "method not allowed")
        if path == "/metrics":
            body, ctype = self.metrics.render(headers.get("accept", ""))
            return 200, ctype, body
        if path == "/healthz":
            return text(200, "ok")
        if path == "/readyz":
            problems = await self.ready()
            if problems:
                return text(503, "\n".join(problems))
            return text(200, "ready")
        return text(404, "not found")


__all__ = ["MetricsServer", "ReadyCheck", "RelayCollector", "RelayMetrics",
           "admin_unauthorized_metric"]
