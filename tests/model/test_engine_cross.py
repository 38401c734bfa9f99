"""Across engines: a cache computed by the numpy Llama and continued by transformers, and
the reverse, through a relay. Two implementations of the same weights agree within float
tolerance, not bit for bit (different reduction orders, RoPE tables in float64 vs float32),
so the claim is: the same greedy continuation, and logits within LOGITS_ATOL at every step.
The numpy engine is independent code, so this also checks what a same-engine round trip
cannot: that both read the published K in the same layout (extra.k_layout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_helpers import TEXTS, consume, hf, numpy_engine, produce, prompt
from model_helpers import relay_at

from relay.model.smollm2 import load_tokenizer

# The largest |numpy - transformers| of a logit seen over these prompts and 8 steps was
# 3.4e-5 (logits are O(10)); 1e-3 leaves room for other BLAS builds and thread counts, while
# a wrong K layout or position moves logits by whole units.
LOGITS_ATOL = 1e-3


@pytest.mark.parametrize(("producer", "consumer", "text", "n", "block", "chunk"), [
    ("numpy", "transformers", 0, 39, 16, 1),
    ("transformers", "numpy", 1, 58, 8, 3),
])
async def test_cross_engine_same_continuation_and_close_logits(
        tmp_path: Path, producer: str, consumer: str, text: int, n: int, block: int,
        chunk: int) -> None:
    engines = {"numpy": numpy_engine, "transformers": hf}
    p, c = engines[producer](), engines[consumer]()
    assert p.descriptor(block) == c.descriptor(block)  # one compat ID: found by discovery
    toks = prompt(text, n)
    r = await relay_at(tmp_path)
    try:
        prod = await produce(p, r, toks, block, chunk)
        got = await consume(c, r, toks, block)
    finally:
        await r.close()
    assert got.tokens == prod.tokens
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(got.logits, prod.logits,
                                                              strict=True))
    print(f"{producer} -> {consumer}: max |logit difference| {diff:.2e}, {prod.tokens}")
    assert diff < LOGITS_ATOL


def test_both_tokenizers_agree_on_the_test_prompts() -> None:
    """The prompts are tokenized once (the numpy engine's minimal tokenizer) for both
    engines; transformers' own tokenizer gives the same IDs for them."""
    for text in TEXTS:
        assert load_tokenizer().encode(text) == hf().encode(text)
