"""/metrics, /healthz and /readyz of an in-process relay, and docs/metrics.md as the
contract: counters move by exactly what a publish/subscribe/fetch round did."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import sys
from pathlib import Path

import pytest
from ops_http import http_get
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as om_families,
)
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from relay_helpers import (
    TIMEOUT,
    client,
    drain,
    group_payloads,
    make_ns,
    push_track,
)

from relay.core.relay import RelayOptions
from relay.moqt.primitives import FullTrackName
from relay.service import RelayConfig, RunningRelay, start_relay
from relay.session import RequestRejected
from storage.interface import Tier

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
OM = "application/openmetrics-text; version=1.0.0"


async def _relay(tmp: Path, **kw: object) -> RunningRelay:
    cfg = RelayConfig(listen_port=0, data_dir=tmp, memory_bytes=64 << 20, lmdb_bytes=64 << 20,
                      metrics_listen=("127.0.0.1", 0), options=RelayOptions(), **kw)  # type: ignore[arg-type]
    return await start_relay(cfg)


async def scrape(r: RunningRelay) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    assert r.metrics_port is not None
    code, body = await http_get(r.metrics_port, "/metrics")
    assert code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body) for s in fam.samples}


def val(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
        **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


async def wait_until(r: RunningRelay, cond: object) -> dict:  # type: ignore[type-arg]
    """Scrape until ``cond(metrics)`` holds (bounded)."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            m = await scrape(r)
            if cond(m):  # type: ignore[operator]
                return m
            await asyncio.sleep(0.02)  # polling the HTTP endpoint, bounded by the deadline


