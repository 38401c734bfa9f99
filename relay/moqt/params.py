"""Message Parameters (§2.5, §6): a counted, delta-coded list with per-type value encodings.

``Params`` is the typed form; ``None`` / empty means "absent" (the defaults of §6.1 apply and
are the caller's business). ``ParamScope`` names where a list is carried; the allowed set of
each scope comes from the "Allowed in" column of §6.1. Message decoders check the scope of the
message type (for REQUEST_UPDATE / REQUEST_OK the union of their uses); once the session knows
which request is updated or answered it narrows with ``check_scope``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum, auto

from .codes import GroupOrder, ParameterType, RequestErrorCode
from .errors import RequestError, protocol_violation
from .location_filter import LocationFilter, decode_location_filter, encode_location_filter
from .primitives import (
    Location,
    TrackNamespace,
    decode_location,
    decode_track_namespace,
    encode_location,
    encode_track_namespace,
)
from .range_filter import RANGE_FILTER_TYPES, RangeFilter, decode_range_filter, encode_range_filter
from .reader import Reader
from .token import Token, decode_token, encode_token
from .vi64 import MAX_VI64, encode_vi64

__all__ = [
    "ALLOWED",
    "ParamScope",
    "Params",
    "check_filter_ranges",
    "check_scope",
    "count_ranges",
    "decode_params",
    "encode_params",
]

P = ParameterType


class ParamScope(Enum):
    """Where a parameter list travels (message, or reply/update to a given request)."""

    SUBSCRIBE = auto()
    SUBSCRIBE_OK = auto()
    PUBLISH = auto()
    FETCH = auto()
    FETCH_OK = auto()
    TRACK_STATUS = auto()
    PUBLISH_NAMESPACE = auto()
    SUBSCRIBE_NAMESPACE = auto()
    SUBSCRIBE_TRACKS = auto()
    PUBLISH_STATE_NOTIFY = auto()
    FILL = auto()  # inside FILL_PARAMETERS
    REQUEST_UPDATE = auto()  # union of the UPDATE_* scopes (what a decoder can check alone)
    UPDATE_SUBSCRIPTION = auto()  # SUBSCRIBE- or PUBLISH-initiated subscription
    UPDATE_FETCH = auto()
    UPDATE_PUBLISH_NAMESPACE = auto()
    UPDATE_SUBSCRIBE_NAMESPACE = auto()
    UPDATE_SUBSCRIBE_TRACKS = auto()
    REQUEST_OK = auto()  # union of the OK_* scopes
    OK_PUBLISH = auto()
    OK_TRACK_STATUS = auto()
    OK_REQUEST_UPDATE = auto()
    OK_PUBLISH_NAMESPACE = auto()
    OK_SUBSCRIBE_NAMESPACE = auto()
    OK_SUBSCRIBE_TRACKS = auto()


_S = ParamScope
_RANGES_ST = frozenset({P.SUBGROUP_FILTER, P.OBJECTID_FILTER, P.PRIORITY_FILTER,
                        P.OBJECT_PROPERTY_FILTER})

ALLOWED: dict[ParamScope, frozenset[ParameterType]] = {
    _S.SUBSCRIBE: frozenset({
        P.OBJECT_DELIVERY_TIMEOUT, P.AUTHORIZATION_TOKEN, P.RENDEZVOUS_TIMEOUT,
        P.SUBGROUP_DELIVERY_TIMEOUT, P.FORWARD, P.SUBSCRIBER_PRIORITY, P.LOCATION_FILTER,
        P.GROUP_ORDER, P.FILL_PARAMETERS, *_RANGES_ST, P.NEW_GROUP_REQUEST,
        P.INCLUDE_PROPERTIES,
    }),
    _S.SUBSCRIBE_OK: frozenset({P.EXPIRES, P.LARGEST_OBJECT}),
    _S.PUBLISH: frozenset({
        P.OBJECT_DELIVERY_TIMEOUT, P.AUTHORIZATION_TOKEN, P.SUBGROUP_DELIVERY_TIMEOUT,
        P.EXPIRES, P.LARGEST_OBJECT, P.FORWARD, P.SUBSCRIBER_PRIORITY, P.LOCATION_FILTER,
        P.GROUP_ORDER,
    }),
    _S.FETCH: frozenset({
        P.AUTHORIZATION_TOKEN, P.FILL_TIMEOUT, P.SUBSCRIBER_PRIORITY, P.LOCATION_FILTER,
        P.GROUP_ORDER, *_RANGES_ST, P.INCLUDE_PROPERTIES,
    }),
    _S.FETCH_OK: frozenset(),
    _S.TRACK_STATUS: frozenset({P.AUTHORIZATION_TOKEN, P.INCLUDE_PROPERTIES}),
    _S.PUBLISH_NAMESPACE: frozenset({P.AUTHORIZATION_TOKEN}),
    _S.SUBSCRIBE_NAMESPACE: frozenset({P.AUTHORIZATION_TOKEN}),
    _S.SUBSCRIBE_TRACKS: frozenset({
        P.AUTHORIZATION_TOKEN, P.FORWARD, P.GROUP_ORDER, *_RANGES_ST,
        P.TRACK_PROPERTY_FILTER, P.INCLUDE_PROPERTIES,
    }),
    _S.PUBLISH_STATE_NOTIFY: frozenset({P.LARGEST_OBJECT, P.FORWARD, P.LOCATION_FILTER}),
    _S.FILL: frozenset({
        P.FILL_TIMEOUT, P.SUBSCRIBER_PRIORITY, P.LOCATION_FILTER, P.GROUP_ORDER, *_RANGES_ST,
    }),
    _S.UPDATE_SUBSCRIPTION: frozenset({
        P.OBJECT_DELIVERY_TIMEOUT, P.AUTHORIZATION_TOKEN, P.SUBGROUP_DELIVERY_TIMEOUT,
        P.FORWARD, P.SUBSCRIBER_PRIORITY, P.LOCATION_FILTER, P.FILL_PARAMETERS, *_RANGES_ST,
        P.NEW_GROUP_REQUEST,
    }),
    _S.UPDATE_FETCH: frozenset({P.AUTHORIZATION_TOKEN, P.SUBSCRIBER_PRIORITY}),
    _S.UPDATE_PUBLISH_NAMESPACE: frozenset({P.AUTHORIZATION_TOKEN}),
    _S.UPDATE_SUBSCRIBE_NAMESPACE: frozenset({P.AUTHORIZATION_TOKEN, P.TRACK_NAMESPACE_PREFIX}),
    _S.UPDATE_SUBSCRIBE_TRACKS: frozenset({
        P.AUTHORIZATION_TOKEN, P.FORWARD, *_RANGES_ST, P.TRACK_PROPERTY_FILTER,
        P.TRACK_NAMESPACE_PREFIX,
    }),
    _S.OK_PUBLISH: frozenset({P.EXPIRES}),
    # §7.11 says TRACK_STATUS_OK carries EXPIRES as well; §6.1 omits it. Accept it.
    _S.OK_TRACK_STATUS: frozenset({P.LARGEST_OBJECT, P.EXPIRES}),
    _S.OK_REQUEST_UPDATE: frozenset({P.EXPIRES, P.LARGEST_OBJECT}),
    _S.OK_PUBLISH_NAMESPACE: frozenset({P.EXPIRES}),
    _S.OK_SUBSCRIBE_NAMESPACE: frozenset({P.EXPIRES}),
    _S.OK_SUBSCRIBE_TRACKS: frozenset({P.EXPIRES}),
}
ALLOWED[_S.REQUEST_UPDATE] = frozenset().union(
    *(v for k, v in ALLOWED.items() if k.name.startswith("UPDATE_"))
)
ALLOWED[_S.REQUEST_OK] = frozenset().union(
    *(v for k, v in ALLOWED.items() if k.name.startswith("OK_"))
)

_REPEATABLE = frozenset({P.AUTHORIZATION_TOKEN}) | RANGE_FILTER_TYPES


@dataclass(frozen=True)
class Params:
    """Typed Message Parameters. Absent = ``None`` (or empty tuple).

    ``fill`` is FILL_PARAMETERS: a nested ``Params`` (scope FILL); ``Params()`` there is an
    empty inner list, which still requests a fill. ``range_filters`` holds every Range-filter
    parameter in wire order; ``RangeFilter.clear(type)`` is the zero-length "no filter" value.
    """

    object_delivery_timeout: int | None = None
    authorization_tokens: tuple[Token, ...] = ()
    rendezvous_timeout: int | None = None
    subgroup_delivery_timeout: int | None = None
    expires: int | None = None
    largest_object: Location | None = None
    fill_timeout: int | None = None
    forward: bool | None = None
    subscriber_priority: int | None = None
    location_filter: LocationFilter | None = None
    group_order: GroupOrder | None = None
    fill: Params | None = None
    range_filters: tuple[RangeFilter, ...] = ()
    new_group_request: int | None = None
    track_namespace_prefix: TrackNamespace | None = None
    include_properties: bool | None = None

    def present(self) -> frozenset[ParameterType]:
        """The parameter types this list would put on the wire."""
        return frozenset(t for t, _ in _items(self))


# --- encoding ---------------------------------------------------------------------------------

_VI_FIELDS = (
    (P.OBJECT_DELIVERY_TIMEOUT, "object_delivery_timeout"),
    (P.RENDEZVOUS_TIMEOUT, "rendezvous_timeout"),
    (P.SUBGROUP_DELIVERY_TIMEOUT, "subgroup_delivery_timeout"),
    (P.EXPIRES, "expires"),
    (P.FILL_TIMEOUT, "fill_timeout"),
    (P.NEW_GROUP_REQUEST, "new_group_request"),
)


def _lp(b: bytes) -> bytes:
    return encode_vi64(len(b)) + b


def _u8(v: int, what: str) -> bytes:
    if not 0 <= v <= 255:
        raise ValueError(f"{what} is one byte")
    return bytes((v,))


def _items(p: Params) -> Iterator[tuple[ParameterType, bytes]]:
    """(type, encoded value) of every present parameter, in no particular order."""
    for t, name in _VI_FIELDS:
        v = getattr(p, name)
        if v is not None:
            yield t, encode_vi64(v)
    for tok in p.authorization_tokens:
        yield P.AUTHORIZATION_TOKEN, _lp(encode_token(tok))
    if p.largest_object is not None:
        yield P.LARGEST_OBJECT, encode_location(p.largest_object)
    if p.forward is not None:
        yield P.FORWARD, bytes((int(p.forward),))
    if p.subscriber_priority is not None:
        yield P.SUBSCRIBER_PRIORITY, _u8(p.subscriber_priority, "SUBSCRIBER_PRIORITY")
    if p.location_filter is not None:
        yield P.LOCATION_FILTER, encode_location_filter(p.location_filter)
    if p.group_order is not None:
        yield P.GROUP_ORDER, bytes((GroupOrder(p.group_order),))
    if p.fill is not None:
        yield P.FILL_PARAMETERS, _lp(encode_params(p.fill, _S.FILL))
    for f in p.range_filters:
        yield f.type, _lp(encode_range_filter(f))
    if p.track_namespace_prefix is not None:
        yield P.TRACK_NAMESPACE_PREFIX, encode_track_namespace(p.track_namespace_prefix)
    if p.include_properties is not None:
        yield P.INCLUDE_PROPERTIES, bytes((int(p.include_properties),))


def encode_params(p: Params, scope: ParamScope) -> bytes:
    """Encode ``p`` as carried in ``scope``; ``ValueError`` if it holds a disallowed type."""
    items = sorted(_items(p), key=lambda i: i[0])  # stable: repeated types keep their order
    allowed = ALLOWED[scope]
    out = [encode_vi64(len(items))]
    prev = 0
    for t, v in items:
        if t not in allowed:
            raise ValueError(f"parameter {t.name} not allowed in {scope.name}")
        out.append(encode_vi64(t - prev))
        out.append(v)
        prev = t
    return b"".join(out)


# --- decoding ---------------------------------------------------------------------------------


def _bool_u8(r: Reader, name: str) -> bool:
    v = r.u8()
    if v > 1:
        raise protocol_violation(f"{name} value {v} not 0 or 1")
    return bool(v)


def decode_params(r: Reader, scope: ParamScope) -> Params:
    """Decode a counted list; the allowed set of ``scope`` is enforced (PROTOCOL_VIOLATION)."""
    allowed = ALLOWED[scope]
    count = r.vi64()
    if count > r.remaining:  # each parameter takes at least one byte
        raise protocol_violation("parameter count exceeds the message")
    kw: dict[str, object] = {}
    tokens: list[Token] = []
    filters: list[RangeFilter] = []
    seen: set[int] = set()
    filter_error: RequestError | None = None
    t = 0
    for _ in range(count):
        t += r.vi64()
        if t > MAX_VI64:
            raise protocol_violation("parameter type exceeds 2^64-1")
        try:
            pt = P(t)
        except ValueError:
            raise protocol_violation(f"unknown parameter type {t:#x}") from None
        if pt not in allowed:
            raise protocol_violation(f"parameter {pt.name} not allowed in {scope.name}")
        if pt in seen and pt not in _REPEATABLE:
            raise protocol_violation(f"duplicate parameter {pt.name}")
        seen.add(pt)
        if pt == P.AUTHORIZATION_TOKEN:
            tokens.append(decode_token(r.length_prefixed()))
        elif pt in RANGE_FILTER_TYPES:
            sub = r.sub(r.vi64())
            try:
                filters.append(decode_range_filter(pt, sub))
            except RequestError as e:
                # Keep reading: a session error later in the list must win over this.
                filter_error = filter_error or e
        elif pt == P.LARGEST_OBJECT:
            kw["largest_object"] = decode_location(r)
        elif pt == P.FORWARD:
            kw["forward"] = _bool_u8(r, "FORWARD")
        elif pt == P.INCLUDE_PROPERTIES:
            kw["include_properties"] = _bool_u8(r, "INCLUDE_PROPERTIES")
        elif pt == P.SUBSCRIBER_PRIORITY:
            kw["subscriber_priority"] = r.u8()
        elif pt == P.GROUP_ORDER:
            v = r.u8()
            if v not in (1, 2):
                raise protocol_violation(f"GROUP_ORDER value {v} not 1 or 2")
            kw["group_order"] = GroupOrder(v)
        elif pt == P.LOCATION_FILTER:
            kw["location_filter"] = decode_location_filter(r)
        elif pt == P.FILL_PARAMETERS:
            inner = r.sub(r.vi64())
            # A zero-length value (no count byte) is read as an empty inner list (§6.4).
            kw["fill"] = Params() if inner.at_end() else decode_params(inner, _S.FILL)
            inner.expect_end("FILL_PARAMETERS")
        elif pt == P.TRACK_NAMESPACE_PREFIX:
            kw["track_namespace_prefix"] = decode_track_namespace(r)
        else:
            kw[_VI_NAME[pt]] = r.vi64()
    if filter_error is not None:
        raise filter_error
    keys = [f.key for f in filters]
    if len(set(keys)) != len(keys):
        raise RequestError(RequestErrorCode.INVALID_FILTER, "same (Type, SetID, Property Type)")
    return Params(authorization_tokens=tuple(tokens), range_filters=tuple(filters), **kw)  # type: ignore[arg-type]


_VI_NAME = {t: n for t, n in _VI_FIELDS}


def check_scope(p: Params, scope: ParamScope) -> None:
    """Narrow check once the session knows the exact scope (PROTOCOL_VIOLATION)."""
    extra = p.present() - ALLOWED[scope]
    if extra:
        names = ", ".join(sorted(t.name for t in extra))
        raise protocol_violation(f"parameters not allowed in {scope.name}: {names}")


def count_ranges(p: Params) -> int:
    """Ranges in every Range filter of the list, FILL_PARAMETERS included (§6.4)."""
    n = sum(len(f.ranges) for f in p.range_filters)
    return n + (count_ranges(p.fill) if p.fill is not None else 0)


def _has_filters(p: Params) -> bool:
    return any(f.set_id is not None for f in p.range_filters) or (
        p.fill is not None and _has_filters(p.fill)
    )


def check_filter_ranges(p: Params, max_filter_ranges: int, already: int = 0) -> None:
    """MAX_FILTER_RANGES (the limit *we* advertised): REQUEST_ERROR INVALID_FILTER.

    ``already`` = Ranges the subscription holds besides this message (for REQUEST_UPDATE).
    """
    if max_filter_ranges == 0 and _has_filters(p):
        raise RequestError(RequestErrorCode.INVALID_FILTER, "Range filters not allowed")
    if count_ranges(p) + already > max_filter_ranges:
        raise RequestError(RequestErrorCode.INVALID_FILTER, "MAX_FILTER_RANGES exceeded")
