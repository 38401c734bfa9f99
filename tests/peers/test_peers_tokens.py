"""Tokens end to end: peers present `--token FILE`, a lower relay presents `--upstream-token`
to its upstream relay; both tiers require tokens (issue 11, item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from cli_harness import run_kvcs
from peers_helpers import SCOPE_KEY

from relay.core.relay import RelayOptions
from relay.kvcs.identifiers import write_scope_key
from relay.kvcs.kvfile import read_kvfile
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_tokens
from relay.service import RelayConfig, start_relay

TIMEOUT = 30.0
SYNTH = (2, 2, 8, 16, "float16", 4)  # 2 layers, 16 tokens: 2 blocks of 8


def _grant(token: str, *roles: str) -> dict[str, object]:
    return {"token": token, "prefixes": ["kvcs-1"], "roles": list(roles)}


async def test_tokens_at_both_tiers(tmp_path: Path) -> None:
    files = {name: tmp_path / f"{name}.token" for name in ("producer", "edge", "consumer",
                                                         "wrong")}
    for name, path in files.items():
        path.write_text(f"{name}-secret-0123\n")
    origin = await start_relay(RelayConfig(
        listen_port=0, data_dir=tmp_path / "origin", memory_bytes=64 << 20,
        lmdb_bytes=64 << 20, options=RelayOptions(),
        auth_tokens=[_grant("producer-secret-0123", "publish", "subscribe"),
                     _grant("edge-secret-0123", "subscribe")]))
    edge = await start_relay(RelayConfig(
        listen_port=0, data_dir=tmp_path / "edge", memory_bytes=64 << 20,
        lmdb_bytes=64 << 20, options=RelayOptions(), upstream=[origin.url],
        upstream_insecure=True, upstream_token=b"edge-secret-0123",
        auth_tokens=[_grant("consumer-secret-0123", "subscribe")]))
    try:
        desc = tmp_path / "desc.json"
        desc.write_bytes(synthetic_descriptor(*SYNTH[:3], SYNTH[4], block_tokens=8)
                         .canonical_json())
        tokens = tmp_path / "tokens.json"
        tokens.write_text(json.dumps(synthetic_tokens(SYNTH[3], SYNTH[5])))
        key = tmp_path / "scope.key"
        write_scope_key(key, SCOPE_KEY, hex_form=True)

        def publish(token: str) -> list[str]:
            return ["publish", "--relay", origin.url, "--ca", str(origin.certfile),
                    "--token", str(files[token]), "--synthetic", ",".join(map(str, SYNTH)),
                    "--block-tokens", "8", "--scope-key", str(key),
                    "--out", str(tmp_path / "published.kv")]

        def fetch(token: str) -> list[str]:
            return ["fetch", "--relay", edge.url, "--ca", str(edge.certfile),
                    "--token", str(files[token]), "--descriptor", str(desc),
                    "--scope-key", str(key), "--tokens", str(tokens),
                    "--out", str(tmp_path / f"{token}.kv"), "--wait-ms", "3000"]

        # a wrong token: one error line, exit 8, nothing published
        code, _, err = await run_kvcs(*publish("wrong"), timeout=TIMEOUT)
        assert code == 8 and "Traceback" not in err, err
        assert err.strip().splitlines() == [err.strip().splitlines()[-1]]
        assert "not authorized" in err and "--token" in err
        code, _, err = await run_kvcs(*publish("producer"), timeout=TIMEOUT)
        assert code == 0, err
        # the consumer discovers and fetches at the edge, which asks the origin with its
        # own upstream token
        code, _, err = await run_kvcs(*fetch("consumer"), timeout=TIMEOUT)
        assert code == 0, err
        ref, got = read_kvfile(tmp_path / "published.kv"), read_kvfile(tmp_path / "consumer.kv")
        assert np.asarray(got.k).tobytes() == np.asarray(ref.k).tobytes()
        assert edge.relay.counters.upstream_fetches >= 1
        # the edge accepts only its own clients' tokens, not the origin's
        code, _, err = await run_kvcs(*fetch("producer"), timeout=TIMEOUT)
        assert code == 8 and "Traceback" not in err, err
        assert err.strip().splitlines()[-1].startswith("error: relay ")
        # an unreadable token file is a usage error
        code, _, err = await run_kvcs(*fetch("consumer")[:-2], "--token",
                                      str(tmp_path / "absent.token"), timeout=TIMEOUT)
        assert code == 2 and "Traceback" not in err and "--token" in err, err
    finally:
        await edge.close()
        await origin.close()
