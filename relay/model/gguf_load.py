"""Llama weights from a GGUF file (the `gguf` package reads it; quantized tensors are
dequantized to float32 once, at load time)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .llama import LayerWeights, Llama, LlamaConfig, LlamaWeights


class ModelError(Exception):
    """The model file is missing, altered or not a llama GGUF we can run."""


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        raise ModelError(f"GGUF lacks metadata {key!r}")
    return f.contents()


def unpermute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's conversion permutation of a Q or K weight ([out][in]): GGUF rows of
    a head are interleaved (pairs 2i, 2i+1 rotate together, llama.cpp's "normal" RoPE); Hugging
    Face's are split in halves (i, i + D/2). The inverse of convert_hf_to_gguf's permute()."""
    out, inp = w.shape
    return w.reshape(heads, out // heads // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def config_of(reader: Any) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelError(f"GGUF architecture {arch!r} is not llama")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    head_dim = hidden // heads
    rope_dims = reader.fields.get("llama.rope.dimension_count")
    if rope_dims is not None and int(rope_dims.contents()) != head_dim:
        raise ModelError("partial RoPE (rope.dimension_count < head_dim) is not supported")
    if "llama.rope.scaling.type" in reader.fields:
        raise ModelError("RoPE scaling is not supported")
    vocab_field = reader.fields.get("llama.vocab_size")
    vocab = (int(vocab_field.contents()) if vocab_field is not None
             else len(reader.fields["tokenizer.ggml.tokens"].data))
    return LlamaConfig(
        layers=int(_field(reader, "llama.block_count")), hidden=hidden, heads=heads,
        kv_heads=int(_field(reader, "llama.attention.head_count_kv")), head_dim=head_dim,
        ffn=int(_field(reader, "llama.feed_forward_length")), vocab=vocab,
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")))


def load_gguf(path: str | os.PathLike[str]) -> Llama:
    import gguf  # the optional `model` extra

    reader = gguf.GGUFReader(os.fspath(path))
    cfg = config_of(reader)
    tensors = {t.name: t for t in reader.tensors}

    def get(name: str) -> np.ndarray:
        t = tensors.get(name)
        if t is None:
            raise ModelError(f"GGUF lacks tensor {name!r}")
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        return np.asarray(a, dtype=np.float32)

    def mat(name: str, heads: int | None = None) -> np.ndarray:
        w = get(name)  # [out][in]
        if heads is not None:
            w = unpermute_rope(w, heads)
        return np.ascontiguousarray(w.T)

    layers = []
    for i in range(cfg.layers):
        p = f"blk.{i}."
        layers.append(LayerWeights(
            get(p + "attn_norm.weight"), mat(p + "attn_q.weight", cfg.heads),
            mat(p + "attn_k.weight", cfg.kv_heads), mat(p + "attn_v.weight"),
            mat(p + "attn_output.weight"), get(p + "ffn_norm.weight"),
            mat(p + "ffn_gate.weight"), mat(p + "ffn_up.weight"), mat(p + "ffn_down.weight")))
    embed = np.ascontiguousarray(get("token_embd.weight"))
    # SmolLM2 ties the output head to the embedding: the GGUF then has no output.weight.
    head = mat("output.weight") if "output.weight" in tensors else np.ascontiguousarray(embed.T)
    if embed.shape != (cfg.vocab, cfg.hidden):
        raise ModelError(f"token_embd shape {embed.shape} does not fit the metadata")
    return Llama(cfg, LlamaWeights(embed, layers, get("output_norm.weight"), head))
