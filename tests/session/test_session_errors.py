"""The session layer's errors read unknown codes as INTERNAL_ERROR, as the profile says for
each code space (§4.5, §7.4, §11.9): a GREASE session code, a retired REQUEST_ERROR code, or a
stream reset code in WebTransport-mapped form on native QUIC (§18 rule 2)."""

from __future__ import annotations

from relay.moqt.codes import RequestErrorCode, SessionErrorCode, StreamResetCode
from relay.session import RequestRejected, SessionClosed, StreamAborted


def test_known_codes_keep_their_meaning() -> None:
    assert SessionClosed(0x1B).meaning == SessionErrorCode.TOO_MANY_REQUEST_UPDATES
    assert RequestRejected(0x36).meaning == RequestErrorCode.INVALID_FILTER
    assert StreamAborted(0x5).meaning == StreamResetCode.TOO_FAR_BEHIND
    assert "TOO_FAR_BEHIND (0x5)" in str(StreamAborted(0x5))


def test_unknown_codes_mean_internal_error() -> None:
    assert SessionClosed(0x7F * 3 + 0x9D).meaning == SessionErrorCode.INTERNAL_ERROR  # GREASE
    assert RequestRejected(0x32).meaning == RequestErrorCode.INTERNAL_ERROR  # retired
    aborted = StreamAborted(0x52E4A40FA8DB)  # moq-rs's INTERNAL_ERROR, WebTransport-mapped
    assert aborted.meaning == StreamResetCode.INTERNAL_ERROR and aborted.code == 0x52E4A40FA8DB