async def test_counters_move_by_exactly_what_a_round_did(tmp_path: Path) -> None:
    r = await _relay(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        before = await scrape(r)
        assert val(before, "kvcs_relay_objects_received_total") == 0
        pub = await client(r)
        track = await push_track(pub, name, layers=3)
        sub = await client(r)
        live = await asyncio.wait_for(sub.subscribe(name.namespace, name.name), TIMEOUT)
        m = await scrape(r)
        assert val(m, "kvcs_relay_subscriptions_active") == 1
        assert val(m, "kvcs_relay_sessions_open", transport="quic") == 2
        for g in range(3):
            await track.group(g, group_payloads(g, 4))
        await track.end()
        async with asyncio.timeout(TIMEOUT):
            got = await drain(live)
        assert got.objects == track.sent
        assert await r.relay.wait_committed(name, TIMEOUT)
        resp = await asyncio.wait_for(sub.fetch(name.namespace, name.name), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            fetched = await resp.collect()
        assert len(fetched) == 12
        pushed_bytes = sum(len(p) for p in track.sent.values())

        m = await wait_until(r, lambda m: val(m, "kvcs_relay_fetches_active") == 0 and
                             val(m, "kvcs_relay_subscriptions_active") == 0)
        assert val(m, "kvcs_relay_objects_received_total") == 12
        assert val(m, "kvcs_relay_received_bytes_total") == pushed_bytes
        assert val(m, "kvcs_relay_objects_sent_total", path="subscription") == 12
        assert val(m, "kvcs_relay_sent_bytes_total", path="subscription") == pushed_bytes
        assert val(m, "kvcs_relay_objects_sent_total", path="fetch") == 12
        assert val(m, "kvcs_relay_sent_bytes_total", path="fetch") == pushed_bytes
        assert val(m, "kvcs_relay_cache_hits_total", op="fetch", tier="memory") == 12
        assert val(m, "kvcs_relay_cache_hits_total", op="fetch", tier="lmdb") == 0
        assert val(m, "kvcs_relay_cache_misses_total", op="fetch") == 0
        assert val(m, "kvcs_relay_lmdb_committed_tracks_total") == 1
        assert val(m, "kvcs_relay_lmdb_committed_bytes_total") >= pushed_bytes
        assert val(m, "kvcs_relay_lmdb_tracks") == 1
        assert val(m, "kvcs_relay_fetch_duration_seconds_count") == 1
        assert val(m, "kvcs_relay_sessions_accepted_total", transport="quic") == 2
        for t in ("publish_namespace", "publish", "subscribe", "fetch"):
            assert val(m, "kvcs_relay_requests_total", type=t, result="ok") == 1, t
        assert val(m, "kvcs_relay_subscriber_backlog_bytes_gcount") == 0

        await pub.aclose()
        await sub.aclose()
        m = await wait_until(r, lambda m: val(m, "kvcs_relay_sessions_open",
                                              transport="quic") == 0)
        assert val(m, "kvcs_relay_sessions_closed_total", transport="quic",
                   code="no_error") == 2
    finally:
        await r.close()


async def test_a_close_code_the_spec_does_not_define_counts_as_internal_error(
        tmp_path: Path) -> None:
    """A peer's close code is counted by its meaning: an unknown one (here a GREASE code)
    is INTERNAL_ERROR, as the spec reads it and as docs/metrics.md says."""
    r = await _relay(tmp_path)
    try:
        s = await client(r)
        s.close(0x7F * 3 + 0x9D, "grease")
        m = await wait_until(r, lambda m: val(m, "kvcs_relay_sessions_open",
                                              transport="quic") == 0)
        closed = {dict(k[1])["code"]: v for k, v in m.items()
                  if k[0] == "kvcs_relay_sessions_closed_total"}
        assert closed == {"internal_error": 1}
    finally:
        await r.close()


async def test_refused_requests_count_by_code_and_as_authorization_failures(
        tmp_path: Path) -> None:
    r = await _relay(tmp_path, auth_tokens=[{"token": "pub-secret", "prefixes": ["kvcs-1"],
                                             "roles": ["publish", "subscribe"]}])
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        sub = await client(r)
        for _ in range(2):
            with pytest.raises(RequestRejected):
                await asyncio.wait_for(sub.subscribe(name.namespace, name.name), TIMEOUT)
        m = await scrape(r)
        assert val(m, "kvcs_relay_authorization_failures_total") == 2
        assert val(m, "kvcs_relay_requests_total", type="subscribe", result="unauthorized") == 2
        await sub.aclose()
    finally:
        await r.close()


async def test_health_and_readiness(tmp_path: Path) -> None:
    r = await _relay(tmp_path)
    try:
        assert r.metrics_port is not None
        assert await http_get(r.metrics_port, "/healthz") == (200, "ok\n")
        assert await http_get(r.metrics_port, "/readyz") == (200, "ready\n")
        assert (await http_get(r.metrics_port, "/nope"))[0] == 404
        await r.relay.goaway_all()  # draining: alive, no longer ready
        code, body = await http_get(r.metrics_port, "/readyz")
        assert (code, body.strip()) == (503, "draining")
        assert (await http_get(r.metrics_port, "/healthz"))[0] == 200
    finally:
        await r.close()
    # an upstream that does not answer: not ready
    r = await _relay(tmp_path / "b", upstream=["moqt://127.0.0.1:9/"], upstream_insecure=True,
                     upstream_idle_timeout=0.5)  # bounds each dial: none is ever answered
    try:
        assert r.metrics_port is not None
        code, body = await http_get(r.metrics_port, "/readyz")
        assert code == 503 and "upstream unreachable" in body
    finally:
        await r.close()


def _documented() -> dict[str, tuple[str, set[str]]]:
    rows: dict[str, tuple[str, set[str]]] = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*`(kvcs_relay_\w+)`\s*\|\s*(\w+)\s*\|([^|]*)\|", line)
        if m:
            labels = set(re.findall(r"`(\w+)`", m.group(3))) - {"le"}
            rows[m.group(1)] = (m.group(2), labels)
    return rows


async def test_docs_metrics_is_the_contract(tmp_path: Path) -> None:
    r = await _relay(tmp_path)
    try:
        assert r.metrics_port is not None
        code, body = await http_get(r.metrics_port, "/metrics", accept=OM)
        assert code == 200
        exposed: dict[str, tuple[str, set[str]]] = {}
        for fam in om_families(body):
            name = fam.name + "_total" if fam.type == "counter" else fam.name
            labels = {k for s in fam.samples for k in s.labels} - {"le"}
            exposed[name] = (fam.type, labels)
        # An empty labelled family exposes no sample, so its labels are checked when present.
        documented = _documented()
        assert set(exposed) == set(documented)
        for name, (mtype, labels) in exposed.items():
            assert mtype == documented[name][0], name
            assert labels <= documented[name][1], name
        for name in exposed:  # conventions
            assert name.startswith("kvcs_relay_")
    finally:
        await r.close()


async def test_every_counter_the_relay_keeps_is_exported(tmp_path: Path) -> None:
    """Each field of the relay's Counters reaches /metrics: give every count a value of its
    own and find each value in a sample (a count kept but never exported fails here)."""
    r = await _relay(tmp_path)
    try:
        c = r.relay.counters
        wanted: dict[str, int] = {}
        for i, f in enumerate(dataclasses.fields(c)):
            value = 1_000_003 + 7919 * i
            if isinstance(getattr(c, f.name), int):
                setattr(c, f.name, value)
                wanted[f.name] = value
        base = 1_000_003 + 7919 * len(dataclasses.fields(c))
        c.sessions_accepted["quic"] = wanted["sessions_accepted"] = base
        c.sessions_closed[("quic", 0)] = wanted["sessions_closed"] = base + 1
        c.requests[("FETCH", None)] = wanted["requests"] = base + 2
        for k, served in enumerate((c.fill, c.fetch)):
            n = base + 10 * (k + 1)
            served.bytes, served.upstream_lookups, served.unknown_ranges = n, n + 1, n + 2
            served.objects[Tier.MEMORY], served.objects[Tier.LMDB] = n + 3, n + 4
            wanted.update({f"{k}.bytes": n, f"{k}.lookups": n + 1, f"{k}.unknown": n + 2,
                           f"{k}.memory": n + 3, f"{k}.lmdb": n + 4})
        exported = set((await scrape(r)).values())
        assert {name for name, v in wanted.items() if v not in exported} == set()
    finally:
        await r.close()
