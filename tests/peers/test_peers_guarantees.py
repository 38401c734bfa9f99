"""The consumer's guarantees (issue 16) against real relays on 127.0.0.1: with
--require-cose nothing is used before a signed manifest version lists it, every wait is
bounded by the deadline, discovery finds any shorter prefix, and publishers answer for what
they published."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_harness import run_kvcs
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from peers_helpers import (
    SCOPE_KEY,
    TIMEOUT,
    B,
    Cache,
    access,
    announced,
    cache,
    plan,
    relay_at,
)
from tampering import observe_requests, publish_gated, tamper_relay, wait_cached

from relay.kvcs.cose import KeyStore
from relay.kvcs.identifiers import write_scope_key
from relay.kvcs.kvfile import read_kvfile
from relay.kvcs.namespace import KvcsNamespace
from relay.kvcs.plan import PlannedObject, PublicationPlan, TrackSpec
from relay.kvcs.registry import Codec, Component
from relay.moqt.primitives import FullTrackName, Location
from relay.peers.discovery import MAX_PREFIXES
from relay.peers.errors import EXIT_OK, EXIT_PARTIAL, EXIT_UNVERIFIED
from relay.peers.inputs import format_namespace
from relay.peers.subscriber import Retrieval, RetrieveOptions, retrieve
from relay.service import RunningRelay

FORGED = ("k.raw.s0", 9, 1)  # track, layer, block the tampering relay replaces
LAYERS = 16  # manifest versions after layers 7 and 15: layer 9 is listed only by the last


@pytest.fixture
async def relay(tmp_path: Path) -> Any:
    r = await relay_at(tmp_path / "r1")
    yield r
    await r.close()


def _signed(c: Cache) -> tuple[PublicationPlan, KeyStore]:
    key = ed25519.Ed25519PrivateKey.generate()
    return plan(c, signer=(key, b"prod")), KeyStore({b"prod": key.public_key()})


def _opts(r: RunningRelay, c: Cache, p: PublicationPlan, keys: KeyStore, **kw: Any
          ) -> RetrieveOptions:
    return RetrieveOptions(access(r), c.descriptor, SCOPE_KEY, c.tokens, require_cose=True,
                           keys=keys, publications=[(p.namespace, None)], **kw)


async def _retrieve(opts: RetrieveOptions) -> Retrieval:
    return await asyncio.wait_for(retrieve(opts), TIMEOUT)


def _same_except(got: np.ndarray, want: np.ndarray, layers: list[int]) -> bool:
    return bool(np.array_equal(np.delete(got, layers, 0), np.delete(want, layers, 0))
                and not got[layers].any())


async def test_require_cose_live_waits_for_the_signed_version_that_lists_each_object(
        relay: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    c = cache(blocks=4, layers=LAYERS)
    p, keys = _signed(c)
    forged = tamper_relay(monkeypatch, relay, *FORGED)
    total = 4 * LAYERS * 2
    seen: list[tuple[str, int, int]] = []
    all_data, started, leave = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def observe(url: str, track: str, g: int, o: int, payload: bytes) -> bytes:
        seen.append((track, g, o))
        if len(seen) == total:
            all_data.set()
        return payload

    def gate(obj: PlannedObject) -> Any:
        started.set()
        if obj.track == p.manifest_track and obj.ends_track:
            # the last version (the only one listing layer 9) goes out only once the
            # consumer holds every data Object: a consumer that trusts early is done by then
            return asyncio.wait_for(all_data.wait(), TIMEOUT)
        return None

    pub = asyncio.ensure_future(publish_gated(p, access(relay), gate, leave))
    try:
        await asyncio.wait_for(started.wait(), TIMEOUT)
        res = await _retrieve(_opts(relay, c, p, keys, mode="live", tamper=observe))
    finally:
        leave.set()
        await asyncio.wait_for(pub, TIMEOUT)
    rep = res.report
    assert forged and FORGED in seen
    assert res.exit_code == EXIT_PARTIAL, rep["decisions"]
    assert res.recompute_layers == [9] and rep["unverified_objects"] == []
    assert rep["layers"][9]["usable_ms"] is None and rep["layers"][9]["objects_discarded"] >= 1
    assert _same_except(res.k, c.k, [9]) and _same_except(res.v, c.v, [9])


async def _kvcs_fetch(r: RunningRelay, c: Cache, ns: KvcsNamespace, tmp: Path, *extra: str
                      ) -> tuple[int, str, dict[str, Any], float]:
    """``kvcs fetch`` of ``ns`` (given as by an index) through ``r``, as a subprocess:
    (exit code, stderr, JSON report, seconds)."""
    files = {"descriptor": tmp / "desc.json", "tokens": tmp / "tokens.json",
             "key": tmp / "scope.key", "out": tmp / "out.kv", "report": tmp / "report.json"}
    files["descriptor"].write_bytes(c.descriptor.canonical_json())
    files["tokens"].write_text(json.dumps(c.tokens))
    write_scope_key(files["key"], SCOPE_KEY)
    started = time.monotonic()
    code, _, err = await run_kvcs(
        "fetch", "--relay", r.url, "--ca", str(r.certfile), "--namespace", format_namespace(ns),
        *(a for name in ("descriptor", "tokens", "out", "report")
          for a in (f"--{name}", str(files[name]))),
        "--scope-key", str(files["key"]), *extra, timeout=TIMEOUT)
    elapsed = time.monotonic() - started
    assert "Traceback" not in err
    return code, err, json.loads(files["report"].read_text()), elapsed


async def test_require_cose_completed_reports_objects_no_signed_version_lists(
        relay: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    c = cache(blocks=4, layers=LAYERS)
    p, keys = _signed(c)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "prod.pem").write_bytes(keys.get(b"prod").public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    tamper_relay(monkeypatch, relay, *FORGED)
    leave = asyncio.Event()

    def gate(obj: PlannedObject) -> Any:
        # production stalls before layer 13: the latest version lists layers 0-7 only
        if obj.track != p.manifest_track and obj.group == 13:
            return leave.wait()
        return None

    pub = asyncio.ensure_future(publish_gated(p, access(relay), gate, leave))
    try:
        for track, at in (("k.raw.s0", Location(12, 3)), ("v.raw.s0", Location(12, 3)),
                          (p.manifest_track, Location(1, 0))):
            await wait_cached(relay, FullTrackName(p.namespace.fields, track.encode()), at)
        code, err, rep, _ = await _kvcs_fetch(relay, c, p.namespace, tmp_path, "--require-cose",
                                              "--keys", str(tmp_path / "keys"),
                                              "--stall-ms", "300")
    finally:
        leave.set()
        await asyncio.wait_for(pub, TIMEOUT)
    assert code == EXIT_UNVERIFIED, err
    assert err.splitlines()[-1].startswith("error: no signed manifest version listed 40 ")
    assert f"s0 {FORGED[0]} {FORGED[1]}/{FORGED[2]}" in rep["unverified_objects"]
    assert len(rep["unverified_objects"]) == 5 * 4 * 2  # layers 8-12, 4 blocks, k and v
    assert rep["recompute_layers"] == list(range(8, LAYERS))
    assert any(d["action"] == "listing-timeout" for d in rep["decisions"])
    out = read_kvfile(tmp_path / "out.kv")
    assert _same_except(np.asarray(out.k), c.k, list(range(8, LAYERS)))


@pytest.fixture
def silent_udp() -> Iterator[str]:
    """A loopback UDP port that takes every packet and never answers: an upstream relay
    that hangs (not one that refuses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        yield f"moqt://127.0.0.1:{s.getsockname()[1]}/"


async def test_fetch_ends_at_the_deadline_when_the_upstream_never_answers(
        tmp_path: Path, silent_udp: str, monkeypatch: pytest.MonkeyPatch) -> None:
    edge = await relay_at(tmp_path / "edge", upstream=[silent_udp])
    fetches = observe_requests(monkeypatch, "fetch")
    c = cache(blocks=2)
    ns = plan(c).namespace  # published nowhere: the edge relay must ask its upstream
    deadline_ms = 1500
    try:
        code, err, rep, elapsed = await _kvcs_fetch(edge, c, ns, tmp_path,
                                                    "--deadline-ms", str(deadline_ms))
    finally:
        await edge.close()
    assert code == EXIT_PARTIAL, err
    assert err.splitlines()[-1].startswith("error: deadline")
    assert deadline_ms / 1000 <= elapsed < deadline_ms / 1000 + 8  # + interpreter start-up
    assert rep["deadline_passed"] and rep["exit_code"] == EXIT_PARTIAL
    assert rep["recompute_layers"] == list(range(c.descriptor.layers))
    assert rep["decisions"][-1 - c.descriptor.layers]["action"] == "deadline"
    # the relay was told how long the consumer would wait
    timeouts = [f.params.fill_timeout for f in fetches]
    assert timeouts and all(t is not None and 0 < t <= deadline_ms for t in timeouts)


async def test_discovery_finds_a_publication_100_blocks_shorter_than_the_prompt(
        relay: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    c = cache(blocks=4)
    p = plan(c)
    requests = observe_requests(monkeypatch, "subscribe_namespace")
    async with announced(p, relay):
        # a shared 4-block "system prompt", then 100 blocks of this consumer's own
        res = await _retrieve(RetrieveOptions(access(relay), c.descriptor, SCOPE_KEY,
                                              c.tokens + [5] * (100 * B)))
    assert res.exit_code == EXIT_OK, res.report
    assert res.report["reused_blocks"] == 4 and res.report["prompt_blocks"] == 104
    assert np.array_equal(res.k, c.k) and np.array_equal(res.v, c.v)
    # one request per Anchor Key, longest first, in two waves; never one for the whole model
    # (which a relay answers with every publication of it, however many: issue 23 item 8)
    prefixes = [r.prefix for r in requests]
    assert all(len(pfx) == 4 for pfx in prefixes)
    assert len(prefixes) == len(set(prefixes)) == 104
    assert p.namespace.fields[:4] in prefixes[MAX_PREFIXES:]


async def test_publisher_serves_the_groups_a_small_relay_evicted_before_its_commit(
        tmp_path: Path) -> None:
    # one kv track of 16 Groups of ~4 KB each in memory: a 32 KiB memory tier holds part of
    # it only, so the relay can neither keep the Track nor commit it to LMDB. (One data
    # track: with two, the relay's LRU can evict every Group of one of them, End of Track
    # included, and then forgets that Track altogether; see the issue-16 report.)
    small = await relay_at(tmp_path / "small", memory_bytes=32 << 10)
    c = cache(blocks=8, layers=LAYERS)
    p = plan(c, tracks=[TrackSpec(Component.KV, Codec.RAW)])
    try:
        # (confirm="fetch" would need the relay to learn End of Track from the publisher's
        # FETCH_OK once it evicted the Group that carried it: not this test's subject)
        async with announced(p, small, confirm="none"):
            res = await _retrieve(RetrieveOptions(access(small), c.descriptor, SCOPE_KEY,
                                                  c.tokens, mode="live", joint=True))
            assert small.relay.store.memory.stats()["evicted_groups"] > 0
            assert small.relay.counters.upstream_fetches > 0  # answered by the publisher
    finally:
        await small.close()
    assert res.exit_code == EXIT_OK, res.report["decisions"]
    assert res.report["objects_verified"] == 8 * LAYERS
    assert np.array_equal(res.k, c.k) and np.array_equal(res.v, c.v)


async def test_publisher_answers_a_subscribe_for_a_track_it_ended(relay: Any) -> None:
    c = cache(blocks=4)
    p = plan(c)
    async with announced(p, relay):
        before = relay.relay.counters.upstream_subscriptions
        # production is over (PUBLISH_DONE): the relay's SUBSCRIBEs go to the publisher,
        # which answers from what it wrote (fill, then PUBLISH_DONE)
        res = await _retrieve(RetrieveOptions(access(relay), c.descriptor, SCOPE_KEY,
                                              c.tokens, mode="live",
                                              publications=[(p.namespace, None)]))
        assert relay.relay.counters.upstream_subscriptions > before
    assert res.exit_code == EXIT_OK, res.report["decisions"]
    assert res.report["objects_verified"] == 4 * c.descriptor.layers * 2
    assert res.report["objects_duplicate"] == 0
    assert np.array_equal(res.k, c.k) and np.array_equal(res.v, c.v)
