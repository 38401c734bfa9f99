"""Generate the KVSP / KVCS test vectors in tests/kvcs/vectors/ (KVSP-PROFILE 7).

Run once, by hand, and check the JSON in: ``.venv/bin/python tests/kvcs/make_vectors.py``.
test_kvcs_vectors.py recomputes every value with the library and compares, so a change in
any definition shows as a failing test. Inputs are written out literally in the JSON; the
vectors do not depend on the synthetic generator.

zstd frames depend on the compressor's version and level, so the zstd vector pins decoding
(frame -> raw octets) and only checks that our encoder round-trips, not its exact output.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from relay.kvcs.codecs import encode_data, int8_quantize, raw_section, section
from relay.kvcs.descriptor import DTYPES, Descriptor, canonical_json, make_descriptor
from relay.kvcs.identifiers import anchor_key, block_keys, block_keys_sha256, scope_id
from relay.kvcs.payload import encode_object
from relay.kvcs.registry import Codec, Component

VECTORS = Path(__file__).parent / "vectors"

DESCRIPTORS: list[dict[str, Any]] = [
    make_descriptor(model="meta-llama/Llama-3.1-8B-Instruct", revision="0e9e39f",
                    tokenizer="meta-llama/Llama-3.1-8B-Instruct@0e9e39f", layers=32, kv_heads=8,
                    head_dim=128, dtype="bfloat16", block_tokens=16).doc,
    {
        "kvsp": 1, "model": "örg/modèl-ß", "revision": "sha256:ab\"c\\d\n", "tokenizer": "t@1",
        "adapters": ["lora-a", "lora-b"], "layers": 2, "kv_heads": 2, "head_dim": 3,
        "dtype": "float16", "block_tokens": 2,
        "position": {"type": "rope", "theta": "10000", "scaling": {"factor": "8.0"}},
        "tp": [1, 2], "extra": {"zeta": [1, -2, True, None], "alpha": "x"},
        "unknown_member": 9007199254740991,
    },
]

SCOPE_KEYS = [bytes(32), bytes(range(32)), bytes.fromhex("ff" * 32)]

# The tiny cache: layers 2, kv_heads 2, tokens 4, head_dim 3, block_tokens 2. Values are
# small multiples of 1/8, exact in every dtype of the profile (float8_e4m3fn included).
TINY_SHAPE = (2, 2, 4, 3)


def tiny_values(offset: float) -> list[float]:
    n = int(np.prod(TINY_SHAPE))
    return [((i * 7 + int(offset * 8)) % 33 - 16) / 8 for i in range(n)]


def tiny_cache(dtype: str) -> tuple[np.ndarray, np.ndarray, Descriptor]:
    k = np.array(tiny_values(0.0), dtype=np.float32).reshape(TINY_SHAPE).astype(DTYPES[dtype])
    v = np.array(tiny_values(1.0), dtype=np.float32).reshape(TINY_SHAPE).astype(DTYPES[dtype])
    desc = make_descriptor(model="tiny", revision="0", layers=2, kv_heads=2, head_dim=3,
                           dtype=dtype, block_tokens=2)
    return k, v, desc


def compat_vectors() -> list[dict[str, Any]]:
    out = []
    for doc in DESCRIPTORS:
        d = Descriptor(doc)
        out.append({"descriptor": doc, "canonical_json": canonical_json(d.doc).decode("utf-8"),
                    "compat_id": d.compat_id.hex()})
    return out


def scope_vectors() -> list[dict[str, str]]:
    return [{"scope_key": k.hex(), "scope_id": scope_id(k).hex()} for k in SCOPE_KEYS]


def block_key_vectors() -> list[dict[str, Any]]:
    out = []
    compat = Descriptor(DESCRIPTORS[0]).compat_id
    for key, block_tokens, tokens in [
        (SCOPE_KEYS[1], 4, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),  # 2 full blocks, 2 tokens dropped
        (SCOPE_KEYS[2], 2, [0xFFFFFFFF, 0, 128000, 9906, 1, 2**31]),
    ]:
        keys = block_keys(key, compat, tokens, block_tokens)
        out.append({"scope_key": key.hex(), "compat_id": compat.hex(),
                    "block_tokens": block_tokens, "tokens": tokens,
                    "block_keys": [k.hex() for k in keys], "anchor_key": anchor_key(keys).hex(),
                    "block_keys_sha256": block_keys_sha256(keys)})
    return out


def raw_vectors() -> list[dict[str, Any]]:
    out = []
    for dtype in DTYPES:
        k, v, desc = tiny_cache(dtype)
        sections = []
        for layer in range(2):
            for block in range(2):
                rk = raw_section(k, layer, block, 2)
                rv = raw_section(v, layer, block, 2)
                kv_obj = encode_object(component=Component.KV, layer=layer, block_index=block,
                                       token_start=block * 2, token_count=2, codec=0,
                                       data=[rk, rv])
                sections.append({"layer": layer, "block": block, "raw_k": rk.hex(),
                                 "raw_v": rv.hex(),
                                 "layer_digest": hashlib.sha256(rk + rv).hexdigest(),
                                 "kv_raw_object": kv_obj.hex()})
        out.append({"dtype": dtype, "descriptor": desc.doc, "shape": list(TINY_SHAPE),
                    "k": tiny_values(0.0), "v": tiny_values(1.0), "sections": sections})
    return out


def codec_vectors() -> dict[str, Any]:
    k, v, desc = tiny_cache("float32")
    ks, vs = section(k, 1, 1, 2), section(v, 1, 1, 2)
    zstd = {"raw": (ks.tobytes() + vs.tobytes()).hex(),
            "frame": encode_data(Codec.ZSTD, Component.KV, ks, vs).hex()}
    # int8 input with awkward values: zeros, a negative maximum, ties at .5 steps.
    x = np.array([[[0.0, 0.0, 0.0], [-1.27, 0.5, 0.005]],
                  [[3.0, -1.5, 0.75], [1e-3, -2e-3, 3e-3]]], dtype=np.float32)
    scales, q = int8_quantize(x)
    int8_desc = make_descriptor(model="tiny", revision="0", layers=1, kv_heads=2, head_dim=3,
                                dtype="float32", block_tokens=2)
    int8 = {"descriptor": int8_desc.doc, "input": x.ravel().tolist(),
            "scales_f16_hex": scales.astype("<f2").tobytes().hex(),
            "q": q.ravel().tolist(),
            "data": encode_data(Codec.INT8, Component.K, x).hex(),
            "decoded": (q.astype(np.float32) * scales.astype(np.float32)[..., None]
                        ).ravel().tolist()}
    return {"zstd": {"descriptor": desc.doc, "component": "kv", **zstd}, "int8": int8}


def compute_vectors() -> dict[str, Any]:
    return {"compat_id.json": compat_vectors(), "scope_id.json": scope_vectors(),
            "block_keys.json": block_key_vectors(), "raw_sections.json": raw_vectors(),
            "codecs.json": codec_vectors()}


def main() -> None:
    VECTORS.mkdir(exist_ok=True)
    for name, data in compute_vectors().items():
        (VECTORS / name).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n",
                                    encoding="utf-8")
        print("wrote", VECTORS / name)


if __name__ == "__main__":
    main()
