"""Hugging Face transformers on PyTorch (CPU) as an engine: SmolLM2-135M-Instruct loaded by
transformers' own GGUF loader from the file the project installs (requirements-model.txt),
and its ``DynamicCache`` <-> KVCS arrays.

transformers' cache is, per layer, K and V ``[batch][kv_heads][tokens][head_dim]``, K after
RoPE in the rotate-half layout (its GGUF loader undoes llama.cpp's interleaving, as
relay/model does): batch 1 of it is the KVCS layout, ``extra.k_layout`` "rope-rotate-half".

Per-layer streaming: the cache is a DynamicCache whose ``update`` (called by each attention
layer with that layer's new K/V, before attention) also hands them to the caller, so a
producer publishes layer l while layers l+1.. are still computed.

Determinism: on the CPU, the same torch build, thread count (``torch.set_num_threads``; the
CLI's --threads) and pass shapes give the same bits; a consumer that replays the producer's
last pass on the fetched cache gets the producer's logits bit for bit (tests/model). Other
thread counts gave the same bits here too, but nothing promises it.

Needs the `engine` extra (transformers, accelerate) and requirements-engine.txt (torch).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from relay.kvcs.descriptor import Descriptor
from relay.model.llama import LlamaConfig
from relay.model.smollm2 import GGUF_SHA256, smollm2_descriptor, verified_gguf_path

from .base import EngineError, OnLayer

INSTALL_HINT = ("install PyTorch's CPU build and transformers with `make install` "
                "(requirements-engine.txt and the `engine` extra)")


def _imports() -> tuple[Any, Any]:
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loader needs it)
        import torch
        import transformers
    except ImportError as e:
        raise EngineError(f"the transformers engine is not installed ({e}): {INSTALL_HINT}"
                          ) from None
    return torch, transformers


def available() -> None:
    """EngineError (exit 2) now, before any work, if torch or transformers is missing."""
    _imports()


class TransformersEngine:
    name = "transformers"

    def __init__(self, model: Any, tokenizer_source: tuple[str, str]) -> None:
        torch, _ = _imports()
        self.torch, self.model = torch, model
        self._tokenizer_source = tokenizer_source
        self._tok: Any = None
        c = model.config
        self.layers = int(c.num_hidden_layers)
        self.kv_heads = int(c.num_key_value_heads)
        self.head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
        rope = getattr(c, "rope_parameters", None) or {}
        self.config = LlamaConfig(
            layers=self.layers, hidden=int(c.hidden_size), heads=int(c.num_attention_heads),
            kv_heads=self.kv_heads, head_dim=self.head_dim, ffn=int(c.intermediate_size),
            vocab=int(c.vocab_size), rope_theta=float(rope.get("rope_theta", 10000.0)),
            norm_eps=float(c.rms_norm_eps))
        eos = c.eos_token_id
        self.eos = int(eos[0] if isinstance(eos, list) else eos) if eos is not None else None
        self._cache_class = _layer_cache_class(torch)

    def descriptor(self, block_tokens: int) -> Descriptor:
        return smollm2_descriptor(self.config, block_tokens)

    def new_cache(self) -> Any:
        return self._cache_class(config=self.model.config)

    def run(self, tokens: Sequence[int], cache: Any, on_layer: OnLayer | None = None
            ) -> np.ndarray:
        torch = self.torch
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        cache.on_layer = on_layer
        try:
            with torch.inference_mode():
                out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        finally:
            cache.on_layer = None
        return np.array(out.logits[0, -1].float().numpy(), dtype=np.float32)

    def cache_from_kv(self, k: np.ndarray, v: np.ndarray) -> Any:
        """A DynamicCache of the model's config holding KVCS arrays [L][H][T][D] (any
        descriptor dtype: widened to the model's float32, exactly)."""
        torch = self.torch
        if k.shape != v.shape or k.ndim != 4 or k.shape[0] != self.layers or \
                k.shape[1] != self.kv_heads or k.shape[3] != self.head_dim:
            raise EngineError(f"a KV cache of shape {k.shape} does not fit the model "
                              f"({self.layers} layers x {self.kv_heads} KV heads x "
                              f"{self.head_dim})")
        dtype = self.model.dtype

        def tensor(a: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(dtype)[None]

        cache = self._cache_class(config=self.model.config)
        for layer in range(self.layers):
            cache.layers[layer].update(tensor(k[layer]), tensor(v[layer]))
        return cache

    def kv_of(self, cache: Any) -> tuple[np.ndarray, np.ndarray]:
        k = np.stack([lay.keys[0].float().numpy() for lay in cache.layers])
        v = np.stack([lay.values[0].float().numpy() for lay in cache.layers])
        return k, v

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._tokenizer()(text)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer().decode(list(ids)))

    def _tokenizer(self) -> Any:
        """transformers' tokenizer from the same GGUF (about 4 s), or from the converted
        copy beside the weights (kept after the first GGUF load), on first use."""
        if self._tok is None:
            from transformers import AutoTokenizer, __version__

            cached = weights_cache_dir(__version__)
            kept = cached / "tokenizer" if cached is not None else None
            if kept is not None and (kept / "tokenizer_config.json").is_file():
                self._tok = AutoTokenizer.from_pretrained(kept, local_files_only=True)
            else:
                folder, name = self._tokenizer_source
                self._tok = AutoTokenizer.from_pretrained(folder, gguf_file=name,
                                                          local_files_only=True)
                if kept is not None and cached is not None and cached.is_dir():
                    _keep_as(kept, self._tok.save_pretrained)
        return self._tok


