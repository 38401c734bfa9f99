"""Issue 26: the consumer against a publication that is still arriving, and against a relay
that cannot reach its upstream, on real relays on 127.0.0.1.

- ``kvcs fetch`` that finds a publication still being produced follows the rest live
  instead of recomputing it: every layer, bit for bit, exit 0.
- Recovery is given at least a few round trips of the path, never a fixed few hundred ms.
- Nothing found because the relay's upstream is unreachable is reported as such (exit 9),
  not as "no publication" (exit 3).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_harness import free_udp_port, run_kvcs
from peers_helpers import SCOPE_KEY, TIMEOUT, Cache, access, cache, plan, relay_at
from tampering import publish_gated, wait_cached

from relay.core.handler import RelayHandler
from relay.kvcs.identifiers import write_scope_key
from relay.kvcs.kvfile import read_kvfile
from relay.kvcs.plan import PlannedObject, PublicationPlan
from relay.moqt.primitives import FullTrackName, Location
from relay.peers.errors import EXIT_NOT_FOUND, EXIT_OK, EXIT_UNREACHABLE
from relay.peers.inputs import format_namespace
from relay.peers.subscriber import RetrieveOptions, recovery_budget, retrieve
from relay.service import RunningRelay

LAYERS = 8
# Production is held here, in the middle of a layer: k.raw.s0 has written blocks 0-1 of
# layer 3, v.raw.s0 layers 0-2.
PAUSE_AT = (3, 2)


@pytest.fixture
async def relay(tmp_path: Path) -> Any:
    r = await relay_at(tmp_path / "r1")
    yield r
    await r.close()


def _on_request(monkeypatch: pytest.MonkeyPatch, method: str,
                match: Callable[[Any], bool] = lambda req: True) -> asyncio.Event:
    """An event set when an in-process relay receives a ``RelayHandler.<method>`` request
    that ``match``es; the request is then served as ever."""
    seen = asyncio.Event()
    serve = getattr(RelayHandler, method)

    async def recording(self: RelayHandler, req: Any) -> None:
        if match(req):
            seen.set()
        await serve(self, req)

    monkeypatch.setattr(RelayHandler, method, recording)
    return seen


def _data_subscribed(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set once a consumer SUBSCRIBEs to a data track: it follows the production live."""
    return _on_request(monkeypatch, "subscribe",
                       lambda req: not req.full_name.name.startswith(b"manifest"))


def _held_before(p: PublicationPlan, release: asyncio.Event,
                 paused: asyncio.Event | None = None) -> Callable[[PlannedObject], Any]:
    """Gate of ``publish_gated``: PAUSE_AT and later wait for ``release``. It is set
    only once the consumer follows the production live (or the consumer has finished):
    a consumer that gives up on a publication still arriving finishes with layers missing
    instead of winning a race against the publisher."""
    def gate(obj: PlannedObject) -> Any:
        if obj.track != p.manifest_track and (obj.group, obj.object_id) >= PAUSE_AT:
            if paused is not None:
                paused.set()
            return asyncio.wait_for(release.wait(), TIMEOUT)
        return None
    return gate


async def test_fetch_of_a_publication_mid_production_follows_the_rest_live(
        relay: RunningRelay, monkeypatch: pytest.MonkeyPatch) -> None:
    c = cache(blocks=4, layers=LAYERS)
    p = plan(c)
    release, paused, leave = _data_subscribed(monkeypatch), asyncio.Event(), asyncio.Event()
    pub = asyncio.ensure_future(publish_gated(p, access(relay), _held_before(p, release, paused),
                                              leave))
    try:
        await asyncio.wait_for(paused.wait(), TIMEOUT)
        for track, last in (("k.raw.s0", Location(3, 1)), ("v.raw.s0", Location(2, 3))):
            await wait_cached(relay, FullTrackName(p.namespace.fields, track.encode()), last)
        res = await asyncio.wait_for(retrieve(RetrieveOptions(
            access(relay), c.descriptor, SCOPE_KEY, c.tokens, mode="completed",
            publications=[(p.namespace, None)], deadline=TIMEOUT / 2)), TIMEOUT)
    finally:
        release.set()
        leave.set()
        await asyncio.wait_for(pub, TIMEOUT)
    rep = res.report
    assert res.exit_code == EXIT_OK, rep["decisions"]
    assert res.recompute_layers == [] and not rep["deadline_passed"]
    assert np.array_equal(res.k, c.k) and np.array_equal(res.v, c.v)
    assert rep["objects_verified"] == 4 * LAYERS * 2
    # the live part starts at the first block the FETCH did not bring: nothing twice
    assert rep["objects_duplicate"] == 0, rep["decisions"]
    assert any(d["action"] == "follow-production" for d in rep["decisions"])
    assert not any(d["action"] == "recovery-start" for d in rep["decisions"])


def _consumer_files(c: Cache, tmp: Path) -> dict[str, Path]:
    files = {"descriptor": tmp / "desc.json", "tokens": tmp / "tokens.json",
             "key": tmp / "scope.key", "out": tmp / "out.kv", "report": tmp / "report.json"}
    files["descriptor"].write_bytes(c.descriptor.canonical_json())
    files["tokens"].write_text(json.dumps(c.tokens))
    write_scope_key(files["key"], SCOPE_KEY)
    return files


