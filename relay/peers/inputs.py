"""Reading the peers' inputs; every failure is an InputError with a one-line message."""

from __future__ import annotations

import json
import os
from pathlib import Path

from relay.kvcs.descriptor import Descriptor
from relay.kvcs.errors import KvcsError
from relay.kvcs.identifiers import load_scope_key, tokens_be
from relay.kvcs.kvfile import KvFile, read_kvfile
from relay.kvcs.namespace import KvcsNamespace, parse_namespace
from relay.moqt import namespace_text

from .errors import InputError

PathLike = str | os.PathLike[str]


def _kvfile(path: PathLike) -> KvFile | None:
    """The KV cache file at ``path``, or None if it is not one (a safetensors file starts
    with its 8-byte header length and then ``{``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return None
    if len(head) < 9 or head[8:9] != b"{":
        return None
    try:
        return read_kvfile(path)
    except KvcsError as e:
        raise InputError(f"{path}: {e}") from None


def load_descriptor(path: PathLike) -> Descriptor:
    """A Compatibility Descriptor from a JSON file, or from a KV cache file carrying one."""
    kv = _kvfile(path)
    if kv is not None:
        return kv.descriptor
    try:
        return Descriptor.from_json(Path(path).read_bytes())
    except OSError as e:
        raise InputError(f"cannot read descriptor {path}: {e.strerror}") from None
    except KvcsError as e:
        raise InputError(f"descriptor {path}: {e}") from None


def parse_tokens(text: str) -> list[int]:
    """A JSON array of integers, or one integer per line (blank lines ignored)."""
    stripped = text.strip()
    try:
        if stripped.startswith("["):
            value = json.loads(stripped)
            if not isinstance(value, list) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in value):
                raise ValueError("the JSON array must hold integers only")
            tokens = [int(t) for t in value]
        else:
            tokens = [int(line) for line in stripped.splitlines() if line.strip()]
        tokens_be(tokens)
    except (ValueError, KvcsError) as e:
        raise InputError(f"token IDs: {e}") from None
    return tokens


def load_tokens(path: PathLike) -> list[int]:
    """Token IDs from a text/JSON file, or from a KV cache file that records them."""
    kv = _kvfile(path)
    if kv is not None:
        if kv.tokens is None:
            raise InputError(f"{path}: the KV cache file records no token IDs")
        return list(kv.tokens)
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read token IDs from {path}: {e}") from None
    try:
        return parse_tokens(text)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None


def load_key(path: PathLike) -> bytes:
    try:
        return load_scope_key(path)
    except OSError as e:
        raise InputError(f"cannot read scope key {path}: {e.strerror}") from None
    except KvcsError as e:
        raise InputError(f"scope key {path}: {e}") from None


def format_namespace(ns: KvcsNamespace) -> str:
    """``kvcs-1/hex:<scope>/hex:<compat>/hex:<anchor>/hex:<pub>``: the one namespace text
    form (relay/moqt/namespace_text.py), as the relay's admin API, tokens and logs write it."""
    return namespace_text.format_namespace(ns.fields)


def parse_namespace_text(text: str) -> KvcsNamespace:
    try:
        return parse_namespace(namespace_text.parse_namespace(text))
    except (ValueError, KvcsError) as e:
        raise InputError(f"namespace {text!r}: {e} (expected kvcs-1/hex:<scope>/hex:<compat>/"
                         "hex:<anchor>/hex:<pub>, as kvcs publish prints it)") from None
