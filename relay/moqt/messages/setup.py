"""SETUP (0x2F00) and GOAWAY (0x10): the control-stream messages (§4.1–§4.3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from ..codes import AliasType, MessageType, SessionErrorCode, SetupOption
from ..errors import SessionError, protocol_violation
from ..kvp import KeyValuePair, decode_kvps, encode_kvps
from ..reader import Reader
from ..token import Token, decode_token, encode_token
from ..vi64 import encode_vi64
from .base import Message

__all__ = ["MAX_GOAWAY_URI", "GoAway", "Setup", "check_goaway", "check_setup"]

MAX_GOAWAY_URI = 8192
Opt = SetupOption
_KNOWN_OPTIONS = frozenset(int(o) for o in SetupOption)


def _text(raw: bytes, code: SessionErrorCode, what: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise SessionError(code, f"{what} is not UTF-8") from None


@dataclass(frozen=True)
class Setup(Message):
    """SETUP: Setup Options as typed fields (``None`` = absent, defaults per §4.2).

    ``unknown_options`` keeps options this profile does not know (GREASE included): they are
    ignored by the receiver but survive a decode/encode round trip.
    """

    TYPE: ClassVar[MessageType] = MessageType.SETUP

    path: str | None = None
    authorization_tokens: tuple[Token, ...] = ()
    max_auth_token_cache_size: int | None = None
    authority: str | None = None
    max_filter_ranges: int | None = None
    moqt_implementation: str | None = None
    max_request_updates: int | None = None
    unknown_options: tuple[KeyValuePair, ...] = ()

    def encode_body(self) -> bytes:
        pairs: list[KeyValuePair] = []
        if self.path is not None:
            pairs.append(KeyValuePair(Opt.PATH, self.path.encode()))
        for tok in self.authorization_tokens:
            pairs.append(KeyValuePair(Opt.AUTHORIZATION_TOKEN, encode_token(tok)))
        for t, v in (
            (Opt.MAX_AUTH_TOKEN_CACHE_SIZE, self.max_auth_token_cache_size),
            (Opt.MAX_FILTER_RANGES, self.max_filter_ranges),
            (Opt.MAX_REQUEST_UPDATES, self.max_request_updates),
        ):
            if v is not None:
                pairs.append(KeyValuePair(t, v))
        if self.authority is not None:
            pairs.append(KeyValuePair(Opt.AUTHORITY, self.authority.encode()))
        if self.moqt_implementation is not None:
            pairs.append(KeyValuePair(Opt.MOQT_IMPLEMENTATION, self.moqt_implementation.encode()))
        for p in self.unknown_options:
            if p[0] in _KNOWN_OPTIONS:
                raise ValueError(f"option {p[0]:#x} is known; use its field")
            pairs.append(KeyValuePair(*p))
        return encode_kvps(pairs)

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        kw: dict[str, object] = {}
        tokens: list[Token] = []
        unknown: list[KeyValuePair] = []
        for t, v in decode_kvps(r):
            if t == Opt.AUTHORIZATION_TOKEN:
                tokens.append(decode_token(v))  # type: ignore[arg-type]
                continue
            try:
                opt = Opt(t)
            except ValueError:
                unknown.append(KeyValuePair(t, v))  # ignored, duplicates allowed (§4.1)
                continue
            name = opt.name.lower()
            if name in kw:
                # [decision] a repeated known option is a PROTOCOL_VIOLATION (§4.1: a sender
                # does not repeat a known option unless its definition allows it).
                raise protocol_violation(f"duplicate setup option {opt.name}")
            if opt == Opt.PATH:
                kw[name] = _text(v, SessionErrorCode.MALFORMED_PATH, "PATH")  # type: ignore[arg-type]
            elif opt == Opt.AUTHORITY:
                kw[name] = _text(v, SessionErrorCode.MALFORMED_AUTHORITY, "AUTHORITY")  # type: ignore[arg-type]
            elif opt == Opt.MOQT_IMPLEMENTATION:
                kw[name] = v.decode(errors="replace")  # type: ignore[union-attr]
            else:
                kw[name] = v
        return cls(authorization_tokens=tuple(tokens), unknown_options=tuple(unknown), **kw)  # type: ignore[arg-type]


def check_setup(setup: Setup, *, sender_is_client: bool, webtransport: bool = False) -> None:
    """Role-dependent SETUP rules (§4.2), for the receiver of ``setup``."""
    if setup.path is not None and (not sender_is_client or webtransport):
        raise SessionError(SessionErrorCode.INVALID_PATH, "PATH not allowed here")
    if setup.authority is not None and (not sender_is_client or webtransport):
        raise SessionError(SessionErrorCode.INVALID_AUTHORITY, "AUTHORITY not allowed here")
    if sender_is_client:
        for tok in setup.authorization_tokens:
            if tok.alias_type in (AliasType.DELETE, AliasType.USE_ALIAS):
                raise protocol_violation(f"{tok.alias_type.name} token in SETUP")


@dataclass(frozen=True)
class GoAway(Message):
    """GOAWAY: ``new_session_uri`` empty = reconnect to the current one; ``timeout_ms`` 0 = none."""

    TYPE: ClassVar[MessageType] = MessageType.GOAWAY

    new_session_uri: str = ""
    timeout_ms: int = 0

    def encode_body(self) -> bytes:
        uri = self.new_session_uri.encode()
        if len(uri) > MAX_GOAWAY_URI:
            raise ValueError("GOAWAY URI longer than 8192 bytes")
        return encode_vi64(len(uri)) + uri + encode_vi64(self.timeout_ms)

    @classmethod
    def decode_body(cls, r: Reader) -> Self:
        uri = r.length_prefixed(MAX_GOAWAY_URI, "GOAWAY URI").decode(errors="replace")
        timeout = r.vi64()
        r.expect_end("GOAWAY")
        return cls(uri, timeout)


def check_goaway(msg: GoAway, *, sender_is_client: bool) -> None:
    """A client MUST send an empty URI; a server receiving one closes the session."""
    if sender_is_client and msg.new_session_uri:
        raise protocol_violation("GOAWAY with a URI from a client")
