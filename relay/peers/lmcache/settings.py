"""Where a KVCS connector finds its relay, trust, token and scope key.

LMCache hands a connector either a URL (``remote_url: kvcs://HOST:PORT/?...``) or, as a
``remote_storage_plugins`` entry, the URL ``plugin://NAME`` and its ``extra_config``. Both
forms take the same settings; a URL query parameter wins over ``extra_config``:

| query          | extra_config           | meaning                                          |
|----------------|------------------------|--------------------------------------------------|
|                | ``kvcs.url``           | the ``kvcs://HOST:PORT/`` URL (plugin form)      |
| ``ca``         | ``kvcs.ca_file``       | CA certificate (PEM) the relay's must chain to    |
| ``insecure``   | ``kvcs.insecure``      | ``1``: no certificate check (loopback only)       |
| ``token``      | ``kvcs.token_file``    | AUTHORIZATION_TOKEN file sent in SETUP            |
| ``scope_key``  | ``kvcs.scope_key_file``| the scope key file (32 octets or 64 hex digits)   |
| ``quic_backend``| ``kvcs.quic_backend`` | ``aioquic`` or ``qh3`` (default: the process's)   |
| ``timeout``    | ``kvcs.timeout_s``     | bound on connecting, each lookup, each chunk (s) |
| ``confirm``    | ``kvcs.confirm``       | a put's check: ``status``, ``fetch``, ``none`` |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from relay.peers.connect import RelayAccess
from relay.peers.errors import PeerError
from relay.peers.inputs import load_key
from relay.peers.publisher import CONFIRM_MODES
from relay.session.tokens import read_token_file

SCHEME = "kvcs://"
DEFAULT_TIMEOUT = 2.0  # s: a lookup answers well within LMCache's blocking_timeout_secs
_KEYS = {"ca": "ca_file", "insecure": "insecure", "token": "token_file",
         "scope_key": "scope_key_file", "quic_backend": "quic_backend", "timeout": "timeout_s",
         "confirm": "confirm"}


@dataclass(frozen=True)
class KvcsSettings:
    relay_url: str  # moqt://HOST:PORT/: raw QUIC to the relay
    access: RelayAccess
    scope_key: bytes
    quic_backend: str | None
    timeout: float
    confirm: str


def parse_settings(url: str, extra: Mapping[str, Any] | None) -> KvcsSettings:
    """Settings from ``url`` (``kvcs://...`` or ``plugin://NAME``) and ``extra_config``;
    PeerError names what is missing or wrong."""
    extra = extra or {}
    if not url.startswith(SCHEME):
        url = str(extra.get("kvcs.url") or "")
        if not url.startswith(SCHEME):
            raise PeerError("kvcs.url in extra_config must be a kvcs://HOST:PORT/ URL")
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise PeerError(f"{url}: a kvcs:// URL needs a host and a port")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(query) - set(_KEYS)
    if unknown:
        raise PeerError(f"{url}: unknown parameters {', '.join(sorted(unknown))}")

    def value(name: str) -> str | None:
        got = query.get(name, extra.get(f"kvcs.{_KEYS[name]}"))
        return None if got is None or got == "" else str(got)

    key_file = value("scope_key")
    if key_file is None:
        raise PeerError("a KVCS connector needs a scope key file (scope_key= or "
                        "kvcs.scope_key_file)")
    insecure = (value("insecure") or "0").lower() in ("1", "true", "yes")
    ca = value("ca")
    if ca is None and not insecure:
        raise PeerError("a KVCS connector needs the relay's CA file (ca= or kvcs.ca_file)")
    token_file = value("token")
    confirm = value("confirm") or "status"
    if confirm not in CONFIRM_MODES:
        raise PeerError(f"confirm must be one of {', '.join(CONFIRM_MODES)}")
    timeout = float(value("timeout") or DEFAULT_TIMEOUT)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    relay_url = f"moqt://{host}:{parts.port}/"
    access = RelayAccess((relay_url,), ca_file=ca, insecure=insecure, timeout=timeout,
                         token=read_token_file(token_file) if token_file else None)
    return KvcsSettings(relay_url, access, load_key(key_file), value("quic_backend"), timeout,
                        confirm)
