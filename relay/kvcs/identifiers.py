"""Scope key, Scope ID, Block Keys, Anchor Key and Publication ID (KVSP-PROFILE 2-3).

Scope key files: exactly 32 raw octets, or 64 hexadecimal digits (either case) optionally
surrounded by white space (a trailing newline from ``echo`` or an editor is fine). The two
forms cannot be confused: a hex file is at least 64 octets long.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import string
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from .errors import ScopeKeyError, TokenError

SCOPE_KEY_LEN = 32
PUB_ID_LEN = 16
SCOPE_LABEL = b"KVSP-scope-v1"
BLOCK_LABEL = b"KVSP-block-v1"
BK_INITIAL = bytes(32)  # BK[-1]
_HEX = frozenset(string.hexdigits)


def _check_scope_key(scope_key: bytes) -> bytes:
    if not isinstance(scope_key, bytes | bytearray | memoryview) or len(scope_key) != 32:
        raise ScopeKeyError("scope key must be exactly 32 octets")
    return bytes(scope_key)


def generate_scope_key() -> bytes:
    """A fresh 32-octet scope key from the OS CSPRNG."""
    return secrets.token_bytes(SCOPE_KEY_LEN)


def parse_scope_key(content: bytes) -> bytes:
    """Decode a scope key file's content: 32 raw octets, or 64 hex digits (+ white space)."""
    if len(content) == SCOPE_KEY_LEN:
        return bytes(content)
    text = content.strip()
    if len(text) == 2 * SCOPE_KEY_LEN and all(chr(c) in _HEX for c in text):
        return bytes.fromhex(text.decode("ascii"))
    raise ScopeKeyError(
        f"scope key file must hold 32 raw octets or 64 hex digits, found {len(content)} octets"
    )


def load_scope_key(path: str | os.PathLike[str]) -> bytes:
    """Read a scope key file (see module docstring for the accepted forms)."""
    return parse_scope_key(Path(path).read_bytes())


def write_scope_key(path: str | os.PathLike[str], scope_key: bytes, *, hex_form: bool = False
                    ) -> None:
    """Write a scope key file readable only by its owner (it is a shared secret)."""
    key = _check_scope_key(scope_key)
    data = (key.hex() + "\n").encode() if hex_form else key
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def scope_id(scope_key: bytes) -> bytes:
    """scope_id = HMAC(scope_key, "KVSP-scope-v1")."""
    return hmac.digest(_check_scope_key(scope_key), SCOPE_LABEL, "sha256")


def tokens_be(tokens: Iterable[int] | np.ndarray) -> bytes:
    """Token IDs as 4-octet big-endian unsigned integers, range-checked."""
    arr = np.asarray(tokens if isinstance(tokens, np.ndarray) else list(tokens))
    if arr.size == 0:
        return b""
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TokenError("token IDs must be a flat sequence of integers")
    if int(arr.min()) < 0 or int(arr.max()) > 0xFFFFFFFF:
        raise TokenError("token IDs must be unsigned 32-bit integers")
    return arr.astype(">u4").tobytes()


def next_block_key(scope_key: bytes, compat_id: bytes, previous: bytes, block_tokens_be: bytes
                   ) -> bytes:
    """BK[i] = HMAC(scope_key, "KVSP-block-v1" || compat_id || BK[i-1] || tok_i)."""
    return hmac.digest(scope_key, BLOCK_LABEL + compat_id + previous + block_tokens_be, "sha256")


def block_keys(scope_key: bytes, compat_id: bytes, tokens: Sequence[int] | np.ndarray,
               block_tokens: int, *, previous: bytes = BK_INITIAL) -> list[bytes]:
    """Block Keys of the full blocks of ``tokens``; a trailing partial block gets no key.

    ``previous`` continues a chain (the key of the block before ``tokens[0]``), e.g. for the
    blocks a chunked-prefill segment appends.
    """
    key = _check_scope_key(scope_key)
    if len(compat_id) != 32 or len(previous) != 32:
        raise ValueError("compat_id and the previous Block Key must be 32 octets")
    if block_tokens < 1:
        raise ValueError("block_tokens must be positive")
    raw = tokens_be(tokens)
    step = 4 * block_tokens
    keys: list[bytes] = []
    for start in range(0, len(raw) - step + 1, step):
        previous = next_block_key(key, compat_id, previous, raw[start:start + step])
        keys.append(previous)
    return keys


def anchor_key(keys: Sequence[bytes]) -> bytes:
    """The Anchor Key of a prefix is the Block Key of its last (full) block."""
    if not keys:
        raise ValueError("a prefix shorter than one block has no Anchor Key")
    return keys[-1]


def block_keys_sha256(keys: Iterable[bytes]) -> str:
    """SHA-256 of the concatenated raw Block Keys, lower-case hex (manifest segments)."""
    h = hashlib.sha256()
    for k in keys:
        h.update(k)
    return h.hexdigest()


def new_pub_id() -> bytes:
    """A Publication ID: 16 octets from a CSPRNG, fresh for every production of a cache."""
    return secrets.token_bytes(PUB_ID_LEN)
