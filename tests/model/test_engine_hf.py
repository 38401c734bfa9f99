"""The transformers engine at both ends of the relay (SmolLM2-135M on PyTorch, CPU; PyTorch
and the model are installed by `make`: missing, these tests fail, they do not skip).

Bit-exact: a producer prefills in block-aligned passes and publishes each layer as it is
computed; a consumer fetches the full blocks, builds a DynamicCache from them, computes the
trailing partial block (the producer's last pass, replayed) and decodes greedily. Its logits
at every step and its continuation equal the producer's own, bit for bit, whether the relay
serves the cache from memory or, restarted, from LMDB."""

from __future__ import annotations

import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from engine_helpers import GENERATE, consume, hf, produce, prompt, restarted
from model_helpers import TIMEOUT, relay_at

from relay.kvcs.descriptor import make_descriptor
from relay.model.smollm2 import K_LAYOUT
from relay.peers.engines import EngineError, check_descriptor
from relay.peers.engines.generate import continue_prompt
from relay.peers.publisher import PublishOptions


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


def test_transformers_completes_a_fact() -> None:
    """The GGUF loaded by transformers is a working SmolLM2 (and its tokenizer too)."""
    e = hf()
    ids = e.encode("The capital of France is")
    assert e.decode([int(np.argmax(e.run(ids, e.new_cache())))]) == " Paris"


@pytest.mark.parametrize(("text", "n", "block", "chunk"), [
    (0, 39, 16, 1),   # 2 full blocks in 2 passes of 16, then 7 tokens
    (1, 58, 8, 3),    # 7 full blocks in passes of 24, 24 and 8, then 2 tokens
])
async def test_consumer_continues_bit_for_bit_from_memory_and_from_lmdb(
        tmp_path: Path, text: int, n: int, block: int, chunk: int) -> None:
    e = hf()
    toks = prompt(text, n)
    layer0_out = threading.Event()
    gate: list[bool] = []

    def after_layer(p: int, layer: int) -> None:
        # The first pass may not finish its last layer before layer 0 is out (pipelining).
        if p == 0 and layer == e.layers - 2:
            gate.append(layer0_out.wait(TIMEOUT))

    def on_layer(segment: int, layer: int) -> None:
        if (segment, layer) == (0, 0):
            layer0_out.set()

    r = await relay_at(tmp_path)
    try:
        prod = await produce(e, r, toks, block, chunk, after_layer=after_layer,
                             options=PublishOptions(on_layer=on_layer))
        assert gate == [True]
        assert len(prod.tokens) == GENERATE
        # the published cache is the producer's DynamicCache, bit for bit
        k, v = e.kv_of(prod.result.cache)
        full = n // block * block
        assert prod.result.plan.k.tobytes() == np.ascontiguousarray(k[:, :, :full]).tobytes()
        assert prod.result.plan.v.tobytes() == np.ascontiguousarray(v[:, :, :full]).tobytes()

        got = await consume(e, r, toks, block)  # from the relay's memory
        assert (got.reused_tokens, got.computed_tokens) == (full, n - full)
        assert got.tokens == prod.tokens and _same(got.logits, prod.logits)

        r = await restarted(r, tmp_path)
        again = await consume(e, r, toks, block)  # from LMDB
        assert again.tokens == prod.tokens and _same(again.logits, prod.logits)
        print(f"continuation {prod.tokens} {e.decode(prod.tokens)!r}")
    finally:
        await r.close()


def test_dynamic_cache_round_trips_kvcs_arrays_of_each_dtype() -> None:
    e = hf()
    rng = np.random.Generator(np.random.PCG64(1))
    shape = (e.layers, e.kv_heads, 5, e.head_dim)
    k = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    cache = e.cache_from_kv(k, v)
    assert cache.layers[3].keys.shape == (1, e.kv_heads, 5, e.head_dim)
    k2, v2 = e.kv_of(cache)
    assert k2.tobytes() == k.tobytes() and v2.tobytes() == v.tobytes()
    for dt in (np.float16, ml_dtypes.bfloat16):  # a narrower descriptor dtype widens exactly
        k3, _ = e.kv_of(e.cache_from_kv(k.astype(dt), v.astype(dt)))
        assert k3.tobytes() == k.astype(dt).astype(np.float32).tobytes()
    with pytest.raises(EngineError, match="does not fit"):
        e.cache_from_kv(k[:, :2], v[:, :2])


def test_consumer_refuses_another_k_layout_or_model() -> None:
    e = hf()
    own = e.descriptor(16)
    assert own.doc["extra"] == {"k_layout": K_LAYOUT}
    check_descriptor(e, own)
    doc = dict(own.doc)
    doc["extra"] = {"k_layout": "rope-interleaved"}
    other = make_descriptor(**{m: doc[m] for m in (
        "model", "revision", "tokenizer", "layers", "kv_heads", "head_dim", "dtype",
        "block_tokens", "position", "extra")})
    assert other.compat_id != own.compat_id  # so discovery never finds such a cache
    with pytest.raises(EngineError, match=r"extra\.k_layout is 'rope-interleaved'"):
        check_descriptor(e, other)
    del doc["extra"]
    with pytest.raises(EngineError, match="does not say how K is laid out"):
        check_descriptor(e, type(own)(doc))
    doc = {**own.doc, "layers": 2}
    with pytest.raises(EngineError, match="layers is 2"):
        check_descriptor(e, type(own)(doc))


def test_a_whole_prompt_in_the_cache_recomputes_its_last_token() -> None:
    """A retrieved cache covering the whole prompt has no logits: the last token is computed
    again, which gives the local prefill's next token."""
    e = hf()
    toks = prompt(0, 32)
    local = e.new_cache()
    logits = e.run(toks, local)
    k, v = e.kv_of(local)
    c = continue_prompt(e, toks, 3, k=k, v=v, local_prefill=True)
    assert (c.reused_tokens, c.computed_tokens) == (31, 1)
    assert c.tokens[0] == int(np.argmax(logits)) == c.local_first_token
    np.testing.assert_allclose(c.logits[0], logits, atol=1e-3)
    assert c.timings_ms["local_prefill_ms"] > 0 and c.timings_ms["ttft_ms"] > 0


def test_converted_weights_are_the_gguf_loaders_bit_for_bit() -> None:
    """This process loaded the model from the GGUF file (tests/conftest.py gives each run a
    fresh cache folder) and kept a converted copy; a load from the copy, as every later
    process makes, has the same tensors bit for bit."""
    import torch
    import transformers

    from relay.peers.engines.hf import _load_model, weights_cache_dir

    engine = hf()
    folder = weights_cache_dir(transformers.__version__)
    assert folder is not None and (folder / "model.safetensors").is_file()
    engine.encode("warm")  # the tokenizer is kept beside the weights on first use
    assert (folder / "tokenizer" / "tokenizer_config.json").is_file()
    copy, _ = _load_model(torch, transformers)
    ours = engine.model.state_dict()  # type: ignore[attr-defined]
    theirs = copy.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
