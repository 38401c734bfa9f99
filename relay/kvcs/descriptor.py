"""KVSP Compatibility Descriptor and Compatibility ID (KVSP-PROFILE section 1).

The descriptor stays a plain JSON object (``dict``) because unknown members are allowed and
hashed like the rest; ``Descriptor`` wraps a validated copy and gives typed access to the
members the profile interprets.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .errors import DescriptorError

COMPAT_LABEL = b"KVSP-compat-v1"
MAX_SAFE = 2**53  # |n| < 2^53: integers any JSON implementation represents exactly

# Explicitly little-endian where numpy allows it; ml_dtypes types are native-order, and the
# codecs byte-swap them on a big-endian host (see codecs.le_bytes).
_NUMPY_DTYPES = {"float32": "<f4", "float16": "<f2"}
_ML_DTYPES = ("bfloat16", "float8_e4m3fn")


class _Dtypes(Mapping[str, "np.dtype[Any]"]):
    """The descriptor dtypes by name. ml_dtypes is imported at the first lookup of one of its
    types: its import takes about half a second of CPU, which every `kvcs` command (the relay
    included) paid at start-up although most never build a tensor."""

    def __getitem__(self, name: str) -> np.dtype[Any]:
        if name in _NUMPY_DTYPES:
            return np.dtype(_NUMPY_DTYPES[name])
        if name in _ML_DTYPES:
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, name))
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter((*_NUMPY_DTYPES, *_ML_DTYPES))

    def __len__(self) -> int:
        return len(_NUMPY_DTYPES) + len(_ML_DTYPES)


DTYPES: Mapping[str, np.dtype[Any]] = _Dtypes()

_STRING_MEMBERS = ("model", "revision", "tokenizer")
_POSITIVE_INT_MEMBERS = ("layers", "kv_heads", "head_dim", "block_tokens")
REQUIRED_MEMBERS = (
    "kvsp", "model", "revision", "adapters", "tokenizer", "layers", "kv_heads", "head_dim",
    "dtype", "block_tokens", "position", "tp",
)


def _check_json_value(value: Any, path: str) -> None:
    """Numbers integers only with |n| < 2^53, names ASCII, only JSON types, at every level."""
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise DescriptorError(f"{path}: string is not valid Unicode ({exc})") from None
        return
    if isinstance(value, int):
        if not -MAX_SAFE < value < MAX_SAFE:
            raise DescriptorError(f"{path}: integer {value} is outside |n| < 2^53")
        return
    if isinstance(value, float):
        raise DescriptorError(
            f"{path}: number {value!r} is not an integer; write fractional values as strings"
        )
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json_value(item, f"{path}[{i}]")
        return
    if isinstance(value, Mapping):
        for name, item in value.items():
            if not isinstance(name, str):
                raise DescriptorError(f"{path}: member name {name!r} is not a string")
            if not name.isascii():
                raise DescriptorError(f"{path}: member name {name!r} is not ASCII")
            _check_json_value(item, f"{path}.{name}")
        return
    raise DescriptorError(f"{path}: {type(value).__name__} is not a JSON type")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_descriptor(doc: Any) -> dict[str, Any]:
    """Check ``doc`` against KVSP-PROFILE section 1; return a plain-JSON deep copy.

    Raises DescriptorError naming the offending member.
    """
    if not isinstance(doc, Mapping):
        raise DescriptorError(f"descriptor must be a JSON object, not {type(doc).__name__}")
    _check_json_value(doc, "descriptor")
    missing = [m for m in REQUIRED_MEMBERS if m not in doc]
    if missing:
        raise DescriptorError(f"descriptor lacks required member(s): {', '.join(missing)}")
    if not _is_int(doc["kvsp"]) or doc["kvsp"] != 1:
        raise DescriptorError(f"descriptor.kvsp must be the integer 1, not {doc['kvsp']!r}")
    for name in _STRING_MEMBERS:
        if not isinstance(doc[name], str):
            raise DescriptorError(f"descriptor.{name} must be a string")
    for name in _POSITIVE_INT_MEMBERS:
        if not _is_int(doc[name]) or doc[name] < 1:
            raise DescriptorError(f"descriptor.{name} must be a positive integer, "
                                  f"not {doc[name]!r}")
    if doc["dtype"] not in DTYPES:
        raise DescriptorError(
            f"descriptor.dtype {doc['dtype']!r} is not one of {', '.join(DTYPES)}"
        )
    adapters = doc["adapters"]
    if not isinstance(adapters, list | tuple) or not all(isinstance(a, str) for a in adapters):
        raise DescriptorError("descriptor.adapters must be an array of strings")
    # Sorted by code point (Python's str order), which is what a canonicalizer would produce.
    if list(adapters) != sorted(adapters):
        raise DescriptorError("descriptor.adapters must be sorted")
    if not isinstance(doc["position"], Mapping):
        raise DescriptorError("descriptor.position must be an object")
    tp = doc["tp"]
    if (not isinstance(tp, list | tuple) or len(tp) != 2 or not all(_is_int(x) for x in tp)):
        raise DescriptorError(f"descriptor.tp must be an array of 2 integers [rank, size], "
                              f"not {tp!r}")
    rank, size = tp
    if size < 1 or not 0 <= rank < size:
        raise DescriptorError(f"descriptor.tp [rank, size] needs 0 <= rank < size, got {tp!r}")
    if "extra" in doc and not isinstance(doc["extra"], Mapping):
        raise DescriptorError("descriptor.extra must be an object")
    # A JSON round trip turns tuples into lists and detaches the copy from the caller's dict.
    copy: dict[str, Any] = json.loads(json.dumps(doc))
    return copy


def canonical_json(doc: Mapping[str, Any]) -> bytes:
    """Canonical UTF-8 JSON of a validated descriptor (coincides with RFC 8785 for it)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


