"""The numpy llama on a seeded tiny model: chunked prefill, determinism, the GGUF RoPE
permutation, and a streamed prefill published through a relay and retrieved bit for bit."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
from model_helpers import SCOPE_KEY, TIMEOUT, access, chunked_prefill, fetch_back, relay_at

from relay.model.gguf_load import unpermute_rope
from relay.model.llama import KVCache, apply_rope, rope_tables, tiny_llama
from relay.model.smollm2 import model_descriptor
from relay.peers.engines.numpy_llama import NumpyEngine
from relay.peers.engines.streaming import prefill_and_publish
from relay.peers.publisher import PublishOptions

B = 4


def _tokens(n: int, vocab: int = 256, seed: int = 3) -> list[int]:
    return [int(t) for t in np.random.Generator(np.random.PCG64(seed)).integers(0, vocab, n)]


@pytest.mark.parametrize("chunk", [1, 3, B, 7])
def test_chunked_prefill_matches_full_prefill(chunk: int) -> None:
    m = tiny_llama(1)
    toks = _tokens(23)
    full = KVCache()
    logits = m.forward(toks, full)
    chunked, logits_c = chunked_prefill(m, toks, chunk)
    for a, b in zip(full.arrays(), chunked.arrays(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits, logits_c, rtol=1e-4, atol=1e-4)


def test_same_chunking_is_bit_identical_and_decode_extends_the_cache() -> None:
    m = tiny_llama(2)
    toks = _tokens(18)
    runs = []
    for _ in range(2):
        cache, logits = chunked_prefill(m, toks, B)
        nxt = int(np.argmax(logits))
        runs.append((cache.arrays(), logits.tobytes(), m.forward([nxt], cache).tobytes()))
        assert cache.tokens == len(toks) + 1
    (k1, v1), *rest1 = runs[0]
    (k2, v2), *rest2 = runs[1]
    assert k1.tobytes() == k2.tobytes() and v1.tobytes() == v2.tobytes() and rest1 == rest2


def test_unpermute_inverts_llama_cpp_permutation_and_keeps_rope_scores() -> None:
    heads, d, hidden = 3, 8, 12
    rng = np.random.Generator(np.random.PCG64(0))
    w_hf = rng.standard_normal((heads * d, hidden)).astype(np.float32)
    # convert_hf_to_gguf.py's permute() for Q/K weights
    w_gguf = w_hf.reshape(heads, 2, d // 2, hidden).swapaxes(1, 2).reshape(w_hf.shape)
    assert np.array_equal(unpermute_rope(w_gguf, heads), w_hf)
    # Interleaved RoPE on the GGUF rows gives the same q.k scores as rotate-half on HF rows.
    x = rng.standard_normal((5, hidden)).astype(np.float64)
    pos = np.arange(5)
    cos, sin = rope_tables(pos, d, 10000.0)
    hf = (x @ w_hf.T).reshape(5, heads, d).transpose(1, 0, 2)
    hf = apply_rope(hf, cos.astype(np.float64), sin.astype(np.float64))
    g = (x @ w_gguf.T).reshape(5, heads, d // 2, 2)
    ang = pos[:, None] * 10000.0 ** (-np.arange(0, d, 2) / d)
    c, s = np.cos(ang)[None], np.sin(ang)[None]
    g = g.transpose(1, 0, 2, 3)
    rot = np.stack([g[..., 0] * c - g[..., 1] * s, g[..., 0] * s + g[..., 1] * c], axis=-1)
    np.testing.assert_allclose(hf @ hf.transpose(0, 2, 1),
                               rot.reshape(heads, 5, d) @ rot.reshape(heads, 5, d)
                               .transpose(0, 2, 1), rtol=1e-4, atol=1e-4)


async def test_streamed_prefill_publishes_early_and_is_retrieved_bit_for_bit(
        tmp_path: Path) -> None:
    layers = 4
    m = tiny_llama(5, layers=layers)
    d = model_descriptor(m.config, model="kvcs-test/tiny-llama", revision="seed-5",
                         block_tokens=B)
    toks = _tokens(5 * B + 3)  # 5 full blocks and a partial one that is not published
    layer0_out = threading.Event()
    gate_open: list[bool] = []

    def after_layer(p: int, layer: int) -> None:
        # Before the first pass computes its last layer, layer 0 must already be out.
        if p == 0 and layer == layers - 2:
            gate_open.append(layer0_out.wait(TIMEOUT))

    def on_layer(segment: int, layer: int) -> None:
        if (segment, layer) == (0, 0):
            layer0_out.set()

    r = await relay_at(tmp_path)
    try:
        engine = NumpyEngine(m, model_id="kvcs-test/tiny-llama", revision="seed-5")
        res = await asyncio.wait_for(prefill_and_publish(
            engine, d, SCOPE_KEY, toks, access(r), chunk_blocks=2,
            options=PublishOptions(on_layer=on_layer), after_layer=after_layer), TIMEOUT)
        assert gate_open == [True]
        assert res.published_at[(0, 0)] < res.computed_at[(0, layers - 1)]
        assert [s.blocks for s in res.plan.segments] == [2, 2, 1]
        assert res.summary.confirmed == "fetch"
        # The publisher's cache and logits are those of the same passes run locally, bit for
        # bit: one per segment (8, 8 and 4 tokens), then the partial block's 3 tokens.
        local = KVCache()
        for a, b in ((0, 8), (8, 16), (16, 20), (20, 23)):
            logits = m.forward(toks[a:b], local)
        assert res.logits.tobytes() == logits.tobytes()
        k, v = local.arrays()
        got = await fetch_back(r, d, toks, publications=[(res.plan.namespace, None)])
        assert got.k.shape == (layers, 2, 5 * B, 8)
        assert got.k.tobytes() == np.ascontiguousarray(k[:, :, :5 * B]).tobytes()
        assert got.v.tobytes() == np.ascontiguousarray(v[:, :, :5 * B]).tobytes()
        # A consumer finishes the prompt on the retrieved cache and decodes like the producer.
        cache = KVCache.from_arrays(got.k, got.v)
        tail = m.forward(toks[5 * B:], cache)
        assert tail.tobytes() == logits.tobytes()
    finally:
        await r.close()
