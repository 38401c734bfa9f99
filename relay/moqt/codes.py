"""Every code table of the profile as an ``IntEnum``.

Receivers keep unknown codes as plain ``int`` where the profile says unknown codes must be
tolerated (error codes, reset codes); helpers here map them to the INTERNAL_ERROR meaning.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "ALPN",
    "PADDING_DATAGRAM_TYPE",
    "PADDING_STREAM_TYPE",
    "AliasType",
    "DatagramFlag",
    "EndOfRangeType",
    "FetchFlag",
    "GroupOrder",
    "LocationFilterType",
    "MessageType",
    "ObjectStatus",
    "ParameterType",
    "PropertyType",
    "PublishDoneCode",
    "RequestErrorCode",
    "SessionErrorCode",
    "SetupOption",
    "StreamResetCode",
    "SubgroupFlag",
    "SubgroupIdMode",
    "UniStreamType",
    "publish_done_meaning",
    "request_error_meaning",
    "session_error_meaning",
    "stream_reset_meaning",
]

ALPN = "moqt-22"
PADDING_STREAM_TYPE = 0x132B3E28
PADDING_DATAGRAM_TYPE = 0x132B3E29


class SessionErrorCode(IntEnum):
    """Session Termination Error Codes (§4.5)."""

    NO_ERROR = 0x0
    INTERNAL_ERROR = 0x1
    UNAUTHORIZED = 0x2
    PROTOCOL_VIOLATION = 0x3
    INVALID_REQUEST_ID = 0x4
    DUPLICATE_TRACK_ALIAS = 0x5
    KEY_VALUE_FORMATTING_ERROR = 0x6
    INVALID_PATH = 0x8
    MALFORMED_PATH = 0x9
    GOAWAY_TIMEOUT = 0x10
    CONTROL_MESSAGE_TIMEOUT = 0x11
    DATA_STREAM_TIMEOUT = 0x12
    AUTH_TOKEN_CACHE_OVERFLOW = 0x13
    DUPLICATE_AUTH_TOKEN_ALIAS = 0x14
    VERSION_NEGOTIATION_FAILED = 0x15
    MALFORMED_AUTH_TOKEN = 0x16
    UNKNOWN_AUTH_TOKEN_ALIAS = 0x17
    EXPIRED_AUTH_TOKEN = 0x18
    INVALID_AUTHORITY = 0x19
    MALFORMED_AUTHORITY = 0x1A
    TOO_MANY_REQUEST_UPDATES = 0x1B


class RequestErrorCode(IntEnum):
    """REQUEST_ERROR codes (§7.4)."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    MALFORMED_AUTH_TOKEN = 0x4
    EXPIRED_AUTH_TOKEN = 0x5
    GOING_AWAY = 0x6
    EXCESSIVE_LOAD = 0x9
    DOES_NOT_EXIST = 0x10
    INVALID_RANGE = 0x11
    MALFORMED_TRACK = 0x12
    UNINTERESTED = 0x20
    PREFIX_OVERLAP = 0x30
    NAMESPACE_TOO_LARGE = 0x31
    UNSUPPORTED_EXTENSION = 0x33
    REDIRECT = 0x34
    CONFLICTING_FILTERS = 0x35
    INVALID_FILTER = 0x36


