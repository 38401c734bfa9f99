"""The token a client presents in SETUP: read from a file and sent as AUTHORIZATION_TOKEN.

Used by every client of a relay: the reference peers (``--token``) and a relay's own link to
its upstream relay (``--upstream-token``). What a relay *accepts* is relay/core/auth.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from relay.moqt.token import Token


def read_token_file(path: str | os.PathLike[str]) -> bytes:
    """The token a client presents (peers' ``--token``, the relay's ``--upstream-token``):
    the file's text, surrounding whitespace removed. Tokens come from files, never from a
    flag (visible in ``ps``). Raises ValueError with a one-line reason."""
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"{path} must hold exactly one token")
    return token.encode()


def tokens_of(value: bytes | None) -> tuple[Token, ...]:
    """The AUTHORIZATION_TOKEN Setup Option a client sends for ``value`` (none: none)."""
    return (Token.use_value(value),) if value else ()


__all__ = ["read_token_file", "tokens_of"]
