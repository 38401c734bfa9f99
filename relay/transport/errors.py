"""The transport's exception hierarchy: one base class, codes carried as attributes."""

from __future__ import annotations


class TransportError(Exception):
    """Base class of every error raised by :mod:`relay.transport`."""


class ConnectTimeout(TransportError):
    """The QUIC handshake (or the WebTransport CONNECT) did not complete in time."""


class ProtocolNegotiationError(TransportError):
    """The peer did not select MOQT (wrong ALPN, or no ``WT-Protocol: moqt-22``)."""


class ConnectionClosed(TransportError):
    """The session is closed.

    ``code`` and ``reason`` come from the CONNECTION_CLOSE frame (raw QUIC) or the
    CLOSE_WEBTRANSPORT_SESSION capsule (WebTransport); for a local close they are the
    values passed to :meth:`Connection.close`. ``application`` is False when QUIC itself
    ended the connection (transport error, idle timeout, failed handshake); ``code`` is
    then a QUIC transport error code, not a MOQT Session Termination code.
    """

    def __init__(self, code: int, reason: str = "", *, application: bool = True) -> None:
        kind = "" if application else ", transport"
        super().__init__(f"connection closed (code 0x{code:x}{kind}"
                         f"{': ' + reason if reason else ''})")
        self.code = code
        self.reason = reason
        self.application = application


class StreamReset(TransportError):
    """The peer reset the stream we are reading (RESET_STREAM) with ``code``.

    For WebTransport the code is already mapped back from the WT error-code space.
    """

    def __init__(self, code: int) -> None:
        super().__init__(f"stream reset by peer (code 0x{code:x})")
        self.code = code


class StreamStopped(TransportError):
    """The peer asked us to stop sending (STOP_SENDING) with ``code``.

    aioquic answers STOP_SENDING with a RESET_STREAM carrying the same code, so the
    stream cannot be written any more.
    """

    def __init__(self, code: int) -> None:
        super().__init__(f"peer stopped the stream (code 0x{code:x})")
        self.code = code


class ReceiveBufferFull(StreamReset):
    """We stopped the stream (STOP_SENDING with ``code``): the application left more
    unread than the receive windows allow. Only on a backend whose receive credit does
    not follow application reads (qh3); see ``docs/transport.md``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.args = (f"receive buffer full: stream stopped (code 0x{code:x})",)
