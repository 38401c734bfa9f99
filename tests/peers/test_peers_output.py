"""``--out`` filled in place (peers/output.py): the retrieval reassembles into the mapped
output file, which ends up octet for octet what write_kvfile writes of the result, whether
the whole prompt was reused (renamed into place), only a prefix (written anew), or nothing
(no file at all, also when it fails midway). Library retrievals from an in-process relay
on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from peers_helpers import SCOPE_KEY, access, announced, cache, plan, relay_at

from relay.kvcs.kvfile import write_kvfile
from relay.peers.errors import NotFound
from relay.peers.output import OutputFile
from relay.peers.state import Tamper
from relay.peers.subscriber import Retrieval, RetrieveOptions, retrieve

TIMEOUT = 30.0


@pytest.fixture
async def relay(tmp_path: Path) -> Any:
    r = await relay_at(tmp_path / "r1")
    yield r
    await r.close()


async def _fetch(relay: Any, out: Path, tokens: list[int], key: bytes = SCOPE_KEY,
                 tamper: Tamper | None = None) -> Retrieval:
    c = cache(blocks=4)
    output = OutputFile(out, c.descriptor, tokens)
    opts = RetrieveOptions(access(relay), c.descriptor, key, tokens,
                           allocate=output.allocate,
                           deliver=lambda res: output.write(res.k, res.v, res.tokens),
                           tamper=tamper)
    try:
        return await asyncio.wait_for(retrieve(opts), TIMEOUT)
    finally:
        output.discard()


@pytest.mark.parametrize("extra_blocks", [0, 2])
async def test_the_output_file_is_the_result_whether_all_or_a_prefix_was_reused(
        relay: Any, tmp_path: Path, extra_blocks: int) -> None:
    c = cache(blocks=4)
    # a prompt 2 blocks longer than the publication reuses its 4 blocks of 6
    tokens = c.tokens + [7] * (extra_blocks * c.descriptor.block_tokens)
    async with announced(plan(c), relay):
        res = await _fetch(relay, tmp_path / "got.kv", tokens)
    assert res.exit_code == 0 and res.report["reused_blocks"] == 4
    write_kvfile(tmp_path / "want.kv", c.k, c.v, c.descriptor, c.tokens)
    assert (tmp_path / "got.kv").read_bytes() == (tmp_path / "want.kv").read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".partial"] == []


class _Interrupted(BaseException):
    """Stands for an interruption mid-transfer (failure injection)."""


async def test_a_retrieval_that_fails_midway_leaves_no_file(relay: Any, tmp_path: Path
                                                            ) -> None:
    c = cache(blocks=4)

    def interrupt(_relay: str, _track: str, group: int, _obj: int, payload: bytes) -> bytes:
        if group == 2:
            assert (tmp_path / "got.kv.partial").exists()  # the mapped file was made
            raise _Interrupted
        return payload

    async with announced(plan(c), relay):
        with pytest.raises(_Interrupted):
            await _fetch(relay, tmp_path / "got.kv", c.tokens, tamper=interrupt)
        with pytest.raises(NotFound):  # nothing found: nothing made either
            await _fetch(relay, tmp_path / "got.kv", c.tokens, key=bytes(32))
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == []
