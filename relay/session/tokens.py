"""Token files, and the token a client presents in SETUP (sent as AUTHORIZATION_TOKEN).

Every token the project reads comes from a file, never from a flag (visible in ``ps``), and
every such file is read by :func:`read_token_file`: the token a client presents (the reference
peers' ``--token``, a relay's ``--upstream-token`` and ``--peer-token``) and the admin API's
token (the relay's ``admin_token_file``, ``kvcs admin --token-file``). What a relay *accepts*
in SETUP and requests is relay/core/auth.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from relay.moqt.token import Token


def read_token_file(path: str | os.PathLike[str], min_length: int = 1) -> bytes:
    """The file's one token, surrounding whitespace removed. Raises ValueError with a
    one-line reason when the file cannot be read or holds no token, whitespace inside one
    (two tokens?), or one shorter than ``min_length`` characters."""
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"{path} must hold exactly one token")
    if len(token) < min_length:
        raise ValueError(f"{path} must hold one token of at least {min_length} characters")
    return token.encode()


def tokens_of(value: bytes | None) -> tuple[Token, ...]:
    """The AUTHORIZATION_TOKEN Setup Option a client sends for ``value`` (none: none)."""
    return (Token.use_value(value),) if value else ()


__all__ = ["read_token_file", "tokens_of"]
