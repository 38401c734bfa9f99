"""The Token structure of AUTHORIZATION_TOKEN (§6.6), used as a Setup Option and a parameter."""

from __future__ import annotations

from dataclasses import dataclass

from .codes import AliasType, SessionErrorCode
from .errors import SessionError
from .reader import Reader
from .vi64 import encode_vi64

__all__ = ["Token", "decode_token", "encode_token"]


@dataclass(frozen=True, slots=True)
class Token:
    """``alias`` is present for DELETE/REGISTER/USE_ALIAS; ``token_type``/``value`` for
    REGISTER/USE_VALUE. This profile sends USE_VALUE with Token Type 0."""

    alias_type: AliasType = AliasType.USE_VALUE
    alias: int | None = None
    token_type: int | None = 0
    value: bytes = b""

    @classmethod
    def use_value(cls, value: bytes, token_type: int = 0) -> Token:
        return cls(AliasType.USE_VALUE, None, token_type, value)


def _has_alias(t: AliasType) -> bool:
    return t != AliasType.USE_VALUE


def _has_value(t: AliasType) -> bool:
    return t in (AliasType.REGISTER, AliasType.USE_VALUE)


def encode_token(tok: Token) -> bytes:
    at = AliasType(tok.alias_type)
    out = [encode_vi64(at)]
    if _has_alias(at):
        if tok.alias is None:
            raise ValueError(f"{at.name} token needs an alias")
        out.append(encode_vi64(tok.alias))
    if _has_value(at):
        if tok.token_type is None:
            raise ValueError(f"{at.name} token needs a Token Type")
        out.append(encode_vi64(tok.token_type))
        out.append(bytes(tok.value))
    elif tok.value:
        raise ValueError(f"{at.name} token carries no value")
    return b"".join(out)


def decode_token(raw: bytes) -> Token:
    """Decode a whole parameter / option value; undecodable → KEY_VALUE_FORMATTING_ERROR."""
    try:
        r = Reader(raw)
        code = r.vi64()
        try:
            at = AliasType(code)
        except ValueError:
            raise SessionError(
                SessionErrorCode.KEY_VALUE_FORMATTING_ERROR, f"unknown token Alias Type {code}"
            ) from None
        alias = r.vi64() if _has_alias(at) else None
        if _has_value(at):
            return Token(at, alias, r.vi64(), r.rest())
        r.expect_end("token")
        return Token(at, alias, None, b"")
    except SessionError as e:
        if e.code == SessionErrorCode.KEY_VALUE_FORMATTING_ERROR:
            raise
        raise SessionError(
            SessionErrorCode.KEY_VALUE_FORMATTING_ERROR, f"undecodable token: {e.reason}"
        ) from None
