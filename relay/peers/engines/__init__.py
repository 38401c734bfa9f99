"""Inference engines for the peers: a real model computes the KV cache a producer publishes
and continues generation from the cache a consumer retrieved. The relay never imports this
package (tests/model/test_engine_imports.py), and nothing here is imported by the peers'
publish/subscribe/fetch path unless an engine is asked for.

- ``base``         the Engine protocol, the descriptor check, greedy decoding
- ``numpy_llama``  the project's numpy Llama (relay/model): no PyTorch needed
- ``hf``           Hugging Face transformers on PyTorch (CPU): DynamicCache <-> KVCS arrays
- ``streaming``    prefill with an engine and publish each layer as soon as it is computed
- ``generate``     a consumer's continuation from a retrieved cache, with its TTFT split
"""

from __future__ import annotations

from .base import Engine, EngineError, check_descriptor, greedy

ENGINES = ("numpy", "transformers")
MODELS = ("smollm2", "tiny")


def require(name: str) -> None:
    """EngineError (exit 2) at once if engine ``name`` cannot be loaded here."""
    if name == "transformers":
        from .hf import available

        available()


def load_engine(name: str, model: str = "smollm2", *, threads: int | None = None) -> Engine:
    """The engine ``name`` running ``model``; the same model, threads pinned if asked for
    (bit-equal logits across processes need equal thread counts)."""
    if name not in ENGINES:
        raise EngineError(f"unknown engine {name!r} (choose from {', '.join(ENGINES)})")
    if name == "transformers":
        if model != "smollm2":
            raise EngineError("the transformers engine runs --model smollm2 only")
        from .hf import load_transformers, set_threads

        if threads is not None:
            set_threads(threads)
        return load_transformers()
    if threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads)  # for the rest of the process
    from .numpy_llama import smollm2_numpy, tiny_numpy

    return tiny_numpy(0) if model == "tiny" else smollm2_numpy()


__all__ = ["ENGINES", "MODELS", "Engine", "EngineError", "check_descriptor", "greedy",
           "load_engine", "require"]
