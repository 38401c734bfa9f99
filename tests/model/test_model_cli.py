"""`kvcs prefill` as a subprocess against a `kvcs relay` subprocess on 127.0.0.1, and the
published cache fetched back with `kvcs fetch`."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from model_helpers import SCOPE_KEY

from relay.kvcs.identifiers import write_scope_key
from relay.kvcs.kvfile import read_kvfile
from relay.model.llama import KVCache, tiny_llama

TIMEOUT = 60.0
KVCS = [sys.executable, "-m", "relay.cli"]


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _run(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*KVCS, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def relay_url(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    port = _free_udp_port()
    data = tmp_path / "relay"
    proc = await asyncio.create_subprocess_exec(
        *KVCS, "relay", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    drain = None
    try:
        async with asyncio.timeout(TIMEOUT):
            while b"relay ready" not in (line := await proc.stderr.readline()):
                assert line, "the relay exited before it was ready"
        drain = asyncio.ensure_future(proc.stderr.read())  # never block on a full pipe
        yield f"moqt://127.0.0.1:{port}/", data / "tls" / "cert.pem"
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), TIMEOUT)
        if drain is not None:
            drain.cancel()


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
    expected = int(np.argmax(model.chunked_prefill(tokens, 16)[1]))
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