class Descriptor:
    """A validated Compatibility Descriptor with typed access to the members KVCS uses.

    ``doc`` is the validated JSON object; treat it as read-only.
    """

    __slots__ = ("_canonical", "doc")

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc: dict[str, Any] = validate_descriptor(doc)
        self._canonical = canonical_json(self.doc)

    def __repr__(self) -> str:
        return f"Descriptor({self._canonical.decode()})"

    @classmethod
    def from_json(cls, text: str | bytes) -> Descriptor:
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DescriptorError(f"descriptor is not valid JSON: {exc}") from None
        return cls(doc)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Descriptor) and self.canonical_json() == other.canonical_json()

    def __hash__(self) -> int:
        return hash(self.canonical_json())

    def canonical_json(self) -> bytes:
        return self._canonical

    @property
    def compat_id(self) -> bytes:
        """compat_id = SHA-256("KVSP-compat-v1" || 0x00 || canonical_json)."""
        return hashlib.sha256(COMPAT_LABEL + b"\x00" + self.canonical_json()).digest()

    @property
    def layers(self) -> int:
        return int(self.doc["layers"])

    @property
    def kv_heads(self) -> int:
        return int(self.doc["kv_heads"])

    @property
    def head_dim(self) -> int:
        return int(self.doc["head_dim"])

    @property
    def block_tokens(self) -> int:
        return int(self.doc["block_tokens"])

    @property
    def dtype_name(self) -> str:
        return str(self.doc["dtype"])

    @property
    def dtype(self) -> np.dtype[Any]:
        return DTYPES[self.dtype_name]

    @property
    def section_bytes(self) -> int:
        """Length of one raw K (or V) section: kv_heads * B * head_dim * sizeof(dtype)."""
        return self.kv_heads * self.block_tokens * self.head_dim * self.dtype.itemsize


def make_descriptor(
    *,
    model: str,
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype: str,
    block_tokens: int,
    revision: str = "main",
    tokenizer: str | None = None,
    adapters: list[str] | None = None,
    position: Mapping[str, Any] | None = None,
    tp: tuple[int, int] = (0, 1),
    extra: Mapping[str, Any] | None = None,
) -> Descriptor:
    """Build a Descriptor from keyword arguments (adapters are sorted for the caller)."""
    doc: dict[str, Any] = {
        "kvsp": 1,
        "model": model,
        "revision": revision,
        "adapters": sorted(adapters or []),
        "tokenizer": tokenizer if tokenizer is not None else f"{model}@{revision}",
        "layers": layers,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "dtype": dtype,
        "block_tokens": block_tokens,
        "position": dict(position) if position is not None
        else {"type": "rope", "theta": "500000", "scaling": "none"},
        "tp": list(tp),
    }
    if extra is not None:
        doc["extra"] = dict(extra)
    return Descriptor(doc)
