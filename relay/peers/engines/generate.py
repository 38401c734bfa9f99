"""A consumer's continuation: the engine's cache built from what the retrieval brought, the
rest of the prompt computed on top, then greedy decoding; with the time to first token
split into fetch, load and first decode step, and optionally a local full prefill of the
same prompt timed beside it.

Which tokens the consumer computes itself: those past the reused blocks (a trailing partial
block, or a longer prompt's own tail). When the retrieved prefix covers the whole prompt,
the last token is computed again (its logits are not in a KV cache), as engines do. When the
retrieval left layers to recompute, the cache is useless as a whole (every layer's K/V of a
token depends on all layers below it), so the prompt is prefilled locally instead.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .base import Engine, greedy


@dataclass
class Continuation:
    tokens: list[int]
    text: str
    logits: list[np.ndarray]  # per generated token, the logits it was chosen from
    reused_tokens: int
    computed_tokens: int
    timings_ms: dict[str, float] = field(default_factory=dict)
    local_first_token: int | None = None  # with local_prefill: must equal tokens[0]

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"tokens": self.tokens, "text": self.text,
                               "reused_tokens": self.reused_tokens,
                               "computed_tokens": self.computed_tokens, **self.timings_ms}
        if self.local_first_token is not None:
            doc["local_first_token"] = self.local_first_token
        return doc


def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1000, 3)


def continue_prompt(engine: Engine, prompt: Sequence[int], n: int, *,
                    k: np.ndarray | None = None, v: np.ndarray | None = None,
                    fetch_ms: float = 0.0, local_prefill: bool = False) -> Continuation:
    """Continue ``prompt`` for ``n`` tokens from a retrieved cache (``k``/``v``, KVCS arrays
    of its first blocks; None: nothing reused). ``fetch_ms`` is the retrieval's duration;
    with ``local_prefill`` a full prefill of the prompt on an empty cache is timed too."""
    prompt = [int(t) for t in prompt]
    reused = 0 if k is None or v is None else min(int(k.shape[2]), len(prompt))
    if reused == len(prompt):
        reused -= 1  # the last token's logits come from computing it
    t0 = time.perf_counter()
    if reused and k is not None and v is not None:
        cache = engine.cache_from_kv(k[:, :, :reused], v[:, :, :reused])
    else:
        cache = engine.new_cache()
    t1 = time.perf_counter()
    logits = engine.run(prompt[reused:], cache)
    first = int(np.argmax(logits))
    t2 = time.perf_counter()
    tokens, steps = greedy(engine, cache, logits, n)
    t3 = time.perf_counter()
    assert not tokens or tokens[0] == first
    timings = {"fetch_ms": round(fetch_ms, 3), "load_ms": _ms(t0, t1),
               "first_decode_ms": _ms(t1, t2)}
    timings["ttft_ms"] = round(sum(timings.values()), 3)
    timings["decode_ms"] = _ms(t2, t3)
    local_first = None
    if local_prefill:
        t4 = time.perf_counter()
        local = engine.run(prompt, engine.new_cache())
        t5 = time.perf_counter()
        timings["local_prefill_ms"] = _ms(t4, t5)
        local_first = int(np.argmax(local))
    return Continuation(tokens, text_of(engine, tokens), steps, reused, len(prompt) - reused,
                        timings, local_first)


def text_of(engine: Engine, tokens: Sequence[int]) -> str:
    """The tokens as text, or "" for a model without a tokenizer (the tiny test model)."""
    try:
        return engine.decode(tokens) if tokens else ""
    except ValueError:
        return ""
