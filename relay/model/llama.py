"""A llama-architecture forward pass in numpy, float32, one sequence, no batching.

Enough of an inference engine to produce the KV cache KVCS carries: per-layer K (after RoPE,
as engines cache it) and V, chunked prefill on top of an existing cache, and next-token
logits. Q/K use the Hugging Face "rotate half" RoPE layout (the GGUF loader undoes
llama.cpp's interleaving permutation), so the cached K is laid out as transformers and vLLM
cache it.

Determinism: every operation is a fixed sequence of numpy calls whose shapes depend only on
(cache length, chunk length), so the same chunking of the same tokens gives the same bits.
Different chunkings agree only within float tolerance (BLAS and softmax reductions change
order with the shapes). Multi-threaded BLAS may split reductions by thread count: pin
threads (threadpoolctl, or OPENBLAS_NUM_THREADS=1) where bit equality across processes
matters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

F32 = np.float32


@dataclass(frozen=True)
class LlamaConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    norm_eps: float

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError("heads must be a multiple of kv_heads and head_dim even")


@dataclass
class LayerWeights:
    """Matrices stored as [in][out] (x @ w), C-contiguous float32."""

    attn_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    ffn_norm: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray


@dataclass
class LlamaWeights:
    embed: np.ndarray  # [vocab][hidden]
    layers: list[LayerWeights]
    out_norm: np.ndarray
    lm_head: np.ndarray  # [hidden][vocab]; the embedding's transpose when tied


@dataclass
class KVCache:
    """Per layer K and V, each [kv_heads][tokens][head_dim] float32 (K after RoPE)."""

    k: list[np.ndarray] = field(default_factory=list)
    v: list[np.ndarray] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return int(self.k[0].shape[1]) if self.k else 0

    @classmethod
    def from_arrays(cls, k: np.ndarray, v: np.ndarray) -> KVCache:
        """From [layers][kv_heads][tokens][head_dim] arrays (e.g. a retrieved cache)."""
        return cls([np.ascontiguousarray(x, dtype=F32) for x in k],
                   [np.ascontiguousarray(x, dtype=F32) for x in v])

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.stack(self.k), np.stack(self.v)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    return (x / np.sqrt(ms + F32(eps))) * w


def rope_tables(positions: np.ndarray, head_dim: int, theta: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [tokens][head_dim] for rotate-half RoPE; angles in float64, then float32, so
    a position's table does not depend on the chunk it is computed in."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang).astype(F32), np.sin(ang).astype(F32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [heads][tokens][head_dim]: x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def silu(x: np.ndarray) -> np.ndarray:
    return x / (F32(1) + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


class Prefill:
    """One prefill (or decode) pass of ``tokens`` on top of ``cache``; iterate it to get
    (layer, K_new, V_new) as each layer finishes (K_new/V_new [kv_heads][n][head_dim], the
    new tokens only; the cache already holds them when they are yielded). ``logits`` (of
    the last token) is set once the iteration ends."""

    def __init__(self, model: Llama, tokens: Sequence[int] | np.ndarray, cache: KVCache
                 ) -> None:
        self.model, self.cache = model, cache
        self.tokens = np.asarray(tokens, dtype=np.int64)
        if self.tokens.ndim != 1 or not len(self.tokens):
            raise ValueError("a pass needs at least one token")
        if self.tokens.min() < 0 or self.tokens.max() >= model.config.vocab:
            raise ValueError(f"token IDs must be below the vocabulary size {model.config.vocab}")
        if cache.k and len(cache.k) != model.config.layers:
            raise ValueError("the cache has another number of layers")
        self.logits: np.ndarray | None = None

    def __iter__(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        m, c = self.model, self.model.config
        start = self.cache.tokens
        n = len(self.tokens)
        cos, sin = rope_tables(np.arange(start, start + n), c.head_dim, c.rope_theta)
        # Query i sits at position start+i and sees keys 0..start+i.
        mask = np.triu(np.full((n, start + n), -np.inf, dtype=F32), k=start + 1)
        x = m.weights.embed[self.tokens]
        first = not self.cache.k
        for li, w in enumerate(m.weights.layers):
            h = rms_norm(x, w.attn_norm, c.norm_eps)
            q = (h @ w.wq).reshape(n, c.heads, c.head_dim).transpose(1, 0, 2)
            k = (h @ w.wk).reshape(n, c.kv_heads, c.head_dim).transpose(1, 0, 2)
            v = (h @ w.wv).reshape(n, c.kv_heads, c.head_dim).transpose(1, 0, 2)
            q = apply_rope(q, cos, sin)
            k = np.ascontiguousarray(apply_rope(k, cos, sin))
            v = np.ascontiguousarray(v)
            if first:
                self.cache.k.append(k)
                self.cache.v.append(v)
            else:
                self.cache.k[li] = np.concatenate([self.cache.k[li], k], axis=1)
                self.cache.v[li] = np.concatenate([self.cache.v[li], v], axis=1)
            x = x + m.attention(q, self.cache.k[li], self.cache.v[li], mask) @ w.wo
            h = rms_norm(x, w.ffn_norm, c.norm_eps)
            x = x + (silu(h @ w.w_gate) * (h @ w.w_up)) @ w.w_down
            yield li, k, v
        last = rms_norm(x[-1:], m.weights.out_norm, c.norm_eps)
        self.logits = (last @ m.weights.lm_head)[0]


class Llama:
    def __init__(self, config: LlamaConfig, weights: LlamaWeights) -> None:
        self.config, self.weights = config, weights
        self.group = config.heads // config.kv_heads

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray
                  ) -> np.ndarray:
        """Grouped-query attention; q [heads][n][D], k/v [kv_heads][T][D] -> [n][heads*D]."""
        c = self.config
        kk = np.repeat(k, self.group, axis=0)
        vv = np.repeat(v, self.group, axis=0)
        scores = (q @ kk.transpose(0, 2, 1)) * F32(1 / np.sqrt(c.head_dim)) + mask
        out = softmax(scores) @ vv
        return out.transpose(1, 0, 2).reshape(q.shape[1], c.heads * c.head_dim)

    def prefill(self, tokens: Sequence[int] | np.ndarray, cache: KVCache | None = None
                ) -> Prefill:
        return Prefill(self, tokens, cache if cache is not None else KVCache())

    def forward(self, tokens: Sequence[int] | np.ndarray, cache: KVCache) -> np.ndarray:
        """Run a whole pass (extending ``cache``); the last token's logits [vocab]."""
        p = self.prefill(tokens, cache)
        for _ in p:
            pass
        assert p.logits is not None
        return p.logits


def tiny_llama(seed: int = 0, *, layers: int = 2, hidden: int = 32, heads: int = 4,
               kv_heads: int = 2, head_dim: int = 8, ffn: int = 64, vocab: int = 256
               ) -> Llama:
    """A seeded random-weight model of the same code, for fast tests."""
    cfg = LlamaConfig(layers, hidden, heads, kv_heads, head_dim, ffn, vocab,
                      rope_theta=10000.0, norm_eps=1e-5)
    rng = np.random.Generator(np.random.PCG64(seed))

    def mat(i: int, o: int) -> np.ndarray:
        return (rng.standard_normal((i, o)) / np.sqrt(i)).astype(F32)

    def norm() -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(hidden)).astype(F32)

    blocks = [LayerWeights(norm(), mat(hidden, heads * head_dim), mat(hidden, kv_heads * head_dim),
                           mat(hidden, kv_heads * head_dim), mat(heads * head_dim, hidden),
                           norm(), mat(hidden, ffn), mat(hidden, ffn), mat(ffn, hidden))
              for _ in range(layers)]
    embed = rng.standard_normal((vocab, hidden)).astype(F32)
    return Llama(cfg, LlamaWeights(embed, blocks, norm(), np.ascontiguousarray(embed.T)))
