"""Authorization per scope: tokens map to Track Namespace prefixes and roles.

Configuration (TOML; the prefix is the namespace text form of relay/moqt/namespace_text.py,
as ``kvcs admin state`` prints it; here the scope ("kvcs-1", 0x00ff))::

    [[auth.tokens]]
    token = "s3cret"                 # compared in constant time
    prefixes = ["kvcs-1/hex:00ff"]   # fields joined by "/", each text or "hex:" and octets
    roles = ["publish", "subscribe"]

Without any token the relay is open (development) and logs so at start. A request is allowed
when one of its AUTHORIZATION_TOKENs (or one given in the session's SETUP) grants the role for
a prefix of the request's namespace. NAMESPACE answers only reveal namespaces the requester may
subscribe to (§14.4, kvcs-draft 3.1).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from relay.moqt.namespace_text import parse_namespace
from relay.moqt.primitives import TrackNamespace, namespace_matches_prefix
from relay.moqt.token import Token
from relay.options import Role  # what a token grants is part of its configuration


@dataclass(frozen=True)
class Grant:
    token: bytes
    prefixes: tuple[TrackNamespace, ...]
    roles: frozenset[Role]


class Authorizer:
    def __init__(self, grants: Sequence[Grant] = ()) -> None:
        self.grants = tuple(grants)

    @classmethod
    def from_config(cls, entries: Iterable[dict[str, object]]) -> Authorizer:
        grants = []
        for e in entries:
            token = str(e["token"]).encode()
            prefixes = tuple(parse_namespace(str(p)) for p in e.get("prefixes", []))  # type: ignore[attr-defined]
            roles = frozenset(Role(str(r)) for r in e.get("roles", []))  # type: ignore[attr-defined]
            grants.append(Grant(token, prefixes, roles))
        return cls(grants)

    @property
    def open(self) -> bool:
        """No tokens configured: everything is allowed (development mode)."""
        return not self.grants

    def _grants_for(self, tokens: Iterable[bytes]) -> list[Grant]:
        found = []
        for value in tokens:
            for g in self.grants:
                # Constant time per comparison: a wrong token must not leak its prefix length.
                if hmac.compare_digest(g.token, value):
                    found.append(g)
        return found

    def allows(self, role: Role, namespace: TrackNamespace, tokens: Iterable[bytes]) -> bool:
        if self.open:
            return True
        return any(role in g.roles and any(namespace_matches_prefix(namespace, p)
                                           for p in g.prefixes)
                   for g in self._grants_for(tokens))

    def allows_prefix(self, role: Role, prefix: TrackNamespace, tokens: Iterable[bytes]) -> bool:
        """For SUBSCRIBE_NAMESPACE: the prefix must lie inside (or equal, or contain) a granted
        prefix; what is then revealed is filtered namespace by namespace with ``allows``."""
        if self.open:
            return True
        return any(role in g.roles and any(namespace_matches_prefix(prefix, p)
                                           or namespace_matches_prefix(p, prefix)
                                           for p in g.prefixes)
                   for g in self._grants_for(tokens))


def token_values(tokens: Iterable[Token]) -> list[bytes]:
    """The Token Values of USE_VALUE / REGISTER tokens (aliases are not used, §6.6)."""
    return [bytes(t.value) for t in tokens if getattr(t, "value", None) is not None]
