"""MOQT as the transport carries it: the values of the profile the transport (which knows
only QUIC and WebTransport) is handed by whoever opens or serves a session."""

from __future__ import annotations

from relay.moqt.codes import ALPN, SessionErrorCode, StreamResetCode
from relay.transport import Application

MOQT = Application(
    alpn=ALPN,  # also the WebTransport protocol (WT-Available-Protocols, §3.1)
    # a stream past its receive bound is stopped as EXCESSIVE_LOAD (§11.9)
    receive_overflow_code=StreamResetCode.EXCESSIVE_LOAD,
    # a WebTransport server that selected another protocol (§3.3)
    negotiation_failed_code=SessionErrorCode.VERSION_NEGOTIATION_FAILED,
)

__all__ = ["MOQT"]