def _fetch_args(r: RunningRelay, files: dict[str, Path], *extra: str) -> list[str]:
    return ["fetch", "--relay", r.url, "--ca", str(r.certfile), "--quiet",
            "--scope-key", str(files["key"]),
            *(a for name in ("descriptor", "tokens", "out", "report")
              for a in (f"--{name}", str(files[name]))), *extra]


async def test_kvcs_fetch_started_before_the_publisher_gets_every_layer(
        relay: RunningRelay, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    c = cache(blocks=4, layers=LAYERS)
    p = plan(c)
    looking = _on_request(monkeypatch, "subscribe_namespace")
    release, leave = _data_subscribed(monkeypatch), asyncio.Event()
    files = _consumer_files(c, tmp_path)
    # the command: discovery waits for the publication, a generous deadline
    consumer = asyncio.ensure_future(run_kvcs(
        *_fetch_args(relay, files, "--wait-ms", "10000", "--deadline-ms", "60000"),
        timeout=TIMEOUT))
    pub: asyncio.Future[None] | None = None
    try:
        await asyncio.wait_for(looking.wait(), TIMEOUT)  # the consumer is waiting for it
        pub = asyncio.ensure_future(publish_gated(p, access(relay), _held_before(p, release),
                                                  leave))
        code, _, err = await consumer
    finally:
        release.set()
        leave.set()
        if not consumer.done():
            consumer.cancel()
        if pub is not None:
            await asyncio.wait_for(pub, TIMEOUT)
    assert "Traceback" not in err
    rep = json.loads(files["report"].read_text())
    assert code == EXIT_OK, (err, rep["decisions"])
    assert rep["recompute_layers"] == [] and rep["objects_verified"] == 4 * LAYERS * 2
    out = read_kvfile(files["out"])
    assert np.array_equal(np.asarray(out.k), c.k) and np.array_equal(np.asarray(out.v), c.v)


def test_recovery_is_given_round_trips_of_the_path_not_a_fixed_few_hundred_ms() -> None:
    # 7 layers at 50 ms each would be 350 ms: a few round trips of a 100 ms path
    assert recovery_budget(7, 50.0, 0.1) >= 10 * 0.1
    assert recovery_budget(7, 50.0, 0.3) >= 10 * 0.3
    # on loopback the per-layer figure still rules, and nothing is below the floor
    assert recovery_budget(7, 50.0, 0.0002) == pytest.approx(0.35)
    assert recovery_budget(1, 0.0, None) == pytest.approx(0.25)
    assert recovery_budget(1, 0.0, 0.0001) == pytest.approx(0.25)


@pytest.mark.parametrize("via", ["discovery", "index"])
async def test_fetch_through_a_relay_whose_upstream_is_dead_says_so(
        tmp_path: Path, via: str) -> None:
    dead = f"moqt://127.0.0.1:{free_udp_port()}/"  # nothing listens there
    # each dial gives up after 0.5 s (the upstream idle timeout), not the default 3 s
    edge = await relay_at(tmp_path / "edge", upstream=[dead], upstream_idle_timeout=0.5)
    c = cache(blocks=2)
    ns = plan(c).namespace  # published nowhere: only the edge's upstream could know it
    files = _consumer_files(c, tmp_path)
    extra = ["--namespace", format_namespace(ns)] if via == "index" else []
    try:
        code, _, err = await run_kvcs(*_fetch_args(edge, files, *extra), timeout=TIMEOUT)
    finally:
        await edge.close()
    assert "Traceback" not in err
    assert code == EXIT_UNREACHABLE != EXIT_NOT_FOUND, err
    last = err.splitlines()[-1]
    assert last.startswith("error: the relay's upstream is unreachable ("), err
    assert edge.url in last and "upstream unreachable" in last
    _failure_reported(files["report"], EXIT_UNREACHABLE, last, c.descriptor.layers)


def _failure_reported(path: Path, code: int, line: str, layers: int) -> None:
    """--report is written on a failed retrieval too: its exit code, the line the command
    printed, and what it knew (no block reused: every layer to recompute; its decisions)."""
    rep = json.loads(path.read_text())
    assert (rep["exit_code"], rep["mode"]) == (code, "completed")
    assert "error: " + rep["error"] == line
    assert rep["reused_blocks"] == 0 and rep["recompute_layers"] == list(range(layers))
    assert isinstance(rep["decisions"], list) and rep["quic_backend"] in ("aioquic", "qh3")


async def test_fetch_through_a_relay_without_upstream_still_says_no_publication(
        relay: RunningRelay, tmp_path: Path) -> None:
    # the probe that tells "could not look" must not turn a plain miss into exit 9
    c = cache(blocks=2)
    code, _, err = await run_kvcs(*_fetch_args(relay, _consumer_files(c, tmp_path)),
                                  timeout=TIMEOUT)
    assert code == EXIT_NOT_FOUND, err
    assert err.splitlines()[-1] == "error: no publication of this prompt's prefix on any relay"
    _failure_reported(tmp_path / "report.json", EXIT_NOT_FOUND, err.splitlines()[-1],
                      c.descriptor.layers)
