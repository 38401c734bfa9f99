"""The `kvcs publish | subscribe | fetch` commands as subprocesses against a `kvcs relay`
subprocess on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from cli_harness import free_udp_port, relay_process, run_kvcs
from peers_helpers import SCOPE_KEY

from relay.kvcs.identifiers import write_scope_key
from relay.kvcs.kvfile import read_kvfile
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_tokens

TIMEOUT = 30.0
SYNTH = (3, 2, 8, 40, "float16", 9)  # 3 layers, 2 heads, dim 8, 40 tokens: 5 blocks of 8


async def _run(*args: str, timeout: float = TIMEOUT) -> tuple[int, str, str]:
    return await run_kvcs(*args, timeout=timeout)


@pytest.fixture
async def relay_url(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    async with relay_process(tmp_path / "relay", TIMEOUT) as url_ca:
        yield url_ca


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, str]:
    layers, heads, dim, ntok, dtype, seed = SYNTH
    desc = synthetic_descriptor(layers, heads, dim, dtype, block_tokens=8)
    paths = {"descriptor": tmp_path / "desc.json", "tokens": tmp_path / "tokens.json",
             "key": tmp_path / "scope.key", "other_key": tmp_path / "other.key"}
    paths["descriptor"].write_bytes(desc.canonical_json())
    paths["tokens"].write_text(json.dumps(synthetic_tokens(ntok, seed)))
    write_scope_key(paths["key"], SCOPE_KEY, hex_form=True)
    write_scope_key(paths["other_key"], os.urandom(32))
    return {k: str(v) for k, v in paths.items()}


def _consumer(cmd: str, url: str, ca: Path, inputs: dict[str, str], out: Path,
              *extra: str, key: str = "key") -> list[str]:
    return [cmd, "--relay", url, "--ca", str(ca), "--descriptor", inputs["descriptor"],
            "--scope-key", inputs[key], "--tokens", inputs["tokens"], "--out", str(out),
            "--report", str(out.with_suffix(".json")), *extra]


async def test_publish_subscribe_fetch_end_to_end(relay_url: tuple[str, Path],
                                                  inputs: dict[str, str], tmp_path: Path
                                                  ) -> None:
    url, ca = relay_url
    published = tmp_path / "published.kv"
    # live subscribers: one before production starts, one while it runs (paced layers)
    early = asyncio.ensure_future(_run(*_consumer("subscribe", url, ca, inputs,
                                                  tmp_path / "early.kv", "--wait-ms", "25000")))
    publish = asyncio.ensure_future(_run(
        "publish", "--relay", url, "--ca", str(ca), "--synthetic", ",".join(map(str, SYNTH)),
        "--block-tokens", "8", "--scope-key", inputs["key"], "--segments", "3,2",
        "--extra-codec", "zstd", "--layer-ms", "150", "--out", str(published)))
    during = asyncio.ensure_future(_run(*_consumer("subscribe", url, ca, inputs,
                                                   tmp_path / "during.kv", "--wait-ms",
                                                   "25000")))
    code, out, err = await publish
    assert code == 0, err
    namespace = out.strip()
    assert namespace.startswith("kvcs-1/") and "confirmed: fetch" in err
    # after the publisher left: discovery cannot see it, the namespace comes from "an index"
    after = await _run(*_consumer("subscribe", url, ca, inputs, tmp_path / "after.kv",
                                  "--namespace", namespace))
    fetched = await _run(*_consumer("fetch", url, ca, inputs, tmp_path / "fetched.kv",
                                    "--namespace", namespace, "--codec", "zstd", "--joint",
                                    "--connections", "2"))
    ref = read_kvfile(published)
    for name, (code, _, err) in {"early": await early, "during": await during,
                                 "after": after, "fetched": fetched}.items():
        assert code == 0, f"{name}: {err}"
        got = read_kvfile(tmp_path / f"{name}.kv")
        assert np.asarray(got.k).tobytes() == np.asarray(ref.k).tobytes(), name
        assert np.asarray(got.v).tobytes() == np.asarray(ref.v).tobytes(), name
        assert got.tokens == ref.tokens
        report = json.loads((tmp_path / f"{name}.json").read_text())
        per_object = 1 if name == "fetched" else 2  # kv.zstd carries K and V in one Object
        assert report["objects_verified"] == 5 * 3 * per_object, name
        assert report["objects_discarded"] == 0
        if name in ("early", "during"):
            assert report["objects_duplicate"] == 0, report["decisions"]
        assert all(x["usable_ms"] is not None for x in report["layers"])
        assert report["quic_backend"] == "qh3"  # the receiving commands' default
        if name == "fetched":  # --connections 2: layer 0 on connection #0, 1-2 on #1
            carried = {c["connection"].rsplit("#", 1)[1]: c["objects"]
                       for c in report["connections"]}
            assert carried == {"0": 5, "1": 10}, report["connections"]

    # a different scope finds nothing: exit 3, one line, no traceback
    code, _, err = await _run(*_consumer("fetch", url, ca, inputs, tmp_path / "x.kv",
                                         key="other_key"))
    assert code == 3 and err.count("\n") <= 2 and "Traceback" not in err
    assert "error: no publication" in err


async def test_cli_errors_are_one_line(inputs: dict[str, str], tmp_path: Path) -> None:
    port = free_udp_port()  # nobody listens there
    code, _, err = await _run(*_consumer("fetch", f"moqt://127.0.0.1:{port}/",
                                         Path(inputs["descriptor"]), inputs,
                                         tmp_path / "x.kv"), "--insecure", "--connect-ms", "500")
    # (the transport warns once about --insecure before the error line)
    assert code == 1 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("error: relay ")
    code, _, err = await _run("publish", "--relay", "moqt://127.0.0.1:1/", "--insecure",
                              "--synthetic", "3,2,8", "--scope-key", inputs["key"])
    assert code == 2 and "Traceback" not in err and "--synthetic" in err
