"""LMCache's CacheEngineKey as KVCS names (docs/engines.md, "LMCache").

A key is (model name, world size, worker id, chunk hash, dtype, tags). One chunk (``chunk_size``
tokens of every layer, LMCache's unit of storage) becomes one KVCS publication:

- **scope**: the connector's scope key, as everywhere (Scope ID = HMAC(scope key, ...)); a
  connector with another scope key names other namespaces and sees nothing of this one.
- **Compatibility ID**: of a KVSP descriptor built from the key and LMCache's metadata: model
  = the key's model name, ``tp`` = (worker id, world size), layers / KV heads / head dim from
  the engine's KV shape, dtype from the key, ``block_tokens`` = the chunk size, and
  ``extra.kvcs_keys = "lmcache-chunk-hash"`` so that no token-keyed publication of the same
  model ever shares it.
- **anchor key**: HMAC(scope key, "KVCS-lmcache-chunk-v1" || Compatibility ID || chunk hash
  || tags). Not a KVSP Block Key: a RemoteConnector is given the chunk's hash, never its
  tokens, so it cannot chain HMACs over token IDs. LMCache's chunk hash is itself a hash of
  the whole prefix, so the anchor key still names a prefix; keying it with the scope key keeps
  the hash (a function of the prompt) out of the relay's namespace table.
- **Publication ID**: the first 16 octets of HMAC(scope key, "KVCS-lmcache-pub-v1" || anchor
  key): deterministic, so ``exists`` and ``get`` address the chunk without discovery, and a
  second store of the chunk is the same publication.
- **tracks**: ``manifest`` and one data track ``kv.raw.s0``: Group g = layer g, Object 0 =
  the chunk's K and V of that layer in the KVCS layout ([kv_heads][tokens][head_dim], raw).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Any

from relay.kvcs.descriptor import Descriptor, make_descriptor
from relay.kvcs.identifiers import scope_id
from relay.kvcs.namespace import KvcsNamespace
from relay.kvcs.plan import TrackSpec
from relay.kvcs.registry import Codec, Component

CHUNK_LABEL = b"KVCS-lmcache-chunk-v1"
PUB_LABEL = b"KVCS-lmcache-pub-v1"
KEYS_MARK = "lmcache-chunk-hash"
DATA = TrackSpec(Component.KV, Codec.RAW)
DATA_TRACK = DATA.name(0)
# LMCache's dtype names (CacheEngineKey) -> KVSP descriptor dtypes
DTYPES = {"half": "float16", "float": "float32", "bfloat16": "bfloat16"}


@dataclass(frozen=True)
class EngineShape:
    """What LMCache's metadata says about every chunk of one engine."""

    layers: int
    kv_heads: int
    head_dim: int
    chunk_tokens: int


@dataclass(frozen=True)
class ChunkNames:
    descriptor: Descriptor
    namespace: KvcsNamespace


@dataclass
class KeyMapper:
    scope_key: bytes
    shape: EngineShape
    _descriptors: dict[tuple[Any, ...], Descriptor] = field(default_factory=dict)

    def descriptor(self, model: str, world_size: int, worker_id: int, dtype: str
                   ) -> Descriptor:
        """The KVSP descriptor of one engine's chunks (cached: every key of an engine asks)."""
        ident = (model, world_size, worker_id, dtype)
        d = self._descriptors.get(ident)
        if d is None:
            if dtype not in DTYPES:
                raise ValueError(f"LMCache dtype {dtype!r} has no KVSP dtype")
            s = self.shape
            d = make_descriptor(model=model, layers=s.layers, kv_heads=s.kv_heads,
                                head_dim=s.head_dim, dtype=DTYPES[dtype],
                                block_tokens=s.chunk_tokens, tp=(worker_id, world_size),
                                extra={"kvcs_keys": KEYS_MARK})
            self._descriptors[ident] = d
        return d

    def names(self, model: str, world_size: int, worker_id: int, dtype: str, chunk_hash: int,
              tags: tuple[tuple[str, Any], ...] | None = None) -> ChunkNames:
        d = self.descriptor(model, world_size, worker_id, dtype)
        # the hash is a Python int of any sign and size: its decimal text is unambiguous
        msg = CHUNK_LABEL + d.compat_id + str(chunk_hash).encode()
        if tags:
            msg += repr(tuple(tags)).encode()
        anchor = hmac.digest(self.scope_key, msg, hashlib.sha256)
        pub = hmac.digest(self.scope_key, PUB_LABEL + anchor, hashlib.sha256)[:16]
        return ChunkNames(d, KvcsNamespace(scope_id(self.scope_key), d.compat_id, anchor, pub))
