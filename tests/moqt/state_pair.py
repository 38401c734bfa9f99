"""Two sans-IO session states joined in memory: what one sends, the other receives.

This is what the session layer does over QUIC, minus the network: every rule the asyncio
session enforces is decided by these states, so a must-reject case needs only bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from relay.moqt import SessionError, SessionErrorCode, Setup, encode_message
from relay.moqt.messages import Message
from relay.moqt.state import PeerUniStream, RequestState, SessionState


@dataclass
class Bidi:
    """One request stream: ``requester`` opened it, ``responder`` accepted it."""

    requester: RequestState
    responder: RequestState

    def to_responder(self, *msgs: Message | bytes, fin: bool = False) -> list[Any]:
        """Send ``msgs`` from the requester (raw bytes skip the sender's own checks)."""
        return self.responder.receive(_wire(self.requester, msgs), fin)

    def to_requester(self, *msgs: Message | bytes, fin: bool = False) -> list[Any]:
        return self.requester.receive(_wire(self.responder, msgs), fin)


def _wire(sender: RequestState, msgs: tuple[Message | bytes, ...]) -> bytes:
    return b"".join(m if isinstance(m, bytes) else sender.send(m) for m in msgs)


@dataclass
class Pair:
    """A client and a server session after SETUP both ways."""

    client_setup: Setup = field(default_factory=Setup)
    server_setup: Setup = field(default_factory=Setup)
    webtransport: bool = False

    def __post_init__(self) -> None:
        self.client = SessionState(is_client=True, setup=self.client_setup,
                                   webtransport=self.webtransport)
        self.server = SessionState(is_client=False, setup=self.server_setup,
                                   webtransport=self.webtransport)
        # each side's view of the other's control stream
        self.client_control: PeerUniStream = self.server.peer_uni_stream()
        self.server_control: PeerUniStream = self.client.peer_uni_stream()
        assert self.client_control.receive(self.client.control_stream_start()) == \
            [self.client_setup]
        assert self.server_control.receive(self.server.control_stream_start()) == \
            [self.server_setup]

    def state(self, client: bool) -> SessionState:
        return self.client if client else self.server

    def bidi(self, *, from_client: bool = True) -> Bidi:
        """A new request stream, opened by the client (default) or the server."""
        opener, peer = (self.client, self.server) if from_client else (self.server, self.client)
        return Bidi(opener.request_stream(), peer.peer_request_stream())

    def request(self, make: Any, *, from_client: bool = True) -> tuple[Bidi, list[Any]]:
        """Open a stream and send ``make(request_id)``; returns the stream and what the
        responder received."""
        b = self.bidi(from_client=from_client)
        msg = make(self.state(from_client).next_request_id())
        return b, b.to_responder(msg)


def closes(code: SessionErrorCode, fn: Any, *args: Any, **kwargs: Any) -> SessionError:
    """``fn`` decides the session must close with ``code``."""
    with pytest.raises(SessionError) as e:
        fn(*args, **kwargs)
    assert e.value.code == code, e.value
    return e.value


def raw(msg: Message) -> bytes:
    """A message's bytes without any sender-side check (to play a peer that breaks rules)."""
    return encode_message(msg)


__all__ = ["Bidi", "Pair", "closes", "raw"]
