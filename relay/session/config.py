"""Per-session settings of the MOQT layer (the QUIC settings live in relay.transport)."""

from __future__ import annotations

from dataclasses import dataclass

from relay.moqt.token import Token


@dataclass(frozen=True)
class SessionConfig:
    """What this endpoint advertises in SETUP and how patient it is with its peer."""

    # §4.2 profile choices: relays advertise >= 8 (KVCS consumers use one OBJECTID_FILTER
    # range), clients 8.
    max_filter_ranges: int = 8
    max_request_updates: int = 4
    implementation: str = "kvcs-relay/0.1"
    authorization_tokens: tuple[Token, ...] = ()
    # §1.5 step 4: no SETUP from the peer within this time closes the session.
    setup_timeout: float = 10.0
    # A subgroup stream can overtake the SUBSCRIBE_OK that names its Track Alias (§8.3);
    # it is held this long before it is abandoned with STOP_SENDING.
    alias_wait_timeout: float = 5.0
    # After PUBLISH_DONE the subscriber waits this long for the streams it announced (§7.7).
    done_linger: float = 5.0
    # Objects buffered per subscription/fetch before the reading stream stops taking data
    # from QUIC (which then withholds flow-control credit from the sender).
    receive_queue: int = 256
    # Native QUIC clients send PATH/AUTHORITY from the moqt:// URL (§1.1).
    path: str | None = None
    authority: str | None = None
