"""A Track Namespace (and a Track Name) as text: the one form the relay prints and reads.

The same text is written in the token table (``[[auth.tokens]] prefixes``), given to and
printed by the admin API (``kvcs admin state|purge``), printed and read by the peers
(``kvcs publish`` prints, ``kvcs fetch --namespace`` reads) and written in the logs, so a
namespace copied from any of them can be pasted into any other (docs/configuration.md,
"Track Namespaces as text").

The form: fields joined by ``/``. A field is written as itself when it is made only of
letters, digits, ``-``, ``.``, ``_`` and ``~`` (URL-unreserved: safe unquoted in a shell, a
URL, JSON and TOML); any other field (octets, an empty field, one with ``/`` or ``:``, so
one beginning with ``hex:`` too) is ``hex:`` and its octets in lower-case hex. A KVCS
namespace therefore reads ``kvcs-1/hex:<scope_id>/hex:<compat_id>/hex:<anchor_key>/hex:<pub_id>``
(its binary IDs are never all text in practice, but would be written as text if they were).

Reading is lenient where nothing is ambiguous: surrounding whitespace and empty parts (a
leading, trailing or doubled ``/``) are skipped, upper-case hex digits are taken, and a part
not beginning with ``hex:`` is text, whatever its characters (encoded as UTF-8), as the token
table always read it. Sans-IO: no dependency beyond the standard
library.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["HEX", "format_field", "format_full_track_name", "format_namespace",
           "parse_field", "parse_namespace"]

HEX = "hex:"
_TEXT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def format_field(field: bytes) -> str:
    """One namespace field (or a Track Name): itself when plain text, else ``hex:…``."""
    if field and _TEXT.issuperset(field):
        return field.decode("ascii")
    return HEX + field.hex()


def parse_field(part: str) -> bytes:
    """The inverse of :func:`format_field`; raises ValueError with a one-line reason."""
    if not part.startswith(HEX):
        return part.encode()
    try:
        return bytes.fromhex(part[len(HEX):])
    except ValueError:
        raise ValueError(f"field {part!r}: after 'hex:' only pairs of hex digits") from None


def format_namespace(ns: Sequence[bytes]) -> str:
    """``kvcs-1/hex:00ff…``: fields joined by ``/``; the empty namespace is ``""``."""
    return "/".join(format_field(bytes(f)) for f in ns)


def parse_namespace(text: str) -> tuple[bytes, ...]:
    """The inverse of :func:`format_namespace` (a prefix is a namespace: it may stop after
    any field). Raises ValueError with a one-line reason."""
    return tuple(parse_field(p) for p in text.strip().split("/") if p)


def format_full_track_name(ns: Sequence[bytes], name: bytes) -> str:
    """``<namespace> <name>``: a space never occurs in either, so the two stay apart."""
    return f"{format_namespace(ns)} {format_field(name)}"
