"""The KVCS Object payload (kvcs-draft 3.5): a 68-octet header followed by Data.

    Magic(32) Version(8) Component(8) Flags(16) Layer(32) BlockIndex(32) TokenStart(64)
    TokenCount(32) Codec(16) Reserved(16) DataLength(32) DataDigest(256) Data

All fields big-endian. Flags and Reserved are written as zero and ignored on receipt.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import (
    BadMagicError,
    BadVersionError,
    BlockIndexMismatchError,
    DigestMismatchError,
    LayerMismatchError,
    LengthMismatchError,
    PayloadTooShortError,
    UnknownComponentError,
)
from .registry import Component

MAGIC = 0x4B564F31  # "KVO1"
VERSION = 1
HEADER = struct.Struct(">IBBHIIQIHHI32s")
HEADER_LEN = HEADER.size
assert HEADER_LEN == 68

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class ObjectHeader:
    component: Component
    layer: int
    block_index: int
    token_start: int
    token_count: int
    codec: int
    data_length: int
    data_digest: bytes
    flags: int = 0

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, VERSION, int(self.component), self.flags, self.layer,
                           self.block_index, self.token_start, self.token_count, self.codec,
                           0, self.data_length, self.data_digest)


@dataclass(frozen=True)
class VerifiedObject:
    """An Object that passed every check of 3.5; ``data`` is a view into the payload."""

    header: ObjectHeader
    data: memoryview


def encode_object(*, component: Component, layer: int, block_index: int, token_start: int,
                  token_count: int, codec: int, data: Buffer | Sequence[Buffer]) -> bytes:
    """Header + Data. ``data`` may be several parts (e.g. K then V Data for a kv Object),
    which are hashed and joined without an intermediate concatenation."""
    parts = [data] if isinstance(data, bytes | bytearray | memoryview) else list(data)
    h = hashlib.sha256()
    length = 0
    for part in parts:
        h.update(part)
        length += memoryview(part).nbytes
    header = ObjectHeader(Component(component), layer, block_index, token_start, token_count,
                          codec, length, h.digest())
    return b"".join([header.pack(), *parts])


def seal_object(buf: bytearray, *, component: Component, layer: int, block_index: int,
                token_start: int, token_count: int, codec: int) -> None:
    """Header of an Object whose Data already fills ``buf[HEADER_LEN:]``, written into its
    first HEADER_LEN octets: an encoder that writes the Data in place makes the payload with
    one copy of the Data, where ``encode_object`` joins a copy of the parts."""
    data = memoryview(buf)[HEADER_LEN:]
    header = ObjectHeader(Component(component), layer, block_index, token_start, token_count,
                          codec, data.nbytes, hashlib.sha256(data).digest())
    buf[:HEADER_LEN] = header.pack()


def parse_header(payload: Buffer) -> ObjectHeader:
    """Decode the header, checking only what is needed to interpret it (length, magic,
    version, component); use verify_object before trusting the Object."""
    view = memoryview(payload).cast("B")
    if view.nbytes < HEADER_LEN:
        raise PayloadTooShortError(
            f"payload has {view.nbytes} octets, less than the {HEADER_LEN}-octet header"
        )
    (magic, version, component, flags, layer, block_index, token_start, token_count, codec,
     _reserved, data_length, digest) = HEADER.unpack_from(view)
    if magic != MAGIC:
        raise BadMagicError(f"magic is 0x{magic:08X}, not 0x{MAGIC:08X} ('KVO1')")
    if version != VERSION:
        raise BadVersionError(f"version is {version}, not {VERSION}")
    try:
        comp = Component(component)
    except ValueError:
        raise UnknownComponentError(f"component {component} is not 1 (k), 2 (v) or 3 (kv)"
                                    ) from None
    return ObjectHeader(comp, layer, block_index, token_start, token_count, codec,
                        data_length, digest, flags)


def verify_object(payload: Buffer, group_id: int, object_id: int) -> VerifiedObject:
    """Every MUST of kvcs-draft 3.5; raises a PayloadError subclass on the first failure.

    Works on bytes or a memoryview without copying; the returned Data is a slice of it.
    """
    view = memoryview(payload).cast("B")
    header = parse_header(view)
    if header.layer != group_id:
        raise LayerMismatchError(f"layer {header.layer} differs from Group ID {group_id}")
    if header.block_index != object_id:
        raise BlockIndexMismatchError(
            f"block index {header.block_index} differs from Object ID {object_id}"
        )
    if HEADER_LEN + header.data_length != view.nbytes:
        raise LengthMismatchError(
            f"header ({HEADER_LEN}) + Data Length ({header.data_length}) != payload length "
            f"({view.nbytes})"
        )
    data = view[HEADER_LEN:]
    if hashlib.sha256(data).digest() != header.data_digest:
        raise DigestMismatchError(
            f"Data Digest mismatch in layer {header.layer} block {header.block_index}"
        )
    return VerifiedObject(header, data)
