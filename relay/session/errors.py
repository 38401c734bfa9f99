"""Errors the session layer raises to the layers above."""

from __future__ import annotations

from relay.moqt.codes import (
    RequestErrorCode,
    SessionErrorCode,
    StreamResetCode,
    request_error_meaning,
    session_error_meaning,
    stream_reset_meaning,
)
from relay.moqt.messages.request import Redirect


class SessionFailure(Exception):
    """Base class of the session layer's errors."""


class SessionClosed(SessionFailure):
    """The MOQT session ended (``code`` is the Session Termination code, or a QUIC one;
    ``meaning`` reads an unknown one as INTERNAL_ERROR, §4.5)."""

    def __init__(self, code: int, reason: str = "") -> None:
        meaning = session_error_meaning(code)
        super().__init__(f"session closed: {meaning.name} (0x{code:x})"
                         f"{': ' + reason if reason else ''}")
        self.code = code
        self.meaning: SessionErrorCode = meaning
        self.reason = reason


class RequestRejected(SessionFailure):
    """The peer answered a request with REQUEST_ERROR."""

    def __init__(self, code: int, reason: str = "", retry_interval: int = 0,
                 redirect: Redirect | None = None) -> None:
        meaning = request_error_meaning(code)
        super().__init__(f"{meaning.name} (0x{code:x}){': ' + reason if reason else ''}")
        self.code = code
        self.meaning: RequestErrorCode = meaning
        self.reason = reason
        self.retry_interval = retry_interval
        self.redirect = redirect


class RequestCancelled(SessionFailure):
    """The request stream ended without its required reply (reset, STOP_SENDING or FIN)."""

    def __init__(self, code: int | None = None, what: str = "request") -> None:
        super().__init__(f"{what} cancelled" + (f" (code 0x{code:x})" if code is not None else ""))
        self.code = code


class StreamAborted(SessionFailure):
    """A fetch (or fill) stream was reset by the peer with ``code`` (a stream reset code;
    ``meaning`` reads an unknown one, e.g. a WebTransport-mapped one, as INTERNAL_ERROR,
    §11.9, §18 rule 2)."""

    def __init__(self, code: int) -> None:
        meaning = stream_reset_meaning(code)
        super().__init__(f"stream reset by peer: {meaning.name} (0x{code:x})")
        self.code = code
        self.meaning: StreamResetCode = meaning
