"""One exception hierarchy carrying the profile's codes.

* ``SessionError`` — close the whole session with ``code`` (a ``SessionErrorCode``).
* ``RequestError`` — refuse one request with REQUEST_ERROR ``code`` (a ``RequestErrorCode``);
  the session stays up. When raised while decoding a request message, ``message_type`` and
  ``request_id`` say which request it was (when they could be read).

Encoders raise plain ``ValueError`` for arguments that cannot be put on the wire: that is a bug
in the caller, not something the peer did.
"""

from __future__ import annotations

from .codes import MessageType, RequestErrorCode, SessionErrorCode

__all__ = ["MoqtError", "RequestError", "SessionError", "protocol_violation"]


class MoqtError(Exception):
    """Base of every error the MOQT codec raises about peer input."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"{code!r}: {reason}" if reason else repr(code))
        self.code = code
        self.reason = reason


class SessionError(MoqtError):
    """Peer input that must close the session with ``code``."""

    code: SessionErrorCode

    def __init__(self, code: SessionErrorCode, reason: str = "") -> None:
        super().__init__(code, reason)


class RequestError(MoqtError):
    """Peer input that must fail one request with REQUEST_ERROR ``code``."""

    code: RequestErrorCode

    def __init__(
        self,
        code: RequestErrorCode,
        reason: str = "",
        *,
        message_type: MessageType | None = None,
        request_id: int | None = None,
    ) -> None:
        super().__init__(code, reason)
        self.message_type = message_type
        self.request_id = request_id


def protocol_violation(reason: str) -> SessionError:
    """Shorthand: the most common session error."""
    return SessionError(SessionErrorCode.PROTOCOL_VIOLATION, reason)
