"""The session's rules, sans-IO: one ``SessionState`` per session, one ``RequestState`` per
request stream (see ``session.py``)."""

from .ids import REQUEST_ID_WINDOW, PeerRequestIds, TrackAliases
from .request import REQUEST_TYPES, Refuse, RequestState
from .session import PeerUniStream, SessionState

__all__ = [
    "REQUEST_ID_WINDOW",
    "REQUEST_TYPES",
    "PeerRequestIds",
    "PeerUniStream",
    "Refuse",
    "RequestState",
    "SessionState",
    "TrackAliases",
]
