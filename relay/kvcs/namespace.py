"""The five-field KVCS Track Namespace (kvcs-draft 3.1).

("kvcs-1", scope_id, compat_id, anchor_key, pub_id); fields 1-4 are raw octets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import NamespaceError

NAMESPACE_TAG = b"kvcs-1"
_FIELD_SIZES = (("scope_id", 32), ("compat_id", 32), ("anchor_key", 32), ("pub_id", 16))

Namespace = tuple[bytes, ...]


def _check(name: str, value: bytes, size: int) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise NamespaceError(f"{name} must be octets, not {type(value).__name__}")
    if len(value) != size:
        raise NamespaceError(f"{name} must be {size} octets, not {len(value)}")
    return bytes(value)


@dataclass(frozen=True)
class KvcsNamespace:
    """One publication's namespace; ``fields`` is what goes on the wire."""

    scope_id: bytes
    compat_id: bytes
    anchor_key: bytes
    pub_id: bytes

    def __post_init__(self) -> None:
        for name, size in _FIELD_SIZES:
            object.__setattr__(self, name, _check(name, getattr(self, name), size))

    @property
    def fields(self) -> Namespace:
        return (NAMESPACE_TAG, self.scope_id, self.compat_id, self.anchor_key, self.pub_id)

    @property
    def scope_prefix(self) -> Namespace:
        return scope_prefix(self.scope_id)

    @property
    def content_prefix(self) -> Namespace:
        return content_prefix(self.scope_id, self.compat_id, self.anchor_key)


def scope_prefix(scope_id: bytes) -> Namespace:
    """("kvcs-1", scope_id): all publications of a scope, the unit of authorization."""
    return (NAMESPACE_TAG, _check("scope_id", scope_id, 32))


def content_prefix(scope_id: bytes, compat_id: bytes, anchor_key: bytes) -> Namespace:
    """("kvcs-1", scope_id, compat_id, anchor_key): all publications of one token prefix."""
    return (NAMESPACE_TAG, _check("scope_id", scope_id, 32),
            _check("compat_id", compat_id, 32), _check("anchor_key", anchor_key, 32))


def parse_namespace(fields: Sequence[bytes]) -> KvcsNamespace:
    """Parse a full KVCS namespace; raises NamespaceError for anything else."""
    if len(fields) != 5:
        raise NamespaceError(f"a KVCS namespace has exactly 5 fields, not {len(fields)}")
    if bytes(fields[0]) != NAMESPACE_TAG:
        raise NamespaceError(f"field 0 must be {NAMESPACE_TAG!r}, not {bytes(fields[0])!r}")
    return KvcsNamespace(*(bytes(f) for f in fields[1:]))

