"""`kvcs prefill` as a subprocess against a `kvcs relay` subprocess on 127.0.0.1, and the
published cache fetched back with `kvcs fetch`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import model_sys_path  # noqa: F401  (tests/peers on sys.path)
import numpy as np
import pytest
from cli_harness import relay_process, run_kvcs
from model_helpers import SCOPE_KEY, chunked_prefill

from relay.kvcs.identifiers import write_scope_key
from relay.kvcs.kvfile import read_kvfile
from relay.model.llama import KVCache, tiny_llama

TIMEOUT = 60.0


async def _run(*args: str, timeout: float = TIMEOUT) -> tuple[int, str, str]:
    return await run_kvcs(*args, timeout=timeout)


@pytest.fixture
async def relay_url(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    async with relay_process(tmp_path / "relay", TIMEOUT) as url_ca:
        yield url_ca


async def test_prefill_command_publishes_what_fetch_gets_back(
        tmp_path: Path, relay_url: tuple[str, Path]) -> None:
    url, ca = relay_url
    key, toks, desc = tmp_path / "scope.key", tmp_path / "tokens.json", tmp_path / "desc.json"
    write_scope_key(key, SCOPE_KEY, hex_form=True)
    tokens = [(7 * i + 3) % 256 for i in range(5 * 8 + 5)]  # 5 blocks of 8 and 5 tokens
    toks.write_text(json.dumps(tokens))
    code, out, err = await _run(
        "prefill", "--relay", url, "--ca", str(ca), "--model", "tiny", "--scope-key", str(key),
        "--tokens", str(toks), "--block-tokens", "8", "--chunk-blocks", "2",
        "--descriptor-out", str(desc), "--out", str(tmp_path / "pub.kv"))
    assert code == 0, err
    assert out.startswith("kvcs-1/") and "3 segment(s) x 2 layers" in err
    model = tiny_llama(0)
    expected = int(np.argmax(chunked_prefill(model, tokens, 16)[1]))
    assert f"next token {expected}" in err

    code, _, err = await _run("fetch", "--relay", url, "--ca", str(ca), "--descriptor",
                              str(desc), "--scope-key", str(key), "--tokens", str(toks),
                              "--out", str(tmp_path / "got.kv"))
    assert code == 0, err
    pub, got = read_kvfile(tmp_path / "pub.kv"), read_kvfile(tmp_path / "got.kv")
    assert got.k.shape[2] == 40
    assert np.asarray(got.k).tobytes() == np.asarray(pub.k).tobytes()
    assert np.asarray(got.v).tobytes() == np.asarray(pub.v).tobytes()
    local = KVCache()
    for a, b in ((0, 16), (16, 32), (32, 40)):
        model.forward(tokens[a:b], local)
    assert np.asarray(got.k).tobytes() == local.arrays()[0].tobytes()
