"""The project's own numpy Llama (relay/model) as an engine: the dependency-light path (no
PyTorch) and an independent implementation to check the transformers engine against."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from relay.kvcs.descriptor import Descriptor
from relay.model.llama import KVCache, Llama
from relay.model.smollm2 import model_descriptor

from .base import OnLayer


class NumpyEngine:
    name = "numpy"

    def __init__(self, model: Llama, *, model_id: str, revision: str,
                 tokenizer: Any = None, eos: int | None = None) -> None:
        self.model, self.model_id, self.revision = model, model_id, revision
        self._tokenizer = tokenizer
        c = model.config
        self.layers, self.kv_heads, self.head_dim = c.layers, c.kv_heads, c.head_dim
        self.eos = eos

    def descriptor(self, block_tokens: int) -> Descriptor:
        return model_descriptor(self.model.config, model=self.model_id, revision=self.revision,
                                block_tokens=block_tokens)

    def new_cache(self) -> KVCache:
        return KVCache()

    def run(self, tokens: Sequence[int], cache: KVCache, on_layer: OnLayer | None = None
            ) -> np.ndarray:
        p = self.model.prefill(tokens, cache)
        for layer, k, v in p:
            if on_layer is not None:
                on_layer(layer, k, v)
        assert p.logits is not None
        return p.logits

    def cache_from_kv(self, k: np.ndarray, v: np.ndarray) -> KVCache:
        return KVCache.from_arrays(k, v)

    def kv_of(self, cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
        return cache.arrays()

    def encode(self, text: str) -> list[int]:
        return list(self._tok().encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok().decode(list(ids)))

    def _tok(self) -> Any:
        if self._tokenizer is None:
            raise ValueError("this model has no tokenizer: give token IDs")
        return self._tokenizer


def smollm2_numpy() -> NumpyEngine:
    from relay.model.smollm2 import GGUF_SHA256, MODEL_ID, load_smollm2, load_tokenizer

    tok = load_tokenizer()
    return NumpyEngine(load_smollm2(), model_id=MODEL_ID, revision=GGUF_SHA256,
                       tokenizer=tok, eos=tok.ids.get("<|im_end|>"))


def tiny_numpy(seed: int = 0, **kw: int) -> NumpyEngine:
    from relay.model.llama import tiny_llama

    return NumpyEngine(tiny_llama(seed, **kw), model_id="kvcs-test/tiny-llama",
                       revision=f"seed-{seed}")
