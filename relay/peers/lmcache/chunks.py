"""A chunk's MemoryObj as KVCS Objects and back.

LMCache keeps a chunk as one buffer in its KV_2LTD format, [2][layers][tokens][kv_heads *
head_dim] (K, then V). The KVCS layout of a block is [kv_heads][tokens][head_dim] per layer,
so both directions are the same view with the token and head axes swapped: the producer
publishes straight from LMCache's buffer (``chunk_arrays``), and the consumer decodes each
layer's Object into the buffer LMCache allocated (``LayerWriter``) as it arrives, without an
intermediate copy of the chunk.
"""

from __future__ import annotations

import sys

import numpy as np

from relay.kvcs.codecs import copy_into, decode_data
from relay.kvcs.errors import KvcsError
from relay.kvcs.payload import HEADER_LEN, Buffer, seal_object, verify_object
from relay.kvcs.plan import PublicationPlan, TrackSpec
from relay.kvcs.registry import Codec, Component

from .mapping import DATA, ChunkNames


def chunk_arrays(buffer: np.ndarray, names: ChunkNames) -> tuple[np.ndarray, np.ndarray]:
    """K and V as [layers][kv_heads][tokens][head_dim] views of a full chunk's bytes."""
    d = names.descriptor
    a = buffer.view(d.dtype).reshape(2, d.layers, d.block_tokens, d.kv_heads, d.head_dim)
    return a[0].transpose(0, 2, 1, 3), a[1].transpose(0, 2, 1, 3)


class ChunkPlan(PublicationPlan):
    """One chunk as one publication: one segment of one block (the chunk), one data track.
    The Block Key chain of PublicationPlan is replaced by the chunk's anchor key (mapping.py
    says why a connector has no tokens to chain)."""

    def __init__(self, buffer: np.ndarray, names: ChunkNames, scope_key: bytes) -> None:
        k, v = chunk_arrays(buffer, names)
        d = names.descriptor
        # manifest versions at the start and the end only: nobody follows a chunk's
        # production live, and every version is a stream and an Object more per put
        super().__init__(k, v, d, scope_key, [0] * d.block_tokens,
                         pub_id=names.namespace.pub_id, tracks=(DATA,),
                         manifest_every=d.layers)
        self.block_keys = [names.namespace.anchor_key]
        self.namespace = names.namespace

    def _payload(self, spec: TrackSpec, layer: int, first_block: int, obj: int
                 ) -> bytes | bytearray:
        """Layer ``layer``'s Object: K and V copied once, transposed, from LMCache's buffer
        into the payload, its Data Digest taken there (the generic encoder copies each section
        out, then joins them, then joins header and Data: three copies of 11 MiB a chunk)."""
        if spec != DATA or (first_block, obj) != (0, 0) or sys.byteorder != "little":
            return super()._payload(spec, layer, first_block, obj)
        d = self.descriptor
        payload = bytearray(HEADER_LEN + 2 * d.section_bytes)
        kv = np.frombuffer(payload, np.uint8, offset=HEADER_LEN).view(d.dtype).reshape(
            2, d.kv_heads, d.block_tokens, d.head_dim)
        copy_into(kv[0], self.k[layer])
        copy_into(kv[1], self.v[layer])
        seal_object(payload, component=Component.KV, layer=layer, block_index=0,
                    token_start=0, token_count=d.block_tokens, codec=int(Codec.RAW))
        return payload


class LayerWriter:
    """Verifies each layer's Object (kvcs-draft 3.5) and decodes it into ``buffer``."""

    def __init__(self, buffer: np.ndarray, names: ChunkNames) -> None:
        self.names = names
        self.k, self.v = chunk_arrays(buffer, names)
        self.layers: set[int] = set()

    def write(self, layer: int, object_id: int, payload: Buffer) -> None:
        d = self.names.descriptor
        if object_id != 0 or not 0 <= layer < d.layers:
            raise KvcsError(f"Object {{{layer}, {object_id}}} is not a layer of one chunk")
        obj = verify_object(payload, layer, object_id)
        h = obj.header
        if (h.component, h.codec, h.token_start, h.token_count) != \
                (Component.KV, int(Codec.RAW), 0, d.block_tokens):
            raise KvcsError(f"layer {layer}: not a raw kv Object of {d.block_tokens} tokens")
        k, v = decode_data(Codec.RAW, Component.KV, obj.data, d)
        self.k[layer] = k
        self.v[layer] = v
        self.layers.add(layer)

    @property
    def complete(self) -> bool:
        return len(self.layers) == self.names.descriptor.layers
