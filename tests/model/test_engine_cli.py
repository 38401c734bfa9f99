"""`kvcs prefill --engine transformers` and `kvcs subscribe --engine transformers --generate
N` against a `kvcs relay` subprocess on 127.0.0.1, the consumer in a process of its own: its
continuation from the retrieved cache is the producer's own, bit for bit, and --report
splits its time to first token (the same code serves `kvcs fetch`).
Without PyTorch, --engine transformers is one line and exit 2."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import model_sys_path  # noqa: F401  (tests/peers on sys.path)
import pytest
from cli_harness import relay_process, run_kvcs
from click.testing import CliRunner
from engine_helpers import hf, prompt
from model_helpers import SCOPE_KEY

from relay.kvcs.identifiers import write_scope_key
from relay.peers.cli import fetch, prefill
from relay.peers.engines import load_engine

TIMEOUT = 120.0  # a command loads the model (about 20 s alone, more on a busy machine)


async def test_transformers_at_both_ends_of_the_commands(tmp_path: Path) -> None:
    """`kvcs subscribe` starts as its own process (it loads its model meanwhile, about
    20 s); `kvcs prefill` runs in this process (its engine is the one the other tests
    loaded), so the two are different processes: the subscriber retrieves live, or by FETCH
    if production is already over, and its logits match the producer's by SHA-256."""
    key, toks, desc = tmp_path / "scope.key", tmp_path / "tokens.json", tmp_path / "desc.json"
    write_scope_key(key, SCOPE_KEY, hex_form=True)
    tokens = prompt(1, 53)  # 6 blocks of 8 in passes of 16, then 5 tokens
    toks.write_text(json.dumps(tokens))
    # the consumer's own descriptor; the producer's (--descriptor-out) must be the same
    desc.write_bytes(hf().descriptor(8).canonical_json())
    prep, srep = tmp_path / "prefill.json", tmp_path / "subscribe.json"
    async with relay_process(tmp_path / "relay", TIMEOUT) as (url, ca):
        relay = ["--relay", url, "--ca", str(ca), "--scope-key", str(key)]
        consumer = asyncio.ensure_future(run_kvcs(
            "subscribe", *relay, "--engine", "transformers", "--descriptor", str(desc),
            "--tokens", str(toks), "--wait-ms", str(TIMEOUT * 1000), "--generate", "6",
            "--report", str(srep), timeout=TIMEOUT))
        producer = await asyncio.wait_for(asyncio.to_thread(CliRunner().invoke, prefill, [
            *relay, "--engine", "transformers", "--tokens", str(toks), "--block-tokens", "8",
            "--chunk-blocks", "2", "--generate", "6", "--descriptor-out",
            str(tmp_path / "prod.json"), "--report", str(prep)]), TIMEOUT)
        scode, sout, serr = await consumer
    assert producer.exit_code == 0, producer.output
    assert scode == 0, serr
    assert (tmp_path / "prod.json").read_bytes().strip() == desc.read_bytes()
    ns, produced_text = producer.stdout.split("\n", 1)
    assert ns.startswith("kvcs-1/") and "3 segment(s) x 30 layers" in producer.stderr
    produced = json.loads(prep.read_text())["generation"]
    assert len(produced["tokens"]) == 6 and produced["engine"] == "transformers"
    gen = json.loads(srep.read_text())["generation"]
    assert gen["tokens"] == produced["tokens"] and sout == produced_text
    assert gen["logits_sha256"] == produced["logits_sha256"]  # bit for bit, 6 steps
    assert (gen["reused_tokens"], gen["computed_tokens"]) == (48, 5)
    assert gen["local_first_token"] == gen["tokens"][0]
    for name in ("fetch_ms", "load_ms", "first_decode_ms", "local_prefill_ms",
                 "model_load_ms"):
        assert gen[name] > 0, name
    assert gen["ttft_ms"] == pytest.approx(gen["fetch_ms"] + gen["load_ms"] +
                                           gen["first_decode_ms"], abs=0.01)
    assert "time to first token" in serr and "local full prefill" in serr
    print(serr.splitlines()[0])


@pytest.mark.parametrize("argv", [
    ["prefill", "--engine", "transformers", "--relay", "moqt://127.0.0.1:9/", "--insecure",
     "--scope-key", __file__, "--tokens", __file__],
    ["fetch", "--engine", "transformers", "--generate", "4", "--relay", "moqt://127.0.0.1:9/",
     "--insecure", "--descriptor", __file__, "--scope-key", __file__, "--tokens", __file__],
])
def test_without_torch_engine_transformers_is_one_line_and_exit_2(
        argv: list[str], tmp_path: Path) -> None:
    code = ("import sys; sys.modules['torch'] = None; from relay.cli import main; "
            f"sys.argv = ['kvcs'] + {argv!r}; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "transformers engine is not installed" in lines[0], lines
    assert "make install" in lines[0]


def test_fetch_refuses_a_descriptor_of_another_k_layout(tmp_path: Path) -> None:
    """In-process (the numpy engine is loaded once per test process): one line, exit 2,
    before any network work."""
    desc, key = tmp_path / "desc.json", tmp_path / "scope.key"
    doc = dict(load_engine("numpy").descriptor(16).doc)
    doc["extra"] = {"k_layout": "rope-interleaved"}
    desc.write_text(json.dumps(doc))
    write_scope_key(key, SCOPE_KEY, hex_form=True)
    res = CliRunner().invoke(fetch, [
        "--engine", "numpy", "--generate", "2", "--relay", "moqt://127.0.0.1:9/",
        "--insecure", "--descriptor", str(desc), "--scope-key", str(key),
        "--tokens", str(desc)])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "extra.k_layout" in lines[0], lines
