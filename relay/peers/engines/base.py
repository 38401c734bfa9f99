"""What the peers need from an inference engine, whichever it is: compute a pass over some
tokens on top of its own KV cache (telling each layer's new K/V as soon as it exists), and
turn its cache into KVCS arrays and back.

KVCS arrays are the layout of KVSP-PROFILE section 5 for a whole cache: K and V each
``[layers][kv_heads][tokens][head_dim]`` in the descriptor's dtype, K after RoPE. How the
rotary dimensions of K are paired is not in the profile; the descriptor says it in
``extra.k_layout`` (K_LAYOUT), and a consumer refuses a cache laid out otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from relay.kvcs.descriptor import Descriptor

from ..errors import EXIT_USAGE, PeerError

# (layer, K_new, V_new): the new tokens' K/V of one layer, [kv_heads][n][head_dim] float32,
# handed over as soon as the layer has them (the arrays may be reused after the call).
OnLayer = Callable[[int, np.ndarray, np.ndarray], None]


class EngineError(PeerError):
    """The engine cannot serve this request (missing, or a descriptor for another model or
    layout): a usage error, exit 2."""

    exit_code = EXIT_USAGE


class Engine(Protocol):
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    eos: int | None

    def descriptor(self, block_tokens: int) -> Descriptor:
        """The Compatibility Descriptor of this engine's float32 KV cache."""
        ...

    def new_cache(self) -> Any:
        ...

    def run(self, tokens: Sequence[int], cache: Any, on_layer: OnLayer | None = None
            ) -> np.ndarray:
        """One pass of ``tokens`` on top of ``cache`` (extended in place); the last token's
        next-token logits, float32 [vocab]."""
        ...

    def cache_from_kv(self, k: np.ndarray, v: np.ndarray) -> Any:
        """The engine's cache holding KVCS arrays (any descriptor dtype; computed in
        float32)."""
        ...

    def kv_of(self, cache: Any) -> tuple[np.ndarray, np.ndarray]:
        """KVCS arrays (float32) of the engine's cache. Inspection: the peers publish what
        ``run`` hands ``on_layer``; tests read a cache through this, the inverse of
        :meth:`cache_from_kv`, to compare it bit for bit."""
        ...

    def encode(self, text: str) -> list[int]:
        ...

    def decode(self, ids: Sequence[int]) -> str:
        ...


def _members(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in doc.items():
        if isinstance(value, dict):
            out.update(_members(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def check_descriptor(engine: Engine, d: Descriptor) -> None:
    """Refuse a descriptor that is not the engine's own (for its block size): a cache made
    for another model, revision or K layout would be used silently wrong. The message names
    the first member that differs."""
    own = engine.descriptor(d.block_tokens)
    if d == own:
        return
    got, want = _members(d.doc), _members(own.doc)
    if "extra.k_layout" not in got:
        raise EngineError(f"the descriptor does not say how K is laid out (extra.k_layout); "
                          f"the {engine.name} engine caches K as {want['extra.k_layout']!r}")
    for name in sorted(set(got) | set(want)):
        if got.get(name) != want.get(name):
            raise EngineError(f"the descriptor's {name} is {got.get(name)!r}, the "
                              f"{engine.name} engine's is {want.get(name)!r}")
    raise EngineError(f"the descriptor is not the {engine.name} engine's")


def greedy(engine: Engine, cache: Any, logits: np.ndarray, n: int
           ) -> tuple[list[int], list[np.ndarray]]:
    """Up to ``n`` tokens of greedy continuation from ``logits`` (of the prompt's last
    token), extending ``cache``; stops after the end-of-sequence token. Returns the tokens
    and, per token, the logits it was chosen from."""
    tokens: list[int] = []
    steps = [logits]
    while len(tokens) < n:
        t = int(np.argmax(steps[-1]))
        tokens.append(t)
        if t == engine.eos or len(tokens) == n:
            break
        steps.append(engine.run([t], cache))
    return tokens, steps[:len(tokens)]
