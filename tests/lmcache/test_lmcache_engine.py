"""LMCache's own engine on the CPU with the relay as its remote tier (issue 27).

A store side and a retrieve side, separate processes with the same LMCache config
(lmcache_side.py), SmolLM2's KV computed by transformers; a `kvcs relay` process between them.
Chunks of 16 tokens: a 40-token prompt stores 2 full chunks (the 8-token tail is never
stored: save_unfull_chunk is off, and KVCS publishes full blocks only)."""

from __future__ import annotations

import ast
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lmcache_harness import Relay, Side, connector_config

import relay.peers.lmcache.connector as connector_source
from relay.peers.engines import load_engine

CHUNK = 16
PROMPT = [1000 + 37 * i % 4000 for i in range(40)]
OTHER_SCOPE = bytes(range(1, 33))


@dataclass
class World:
    data: Path
    relay: Relay
    store: Side
    ret: Side
    stored: dict[str, Any]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("lmcache")
    (folder / "scope.key").write_bytes(bytes(range(32)))
    (folder / "other.key").write_bytes(OTHER_SCOPE)
    # a UDP port that never answers: the unreachable relay, the worst case (no ICMP error)
    hole = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    hole.bind(("127.0.0.1", 0))
    # the converted weights the sides load (tests/model's engine, loaded once per worker)
    load_engine("transformers")
    relay = Relay(folder / "data")
    sides: list[Side] = []
    world: World | None = None
    try:
        ours = connector_config(relay, folder / "scope.key")
        sides.append(Side(CHUNK, {"store": ours}))
        sides.append(Side(CHUNK, {
            "ret": ours, "other": connector_config(relay, folder / "other.key"),
            "down": connector_config(None, folder / "scope.key",
                                     port=hole.getsockname()[1], cert=relay.cert)}))
        store, ret = (s.started() for s in sides)
        stored = store.ask("store", "store", PROMPT)
        world = World(folder / "data", relay, store, ret, stored)
        yield world
    finally:
        for s in sides:
            s.stop()
        relay.stop()
        if world is not None:  # the restart test's relay
            world.relay.stop()
        hole.close()


def test_usage_reporting_is_off_before_lmcache_is_imported(world: World) -> None:
    """LMCache reports usage to the internet unless told not to: the connector module sets
    both variables before its first LMCache import, and every LMCache process here has them."""
    tree = ast.parse(Path(connector_source.__file__).read_text())
    first_import = min(n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                       and (n.module or "").startswith("lmcache"))
    set_before = {n.targets[0].slice.value for n in ast.walk(tree)  # type: ignore[attr-defined]
                  if isinstance(n, ast.Assign) and n.lineno < first_import
                  and isinstance(n.targets[0], ast.Subscript)}
    assert {"LMCACHE_TRACK_USAGE", "DO_NOT_TRACK"} <= set_before
    assert connector_source.os.environ["LMCACHE_TRACK_USAGE"] == "false"
    for side in (world.store, world.ret):
        assert (side.ready["track_usage"], side.ready["do_not_track"]) == ("false", "1")


def test_chunks_come_back_bit_for_bit_in_another_process(world: World) -> None:
    got = world.ret.ask("retrieve", "ret", PROMPT)
    assert (got["lookup"], got["retrieved"]) == (32, 32)
    assert got["kv_sha256"] == world.stored["kv_sha256"]


def test_decode_check_logits_equal_a_local_prefill(world: World) -> None:
    """The retrieving side computes the 8-token tail on the retrieved chunks: its next-token
    logits are its own local prefill's (same pass shapes) and the storing side's, bit for
    bit."""
    got = world.ret.ask("retrieve", "ret", PROMPT, decode=True)
    assert got["logits_sha256"] == got["local_sha256"] == world.stored["logits_sha256"]
    assert got["logits_token"] == world.stored["logits_token"]


def test_a_prefix_hit_takes_the_shared_chunks(world: World) -> None:
    prompt = PROMPT[:CHUNK] + [7 + i for i in range(24)]  # the first chunk only is shared
    got = world.ret.ask("retrieve", "ret", prompt, decode=True)
    assert (got["lookup"], got["retrieved"]) == (CHUNK, CHUNK)
    assert got["logits_sha256"] == got["local_sha256"]


def test_a_miss_is_fast_and_clean(world: World) -> None:
    got = world.ret.ask("retrieve", "ret", [5 + i for i in range(40)])
    assert (got["lookup"], got["retrieved"]) == (0, 0)
    assert got["lookup_s"] < 1.0


def test_another_scope_sees_nothing(world: World) -> None:
    got = world.ret.ask("retrieve", "other", PROMPT)
    assert (got["lookup"], got["retrieved"]) == (0, 0)


def test_an_unreachable_relay_means_recompute_without_a_stall(world: World) -> None:
    """No answer at all: the first lookup gives up after the connector's 2 s timeout, the
    next ones miss at once (no dialling for RETRY_S); a store does not raise."""
    first = world.ret.ask("retrieve", "down", PROMPT)
    again = world.ret.ask("retrieve", "down", PROMPT)
    assert (first["lookup"], again["lookup"]) == (0, 0)
    assert first["lookup_s"] < 4.0 and again["lookup_s"] < 0.5
    put = world.ret.ask("store", "down", PROMPT)
    assert put["put_s"] < 3.5 and put["kv_sha256"] == world.stored["kv_sha256"]


def test_twenty_pipelined_puts_share_one_session_and_land_bit_for_bit(world: World) -> None:
    """A new connector on the engine's loop takes 20 chunks as RemoteBackend hands them over
    (every put submitted at once, more than the puts.py window): one handshake for all of
    them and the gets after, every put confirmed, every chunk back bit for bit."""
    got = world.store.ask("puts", "store", [], n=20)
    stats = got["puts_stats"]
    assert got["bit_for_bit"] == [True] * 20, got
    assert stats["sessions_opened"] == 1, stats
    assert (stats["puts_published"], stats["puts_confirmed"], stats["puts_failed"]) == \
        (20, 20, 0), stats


def test_after_a_relay_restart_chunks_come_from_lmdb(world: World) -> None:
    """The connector's session dies with the relay: the next use dials once, and the chunks
    come back from the new relay's LMDB; a use after that needs no other dial."""
    before = world.ret.ask("retrieve", "ret", PROMPT)["stats"]["sessions_opened"]
    world.relay.stop()
    started = time.monotonic()
    world.relay = Relay(world.data, port=world.relay.port)
    got = world.ret.ask("retrieve", "ret", PROMPT)
    assert (got["lookup"], got["retrieved"]) == (32, 32), time.monotonic() - started
    assert got["kv_sha256"] == world.stored["kv_sha256"]
    again = world.ret.ask("retrieve", "ret", PROMPT)
    assert again["retrieved"] == 32
    assert got["stats"]["sessions_opened"] == again["stats"]["sessions_opened"] == before + 1
