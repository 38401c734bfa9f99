"""The real model, SmolLM2-135M-Instruct (GGUF from the hashed requirements-model.txt): it must
be installed (a missing model fails these tests, it does not skip them).

Decode equivalence: a producer prefills a 200-token prompt in block-sized passes and
publishes the 12 full blocks through a relay while it computes; a consumer fetches them,
recomputes the last 8 tokens on top and decodes: its logits equal a local prefill's bit for
bit. BLAS is pinned to one thread so that the comparison does not depend on threading."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from model_helpers import SCOPE_KEY, access, chunked_prefill, fetch_back, relay_at
from threadpoolctl import threadpool_limits

from relay.model.llama import KVCache
from relay.model.smollm2 import load_smollm2, load_tokenizer, smollm2_descriptor
from relay.peers.engines.numpy_llama import smollm2_numpy
from relay.peers.engines.streaming import prefill_and_publish

B = 16
TEXT = ("Media over QUIC is a protocol for delivering live media through relays. A publisher "
        "sends tracks made of groups and objects; subscribers ask relays for the tracks they "
        "want, and relays cache what passes through them so that later subscribers are served "
        "without going back to the publisher. The same machinery can carry the key and value "
        "cache of a language model: each layer becomes a group, each block of sixteen tokens "
        "an object, and a consumer that shares a prompt prefix with the producer can fetch "
        "the cache instead of computing it again. ")


def _prompt(n: int) -> list[int]:
    tok = load_tokenizer()
    ids = tok.encode(TEXT * 3)
    assert len(ids) >= n
    return ids[:n]


def test_smollm2_completes_a_fact() -> None:
    """The logits are those of a working model (RoPE layout, GQA, tied head all right)."""
    m = load_smollm2()
    tok = load_tokenizer()
    logits = m.forward(tok.encode("The capital of France is"), KVCache())
    assert tok.decode([int(np.argmax(logits))]) == " Paris"


async def test_decode_on_fetched_cache_equals_local_prefill(tmp_path: Path) -> None:
    m = load_smollm2()
    d = smollm2_descriptor(m.config, block_tokens=B)
    toks = _prompt(200)
    with threadpool_limits(limits=1):
        local, local_logits = chunked_prefill(m, toks, B)  # 12 passes of 16 tokens, then 8
        r = await relay_at(tmp_path)
        try:
            res = await asyncio.wait_for(prefill_and_publish(
                smollm2_numpy(), d, SCOPE_KEY, toks, access(r), chunk_blocks=1), 120)
            assert len(res.plan.segments) == 12
            assert res.logits.tobytes() == local_logits.tobytes()
            # Pipelined: layer 0 was out long before the prefill's last layer was computed
            # (the tiny-model test checks the order strictly, by gating the computation).
            first, last = res.published_at[(0, 0)], res.computed_at[(11, d.layers - 1)]
            print(f"layer 0 out {last - first:.3f} s before the last layer was computed")
            assert first < last

            got = await fetch_back(r, d, toks)  # found by discovery, as a consumer would
            k, v = local.arrays()
            assert got.k.shape == (30, 3, 192, 64)
            assert got.k.tobytes() == np.ascontiguousarray(k[:, :, :192]).tobytes()
            assert got.v.tobytes() == np.ascontiguousarray(v[:, :, :192]).tobytes()

            cache = KVCache.from_arrays(got.k, got.v)
            logits = m.forward(toks[192:], cache)  # the consumer's tail: the last 8 tokens
            assert logits.tobytes() == local_logits.tobytes()
            nxt = int(np.argmax(logits))
            assert m.forward([nxt], cache).tobytes() == m.forward([nxt], local).tobytes()
        finally:
            await r.close()
