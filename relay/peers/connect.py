"""Dialling a relay: a bounded connect + SETUP, failures as one-line PeerErrors."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from relay.logs import reason_of
from relay.session import (
    MoqtSession,
    SessionConfig,
    SessionFailure,
    SessionHandler,
    open_session,
)
from relay.session.tokens import tokens_of
from relay.transport import QuicSettings, TransportError

from .errors import PeerError

CONNECT_TIMEOUT = 10.0

# Small send buffers: a publisher writes layer by layer, and what it has queued in QUIC is
# sent round-robin across streams. Queuing little keeps layer g ahead of layer g+1 on the
# wire (kvcs-draft 3.4: earlier layers first), so a live consumer can start on layer 0 while
# later layers are still being produced.
PEER_SETTINGS = QuicSettings(send_buffer_high=256 * 1024,
                             connection_send_buffer_high=1024 * 1024)


@dataclass(frozen=True)
class RelayAccess:
    """How to reach relays: their URLs in order of preference and the TLS trust to use."""

    urls: tuple[str, ...]
    ca_file: str | os.PathLike[str] | None = None
    insecure: bool = False
    timeout: float = CONNECT_TIMEOUT
    settings: QuicSettings = PEER_SETTINGS
    # AUTHORIZATION_TOKEN sent in SETUP: the relay applies it to every request (§6.6).
    token: bytes | None = None


async def connect(url: str, access: RelayAccess, handler: SessionHandler | None = None
                  ) -> MoqtSession:
    """``handler`` answers the relay's requests (a publisher serving its Tracks)."""
    try:
        return await asyncio.wait_for(
            open_session(url, config=SessionConfig(authorization_tokens=tokens_of(access.token)),
                         handler=handler,
                         ca_file=access.ca_file, insecure=access.insecure,
                         settings=access.settings), access.timeout)
    except TimeoutError:
        raise PeerError(f"relay {url}: no answer within {access.timeout:g} s") from None
    except (OSError, TransportError, SessionFailure, ValueError) as e:
        raise PeerError(f"relay {url}: {reason_of(e)}") from None
