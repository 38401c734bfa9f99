"""The rules of one MOQT session, without I/O (§1.3–§1.5, §4, §5, §8.3).

Typed input in (the bytes of a stream, a reset, a message to send), checked output out (the
messages the application acts on, the bytes to write, ``Refuse`` for a request to answer with
REQUEST_ERROR), and ``SessionError`` carrying the profile's code when the peer broke a rule:
the caller closes the session with it. No awaits and no clock, as in aioquic's
``QuicConnection``: the asyncio session (``relay/session``) asks this state for every legality
decision, and the tests pair two states in memory.
"""

from __future__ import annotations

from typing import Any

from ..codes import SessionErrorCode, UniStreamType
from ..control import InvalidRequest, encode_message
from ..dataplane.fetch import FetchStreamParser
from ..dataplane.subgroup import SubgroupStreamParser
from ..dataplane.uni import UniStreamParser
from ..errors import SessionError, protocol_violation
from ..messages import GoAway, Message, Setup, check_goaway, check_setup
from .ids import PeerRequestIds, TrackAliases
from .request import RequestState

__all__ = ["PeerUniStream", "SessionState"]


class SessionState:
    """One endpoint's view of a session: SETUP both ways, GOAWAY, Request IDs, Track Aliases,
    and the state of every stream the caller opens or accepts."""

    __slots__ = ("_next_alias", "_next_request_id", "_peer_control", "aliases",
                 "goaway_received", "goaway_sent", "is_client", "local_setup", "peer_ids",
                 "peer_setup", "webtransport")

    def __init__(self, *, is_client: bool, setup: Setup, webtransport: bool = False) -> None:
        self.is_client = is_client
        self.webtransport = webtransport
        self.local_setup = setup
        self.peer_setup: Setup | None = None
        self.goaway_sent = False
        self.goaway_received: GoAway | None = None
        self.peer_ids = PeerRequestIds(peer_is_client=not is_client)
        self.aliases = TrackAliases()
        self._next_request_id = 0 if is_client else 1
        self._next_alias = 1
        self._peer_control = False

    @property
    def peer_is_client(self) -> bool:
        return not self.is_client

    @property
    def going_away(self) -> bool:
        return self.goaway_sent or self.goaway_received is not None

    # -- negotiated limits (§4.2; absent means 0) ----------------------------------------------

    @property
    def max_filter_ranges(self) -> int:
        """Ranges the peer may put in one subscription or fetch (ours)."""
        return self.local_setup.max_filter_ranges or 0

    @property
    def max_request_updates(self) -> int:
        """Unanswered REQUEST_UPDATEs per request stream we accept (ours; 0 = unlimited)."""
        return self.local_setup.max_request_updates or 0

    @property
    def peer_max_filter_ranges(self) -> int:
        s = self.peer_setup
        return (s.max_filter_ranges or 0) if s is not None else 0

    @property
    def peer_max_request_updates(self) -> int:
        s = self.peer_setup
        return (s.max_request_updates or 0) if s is not None else 0

    # -- what we send --------------------------------------------------------------------------

    def control_stream_start(self) -> bytes:
        """The first bytes of our control stream: SETUP, whose type is the stream type (§4.1)."""
        return encode_message(self.local_setup)

    def goaway(self, msg: GoAway) -> bytes | None:
        """GOAWAY on our control stream, at most once (§4.3); None if already sent."""
        if self.goaway_sent:
            return None
        self.goaway_sent = True
        return encode_message(msg)

    def next_request_id(self) -> int:
        """Ours: even for a client, odd for a server, up by 2 per request (§4.4)."""
        rid = self._next_request_id
        self._next_request_id += 2
        return rid

    def issued(self, request_id: int) -> bool:
        """``request_id`` is one of ours, already given to a request."""
        return request_id % 2 == (0 if self.is_client else 1) and \
            request_id < self._next_request_id

    def next_track_alias(self) -> int:
        """For a subscription we publish (SUBSCRIBE_OK, PUBLISH); unique in the session."""
        alias = self._next_alias
        self._next_alias += 1
        return alias

    def request_stream(self) -> RequestState:
        """A request stream we open (our request goes first)."""
        return RequestState(self, ours=True)

    # -- what the peer opens -------------------------------------------------------------------

    def peer_request_stream(self) -> RequestState:
        """A bidirectional stream the peer opened: a request stream (§1.3)."""
        return RequestState(self, ours=False)

    def peer_uni_stream(self) -> PeerUniStream:
        """A unidirectional stream the peer opened: its first vi64 says what it is (§1.3)."""
        return PeerUniStream(self)

    def _peer_stream_kind(self, kind: UniStreamType) -> None:
        if kind == UniStreamType.CONTROL:
            if self._peer_control:
                raise protocol_violation("a second control stream")
            self._peer_control = True

    def _on_control(self, msg: Message | InvalidRequest) -> Setup | GoAway:
        """The peer's control stream: SETUP first, then at most one GOAWAY (§1.3, §4)."""
        if self.peer_setup is None:
            # The stream was recognised by its first vi64, SETUP's type: this is SETUP.
            assert isinstance(msg, Setup)
            check_setup(msg, sender_is_client=self.peer_is_client, webtransport=self.webtransport)
            self.peer_setup = msg
            return msg
        if isinstance(msg, GoAway):
            if self.goaway_received is not None:
                raise protocol_violation("a second GOAWAY on the control stream")
            check_goaway(msg, sender_is_client=self.peer_is_client)
            self.goaway_received = msg
            return msg
        name = msg.message_type.name if isinstance(msg, InvalidRequest) else msg.TYPE.name
        raise protocol_violation(f"{name} is not allowed on the control stream")


class PeerUniStream:
    """A unidirectional stream the peer opened (§1.3 dispatch).

    ``receive`` returns, once ``kind`` is known: for the control stream the peer's ``Setup``
    and ``GoAway`` (checked); for a subgroup or fetch stream the parser's items (headers,
    Objects, End of Range markers); for padding nothing. An empty stream (FIN before any byte)
    is ignored; ending or resetting the control stream is a PROTOCOL_VIOLATION. Once the kind
    is known a data stream's reader may feed ``parser`` directly (one call less per chunk).
    """

    __slots__ = ("_session", "_uni", "kind")

    def __init__(self, session: SessionState) -> None:
        self._session = session
        self._uni = UniStreamParser()
        self.kind: UniStreamType | None = None

    @property
    def parser(self) -> SubgroupStreamParser | FetchStreamParser:
        p = self._uni.parser
        assert isinstance(p, SubgroupStreamParser | FetchStreamParser), self.kind
        return p

    def receive(self, data: bytes | memoryview = b"", fin: bool = False) -> list[Any]:
        uni = self._uni
        if self.kind is None and fin and not data and not uni.buffered:
            return []  # an empty stream says nothing
        items = uni.feed(data, fin)
        if self.kind is None:
            if uni.kind is None:
                return items
            self.kind = uni.kind
            self._session._peer_stream_kind(self.kind)
        if self.kind != UniStreamType.CONTROL:
            return items
        out = [self._session._on_control(m) for m in items]
        if fin:
            raise protocol_violation("the control stream was closed")
        return out

    def reset(self) -> None:
        """The peer reset the stream: fine for a data stream (also before its type, §18 rule 3),
        a PROTOCOL_VIOLATION for the control stream."""
        if self.kind == UniStreamType.CONTROL:
            raise SessionError(SessionErrorCode.PROTOCOL_VIOLATION, "the control stream was reset")