class PublishDoneCode(IntEnum):
    """PUBLISH_DONE status codes (§7.7); 0x3 SUBSCRIPTION_ENDED is gone since draft-20."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TRACK_ENDED = 0x2
    GOING_AWAY = 0x4
    TOO_FAR_BEHIND = 0x5
    EXPIRED = 0x6
    UPDATE_FAILED = 0x8
    EXCESSIVE_LOAD = 0x9
    MALFORMED_TRACK = 0x12


class StreamResetCode(IntEnum):
    """RESET_STREAM / STOP_SENDING codes (§11.9)."""

    INTERNAL_ERROR = 0x0
    CANCELLED = 0x1
    DELIVERY_TIMEOUT = 0x2
    SESSION_CLOSED = 0x3
    GOING_AWAY = 0x4
    TOO_FAR_BEHIND = 0x5
    UNKNOWN_OBJECT_STATUS = 0x6
    EXPIRED_AUTH_TOKEN = 0x7
    EXCESSIVE_LOAD = 0x9
    MALFORMED_TRACK = 0x12


def session_error_meaning(code: int) -> SessionErrorCode:
    """Unknown (incl. GREASE) session codes mean INTERNAL_ERROR (§4.5)."""
    try:
        return SessionErrorCode(code)
    except ValueError:
        return SessionErrorCode.INTERNAL_ERROR


def request_error_meaning(code: int) -> RequestErrorCode:
    """Unknown REQUEST_ERROR codes (incl. retired 0x32) mean INTERNAL_ERROR (§7.4)."""
    try:
        return RequestErrorCode(code)
    except ValueError:
        return RequestErrorCode.INTERNAL_ERROR


def publish_done_meaning(code: int) -> PublishDoneCode:
    """Unknown PUBLISH_DONE codes (incl. removed 0x3) mean INTERNAL_ERROR (§7.7)."""
    try:
        return PublishDoneCode(code)
    except ValueError:
        return PublishDoneCode.INTERNAL_ERROR


def stream_reset_meaning(code: int) -> StreamResetCode:
    """Unknown reset codes (e.g. WebTransport-mapped ones, §18) mean INTERNAL_ERROR."""
    try:
        return StreamResetCode(code)
    except ValueError:
        return StreamResetCode.INTERNAL_ERROR


class MessageType(IntEnum):
    """Control message types (§3)."""

    REQUEST_UPDATE = 0x02
    SUBSCRIBE = 0x03
    SUBSCRIBE_OK = 0x04
    REQUEST_ERROR = 0x05
    PUBLISH_NAMESPACE = 0x06
    REQUEST_OK = 0x07
    NAMESPACE = 0x08
    PUBLISH_DONE = 0x0B
    TRACK_STATUS = 0x0D
    NAMESPACE_DONE = 0x0E
    PUBLISH_SKIPPED = 0x0F
    GOAWAY = 0x10
    FETCH = 0x16
    FETCH_OK = 0x18
    PUBLISH = 0x1D
    PUBLISH_STATE_NOTIFY = 0x22
    SUBSCRIBE_NAMESPACE = 0x50
    SUBSCRIBE_TRACKS = 0x51
    SETUP = 0x2F00


class UniStreamType(IntEnum):
    """What an incoming unidirectional stream is (§1.3 dispatch)."""

    CONTROL = 0x2F00
    FETCH = 0x05
    SUBGROUP = 0x10  # any SUBGROUP_HEADER Type Flags value
    PADDING = PADDING_STREAM_TYPE


class SetupOption(IntEnum):
    """Setup Option types (§4.2)."""

    PATH = 0x01
    AUTHORIZATION_TOKEN = 0x03
    MAX_AUTH_TOKEN_CACHE_SIZE = 0x04
    AUTHORITY = 0x05
    MAX_FILTER_RANGES = 0x06
    MOQT_IMPLEMENTATION = 0x07
    MAX_REQUEST_UPDATES = 0x08


class ParameterType(IntEnum):
    """Message Parameter types (§6.1)."""

    OBJECT_DELIVERY_TIMEOUT = 0x02
    AUTHORIZATION_TOKEN = 0x03
    RENDEZVOUS_TIMEOUT = 0x04
    SUBGROUP_DELIVERY_TIMEOUT = 0x06
    EXPIRES = 0x08
    LARGEST_OBJECT = 0x09
    FILL_TIMEOUT = 0x0A
    FORWARD = 0x10
    SUBSCRIBER_PRIORITY = 0x20
    LOCATION_FILTER = 0x21
    GROUP_ORDER = 0x22
    FILL_PARAMETERS = 0x23
    SUBGROUP_FILTER = 0x25
    OBJECTID_FILTER = 0x26
    PRIORITY_FILTER = 0x27
    OBJECT_PROPERTY_FILTER = 0x28
    TRACK_PROPERTY_FILTER = 0x29
    NEW_GROUP_REQUEST = 0x32
    TRACK_NAMESPACE_PREFIX = 0x34
    INCLUDE_PROPERTIES = 0x35


class PropertyType(IntEnum):
    """Track and Object Property types this profile knows (§12)."""

    OBJECT_DELIVERY_TIMEOUT = 0x02
    MAX_CACHE_DURATION = 0x04
    SUBGROUP_DELIVERY_TIMEOUT = 0x06
    IMMUTABLE_PROPERTIES = 0x0B
    DEFAULT_PUBLISHER_PRIORITY = 0x0E
    DEFAULT_PUBLISHER_GROUP_ORDER = 0x22
    DYNAMIC_GROUPS = 0x30
    PRIOR_GROUP_ID_GAP = 0x3C
    PRIOR_OBJECT_ID_GAP = 0x3E


class LocationFilterType(IntEnum):
    """draft-22 Location Filter Type (§6.2); the value is also the number of fields (0..4)."""

    NONE = 0x00
    RELATIVE_START = 0x01
    ABSOLUTE_START = 0x02
    ABSOLUTE_START_GROUP_END = 0x03
    ABSOLUTE_RANGE = 0x04
    NEXT_OBJECT = 0x05


class GroupOrder(IntEnum):
    """GROUP_ORDER values (§6.1); also DEFAULT_PUBLISHER_GROUP_ORDER."""

    ASCENDING = 0x1
    DESCENDING = 0x2


class AliasType(IntEnum):
    """AUTHORIZATION_TOKEN Alias Type (§6.6)."""

    DELETE = 0x0
    REGISTER = 0x1
    USE_ALIAS = 0x2
    USE_VALUE = 0x3


class ObjectStatus(IntEnum):
    """Object Status (§11.4)."""

    NORMAL = 0x0
    END_OF_GROUP = 0x3
    END_OF_TRACK = 0x4


class SubgroupFlag(IntEnum):
    """SUBGROUP_HEADER Type Flags bits (§11.2)."""

    PROPERTIES = 0x01
    SUBGROUP_ID_MODE_MASK = 0x06
    END_OF_GROUP = 0x08
    SUBGROUP_HEADER = 0x10
    DEFAULT_PRIORITY = 0x20
    FIRST_OBJECT = 0x40


class SubgroupIdMode(IntEnum):
    """SUBGROUP_ID_MODE (bits 0x06 of the Type Flags); 0b11 is reserved."""

    ZERO = 0b00
    FIRST_OBJECT_ID = 0b01
    EXPLICIT = 0b10


class FetchFlag(IntEnum):
    """Fetch-object Serialization Flags bits (§11.6)."""

    SUBGROUP_MASK = 0x03
    OBJECT_ID_DELTA = 0x04
    GROUP_ID_DELTA = 0x08
    PRIORITY = 0x10
    PROPERTIES = 0x20
    DATAGRAM = 0x40


class EndOfRangeType(IntEnum):
    """End of Range markers on fetch streams (§11.7): their Serialization Flags values."""

    NON_EXISTENT = 0x8C
    UNKNOWN = 0x10C
    TIMED_OUT = 0x20C


class DatagramFlag(IntEnum):
    """OBJECT_DATAGRAM Type Flags bits (§11.8)."""

    PROPERTIES = 0x01
    END_OF_GROUP = 0x02
    ZERO_OBJECT_ID = 0x04
    DEFAULT_PRIORITY = 0x08
    STATUS = 0x20