def _layer_cache_class(torch: Any) -> type:
    from transformers import DynamicCache

    class LayerCache(DynamicCache):  # type: ignore[misc, valid-type]
        """A DynamicCache that hands each layer's new K/V to ``on_layer`` as it stores
        them."""

        on_layer: OnLayer | None = None

        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any,
                   **kwargs: Any) -> Any:
            out = super().update(key_states, value_states, layer_idx, *args, **kwargs)
            if self.on_layer is not None:
                self.on_layer(layer_idx, key_states[0].float().numpy(),
                              value_states[0].float().numpy())
            return out

    return LayerCache


def set_threads(threads: int) -> None:
    torch, _ = _imports()
    torch.set_num_threads(threads)


# Where the converted weights are kept between processes; "off" converts every time.
CACHE_ENV = "KVCS_MODEL_CACHE"
log = logging.getLogger("kvcs.engine")


def weights_cache_dir(transformers_version: str) -> Path | None:
    """The folder of the float32 weights converted from the verified GGUF file: named by the
    file's SHA-256 and the transformers version that converted it, so another file or
    converter never reads a stale copy. It is trusted as the virtualenv is (local files of
    the user's); the GGUF file itself is checked against its SHA-256 on every load."""
    root = os.environ.get(CACHE_ENV)
    if root == "off":
        return None
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or
                            os.path.join(os.path.expanduser("~"), ".cache"), "kvcs")
    return Path(root) / f"smollm2-{GGUF_SHA256[:16]}-float32-transformers{transformers_version}"


def _load_model(torch: Any, transformers: Any) -> tuple[Any, tuple[str, str]]:
    """The model, from the converted copy if there is one (about 0.5 s), else by
    transformers' GGUF loader (about 20 s: it parses the file twice and dequantizes every
    tensor), keeping a converted copy for the next process. The copy holds the loader's
    float32 tensors as they are, so both ways give the same bits (tests/model)."""
    path = verified_gguf_path()
    folder, name = os.fspath(path.parent), path.name
    cached = weights_cache_dir(transformers.__version__)
    if cached is not None and (cached / "model.safetensors").is_file():
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                cached, dtype=torch.float32, local_files_only=True)
            # The tensors are views of the memory-mapped file, at offsets that select other
            # CPU kernels than the GGUF loader's fresh allocations: same weights, different
            # low bits in the logits. Fresh copies compute exactly as the GGUF load does
            # (tests/model compares the two processes' logits by SHA-256).
            with torch.no_grad():
                for p in model.parameters():  # tied weights are one parameter: still tied
                    p.data = p.data.clone()
            return model, (folder, name)
        except (OSError, ValueError) as e:  # a damaged copy: convert again
            log.warning("ignoring the converted weights in %s: %s", cached, e)
    # Its GGUF converter draws a tqdm bar on stderr that no setting turns off.
    with contextlib.redirect_stderr(io.StringIO()):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, local_files_only=True)
    if cached is not None:
        _keep(model, cached)
    return model, (folder, name)


def _keep(model: Any, folder: Path) -> None:
    """transformers refuses to save a model it loaded from GGUF (it counts as quantized), so
    the tensors and the config go out by hand."""
    from safetensors.torch import save_model

    def write(tmp: str) -> None:
        save_model(model, os.path.join(tmp, "model.safetensors"))  # tied weights once
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        Path(tmp, "config.json").write_text(json.dumps(config))

    _keep_as(folder, write)


def _keep_as(folder: Path, write: Callable[[str], object]) -> None:
    """``write`` into a fresh folder beside ``folder``, then rename it into place: a reader
    sees a whole copy or none, and of two processes converting at once one copy wins."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=folder.parent, prefix=".converting-")
        try:
            write(tmp)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:  # a cache is an optimisation: a full disk only costs time
        if not folder.is_dir():
            log.warning("could not keep the converted copy in %s: %s", folder, e)


@functools.lru_cache(maxsize=1)
def load_transformers() -> TransformersEngine:
    """SmolLM2 on transformers, float32 on the CPU, once per process."""
    torch, transformers = _imports()
    # The loader's progress bars and notices are not the command's output.
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model, tokenizer_source = _load_model(torch, transformers)
    model.eval()
    if model.config.model_type != "llama":
        raise EngineError(f"{tokenizer_source[1]} is a {model.config.model_type!r} model, "
                          "not llama")
    return TransformersEngine(model, tokenizer_source)
