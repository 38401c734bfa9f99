"""The relay's configuration: keys, each with a CLI flag, a ``KVCS_RELAY_*`` environment twin
and a TOML key, resolved flag > env > file > default.

The keys are the fields of relay/options.py that carry setting metadata (name, help, kind,
default, unit): this module parses and resolves them, cli.py builds its options from them,
``--print-config`` walks them, and docs/configuration.md's table is rendered from them
(``relay.options.settings_table``; a test keeps the docs equal to it).
Authorization tokens are secrets and come only from TOML files (``[[auth.tokens]]`` in the
config file or in ``tokens_file``), never from a flag (visible in ``ps``) or the environment
(visible in ``/proc``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from relay.moqt.namespace_text import parse_namespace
from relay.options import (
    ENV_PREFIX,
    PASSED_ON,
    KeyField,
    RelayConfig,
    RelayOptions,
    Role,
    key_fields,
    usable_cores,
)
from relay.session.tokens import read_token_file
from relay.transport.config import CONGESTION_CONTROLS, parse_datagram_size


class ConfigError(ValueError):
    """An invalid configuration; the message is one line naming the key and its source."""


# -- value parsers: text (flag, env) and TOML values both go through them ----------------------


def _hostport(v: Any) -> tuple[str, int]:
    s = str(v)
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {s!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _hostport_or_off(v: Any) -> tuple[str, int] | None:
    return None if str(v).strip().lower() in ("off", "none", "") else _hostport(v)


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"expected an integer, got {v!r}")
    n = int(v, 0) if isinstance(v, str) else int(v)
    if n < 0:
        raise ValueError(f"must not be negative, got {n}")
    return n


def _positive_float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {v!r}")
    x = float(v)
    if not x > 0:
        raise ValueError(f"must be positive, got {v!r}")
    return x


def _opt_float(v: Any) -> float | None:
    return None if v in (None, "", "none") else _positive_float(v)


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {v!r}")


def _path(v: Any) -> Path:
    if not str(v):
        raise ValueError("empty path")
    return Path(str(v))


def _opt_path(v: Any) -> Path | None:
    return None if v in (None, "") else Path(str(v))


def _str_list(v: Any) -> list[str]:
    if isinstance(v, str):  # env: comma-separated
        return [x.strip() for x in v.split(",") if x.strip()]
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return list(v)
    raise ValueError(f"expected a list of strings, got {v!r}")


def _workers(v: Any) -> int:
    """A count of worker processes, or "auto": one per usable core."""
    if str(v).strip().lower() == "auto":
        return usable_cores()
    n = _int(v)
    if n < 1:
        raise ValueError(f"expected a positive count or auto, got {v!r}")
    return n


def _choice(*choices: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        s = str(v).strip().lower()
        if s not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return s
    return parse


def _wt_path(v: Any) -> str:
    s = str(v)
    if not s.startswith("/") or any(c.isspace() or c in "?#" for c in s):
        raise ValueError(f"expected a path such as /moq, got {v!r}")
    return s


def _log_level(v: Any) -> str:
    s = str(v).strip().upper()
    if s not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"expected DEBUG, INFO, WARNING, ERROR or CRITICAL, got {v!r}")
    return s


# a key's parser by the kind its field declares (relay/options.py)
_PARSERS: dict[str, Callable[[Any], Any]] = {
    "hostport": _hostport, "hostport_or_off": _hostport_or_off, "int": _int,
    "positive_float": _positive_float, "opt_float": _opt_float, "bool": _bool, "path": _path,
    "opt_path": _opt_path, "str_list": _str_list, "workers": _workers, "wt_path": _wt_path,
    "log_level": _log_level, "congestion_control": _choice(*CONGESTION_CONTROLS),
    "datagram_size": parse_datagram_size,
}


@dataclass(frozen=True)
class Key(KeyField):
    """One configuration key (a field of relay/options.py) and the parser of its values."""

    parse: Callable[[Any], Any]

    @classmethod
    def of(cls, kf: KeyField) -> Key:
        kind, choices = kf.meta["kind"], kf.meta["choices"]
        return cls(kf.owner, kf.field, _choice(*choices) if kind == "choice" else _PARSERS[kind])


KEYS: tuple[Key, ...] = tuple(Key.of(kf) for kf in key_fields())
KEY_BY_NAME = {k.name: k for k in KEYS}
# TOML-only tables (secrets and structured values)
TABLES = ("auth", "scopes")


@dataclass
class Settings:
    """The effective configuration and where each value came from."""

    values: dict[str, Any]
    sources: dict[str, str]
    auth_tokens: list[dict[str, Any]] = field(default_factory=list)
    config_file: Path | None = None
    admin_token: str | None = None  # read from admin_token_file; a secret, never rendered
    upstream_token: bytes | None = None  # read from upstream_token; a secret, never rendered
    peer_token: bytes | None = None  # read from peer_token; a secret, never rendered
    # [scopes."<hex Scope ID>"]: (memory_bytes, lmdb_bytes), None where not given
    scope_overrides: dict[bytes, tuple[int | None, int | None]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def relay_config(self) -> RelayConfig:
        """The :class:`RelayConfig` these settings describe: each key sets its own field
        (the launcher's few that the relay takes as they are too); the rest are read here."""
        v = self.values

        def own(owner: type) -> dict[str, Any]:
            return {k.field.name: _copy(v[k.name]) for k in KEYS
                    if k.owner is owner
                    or (owner is RelayConfig and k.name in PASSED_ON)}

        cfg = RelayConfig(**own(RelayConfig), options=RelayOptions(**own(RelayOptions)))
        cfg.listen_host, cfg.listen_port = v["listen"]
        cfg.auth_tokens = [dict(t) for t in self.auth_tokens]
        cfg.admin_token = self.admin_token
        cfg.upstream_token = self.upstream_token
        cfg.peer_token = self.peer_token
        cfg.scope_quotas = self.scope_quotas()
        return cfg

    def scope_quotas(self) -> Any:
        """The :class:`storage.quota.ScopeQuotas` configured, or None."""
        from storage.quota import ScopeQuotas

        v = self.values
        if not (v["scope_memory_bytes"] or v["scope_lmdb_bytes"] or self.scope_overrides):
            return None
        return ScopeQuotas(v["scope_memory_bytes"] or None, v["scope_lmdb_bytes"] or None,
                           dict(self.scope_overrides))


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value  # lists: not shared


def _parse(key: Key, raw: Any, source: str) -> Any:
    try:
        return key.parse(raw)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{key.name} ({source}): {e}") from None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: {e}") from None


def _auth_tokens(table: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(table, dict) or set(table) - {"tokens"}:
        raise ConfigError(f"{where}: [auth] holds only 'tokens'")
    tokens = table.get("tokens", [])
    if not isinstance(tokens, list):
        raise ConfigError(f"{where}: auth.tokens must be an array of tables")
    out = []
    for i, t in enumerate(tokens):
        at = f"{where}: auth.tokens[{i}]"
        if not isinstance(t, dict) or set(t) - {"token", "prefixes", "roles"}:
            raise ConfigError(f"{at} takes token, prefixes and roles")
        if not isinstance(t.get("token"), str) or not t["token"]:
            raise ConfigError(f"{at}.token must be a non-empty string")
        for name in ("prefixes", "roles"):
            if not isinstance(t.get(name, []), list) or \
                    not all(isinstance(x, str) for x in t.get(name, [])):
                raise ConfigError(f"{at}.{name} must be a list of strings")
        for r in t.get("roles", []):
            if r not in {x.value for x in Role}:
                raise ConfigError(f"{at}.roles: unknown role {r!r} (publish, subscribe)")
        for p in t.get("prefixes", []):
            try:
                parse_namespace(p)
            except ValueError as e:
                raise ConfigError(f"{at}.prefixes: {e}") from None
        out.append({"token": t["token"], "prefixes": list(t.get("prefixes", [])),
                    "roles": list(t.get("roles", []))})
    return out


def load(flags: Mapping[str, Any], env: Mapping[str, str] | None = None,
         config_file: Path | None = None) -> Settings:
    """Resolve every key: ``flags`` (only those given on the command line, by key name),
    then ``env`` (``KVCS_RELAY_*``), then the TOML ``config_file``, then the default.
    Raises :class:`ConfigError`."""
    env = os.environ if env is None else env
    if config_file is None and env.get(ENV_PREFIX + "CONFIG"):
        config_file = Path(env[ENV_PREFIX + "CONFIG"])
    file_values: dict[str, Any] = {}
    tokens: list[dict[str, Any]] = []
    scope_overrides: dict[bytes, tuple[int | None, int | None]] = {}
    if config_file is not None:
        where = str(config_file)
        data = _read_file(config_file)
        for name, raw in data.items():
            if name == "scopes":
                scope_overrides = _scope_table(raw, where)
            elif name in TABLES:
                tokens = _auth_tokens(raw, where)
            elif name in KEY_BY_NAME:
                file_values[name] = raw
            else:
                raise ConfigError(f"{where}: unknown key {name!r}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in KEYS:
        if key.name in flags and flags[key.name] not in (None, ()):
            raw, src = flags[key.name], f"flag {key.flag}"
            if key.multiple:
                raw = list(raw)
        elif key.env in env:
            raw, src = env[key.env], f"env {key.env}"
        elif key.name in file_values:
            raw, src = file_values[key.name], f"file {config_file}"
        else:
            values[key.name], sources[key.name] = key.default, "default"
            continue
        values[key.name] = _parse(key, raw, src)
        sources[key.name] = src
    if values["tokens_file"] is not None:
        where = str(values["tokens_file"])
        extra = _read_file(values["tokens_file"])
        if set(extra) - {"auth"}:
            raise ConfigError(f"{where}: a tokens file holds only [[auth.tokens]]")
        tokens += _auth_tokens(extra.get("auth", {}), where)
    admin_token = _admin_token(values["admin_token_file"], sources["admin_token_file"])
    if (values["cert"] is None) != (values["key"] is None):
        raise ConfigError("cert and key go together (give both or neither)")
    for name in ("cert", "key", "upstream_ca", "peer_ca"):
        p = values[name]
        if p is not None and not Path(p).is_file():
            raise ConfigError(f"{name} ({sources[name]}): {p} is not a file")
    for url in values["upstream"]:
        _check_upstream(url, values["listen"], sources["upstream"])
    if values["quic_backend"] == "qh3" and sources["congestion_control"] != "default":
        raise ConfigError(
            f"congestion_control ({sources['congestion_control']}) applies to aioquic only: "
            "qh3's native core has its own congestion control and no choice (drop it, or "
            "use quic_backend = \"aioquic\")")
    settings = Settings(values, sources, tokens, config_file)
    settings.admin_token = admin_token
    if values["upstream_token"] is not None:
        try:
            settings.upstream_token = read_token_file(values["upstream_token"])
        except ValueError as e:
            raise ConfigError(f"upstream_token ({sources['upstream_token']}): {e}") from None
    if values["peer_token"] is not None:
        try:
            settings.peer_token = read_token_file(values["peer_token"])
        except ValueError as e:
            raise ConfigError(f"peer_token ({sources['peer_token']}): {e}") from None
    if values["peer"]:
        _check_peers(values, sources, tokens, settings.peer_token)
    settings.scope_overrides = scope_overrides
    return settings


def _check_upstream(url: str, listen: tuple[str, int], source: str) -> None:
    """An upstream URL must name a relay, and not this one: a relay that is its own
    upstream would send every request it cannot answer to itself (docs/relay.md, "Cycles").
    Names other than ``localhost`` are not resolved here (no DNS lookups in a configuration
    check): the loop probe at start finds those."""
    try:
        parts = urlsplit(url)
        port = 443 if parts.port is None else parts.port
    except ValueError as e:
        raise ConfigError(f"upstream ({source}): {url!r}: {e}") from None
    if parts.scheme not in ("moqt", "https") or not parts.hostname:
        raise ConfigError(f"upstream ({source}): expected moqt://HOST:PORT/ or "
                          f"https://HOST:PORT/PATH, got {url!r}")
    if port == listen[1] and _reaches(parts.hostname, listen[0]):
        raise ConfigError(f"upstream ({source}): {url} is this relay's own listener "
                          f"(listen {listen[0]}:{listen[1]}); a relay cannot be its own upstream")


def _addresses(host: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address] | None:
    """The addresses of an IP literal or ``localhost``; None for any other name."""
    if host.lower() == "localhost":
        return {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    try:
        return {ipaddress.ip_address(host)}
    except ValueError:
        return None


def _is_local(a: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """One of this host's addresses: binding a socket to it works."""
    if a.is_loopback or a.is_unspecified:
        return True
    try:
        with socket.socket(socket.AF_INET6 if a.version == 6 else socket.AF_INET,
                           socket.SOCK_DGRAM) as s:
            s.bind((str(a), 0))
    except OSError:
        return False
    return True


def _reaches(host: str, listen_host: str) -> bool:
    """Datagrams sent to ``host`` reach a listener bound to ``listen_host`` (same port)."""
    if host.lower() == listen_host.lower():
        return True
    dest, bound = _addresses(host), _addresses(listen_host)
    if dest is None or bound is None:
        return False
    if any(b.is_unspecified for b in bound):  # every address of the host (of its family)
        v4_only = all(b.version == 4 for b in bound)
        return any(_is_local(a) for a in dest if a.version == 4 or not v4_only)
    # sending to 0.0.0.0 or :: reaches the host's loopback address
    dest = {ipaddress.ip_address("127.0.0.1" if a.version == 4 else "::1")
            if a.is_unspecified else a for a in dest}
    return bool(dest & bound)


def _check_peers(values: dict[str, Any], sources: dict[str, str],
                 tokens: list[dict[str, Any]], peer_token: bytes | None) -> None:
    """Peers (docs/relay.md, "A root of several replicas") with what they need."""
    where = sources["peer"]
    if values["workers"] > 1:
        raise ConfigError(f"peer ({where}): a peer's link lands on one worker of a relay with "
                          "workers > 1 and would see that worker's namespaces only: scale a "
                          "tier of peers with replicas, not workers")
    if tokens and peer_token is None:
        raise ConfigError(f"peer ({where}): with [[auth.tokens]] configured, the peers need "
                          "the token their tier shares (peer_token)")


def _scope_table(table: Any, where: str) -> dict[bytes, tuple[int | None, int | None]]:
    """``[scopes."<hex>"]`` tables of memory_bytes and lmdb_bytes quotas."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [scopes] holds one table per Scope ID in hex")
    out: dict[bytes, tuple[int | None, int | None]] = {}
    for name, t in table.items():
        at = f"{where}: scopes.{name}"
        try:
            scope = bytes.fromhex(name)
        except ValueError:
            raise ConfigError(f"{at}: the key must be a Scope ID in hex") from None
        if not isinstance(t, dict) or not t or set(t) - {"memory_bytes", "lmdb_bytes"}:
            raise ConfigError(f"{at} takes memory_bytes and/or lmdb_bytes")
        try:
            out[scope] = tuple(_int(t[k]) if k in t else None  # type: ignore[assignment]
                               for k in ("memory_bytes", "lmdb_bytes"))
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{at}: {e}") from None
    return out


def _admin_token(path: Path | None, source: str) -> str | None:
    """The admin API's token (at least 16 characters: it guards purges)."""
    if path is None:
        return None
    try:
        return read_token_file(path, min_length=16).decode()
    except ValueError as e:
        raise ConfigError(f"admin_token_file ({source}): {e}") from None


def _show(v: Any) -> str:
    if isinstance(v, tuple) and len(v) == 2:
        return f'"{v[0]}:{v[1]}"'
    if v is None:
        return '""'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(settings: Settings) -> str:
    """The effective configuration as TOML, each value with its source; secrets masked."""
    lines = ["# effective kvcs relay configuration (flag > env > file > default)"]
    for key in KEYS:
        v = settings.values[key.name]
        shown = '"off"' if key.name == "metrics_listen" and v is None else _show(v)
        lines.append(f"{key.name} = {shown}  # {settings.sources[key.name]}")
    for scope, (mem, lm) in settings.scope_overrides.items():
        lines += ["", f'[scopes."{scope.hex()}"]']
        lines += [f"{k} = {q}" for k, q in (("memory_bytes", mem), ("lmdb_bytes", lm))
                  if q is not None]
    for t in settings.auth_tokens:
        lines += ["", "[[auth.tokens]]", 'token = "***"',
                  f"prefixes = {_show(t['prefixes'])}", f"roles = {_show(t['roles'])}"]
    return "\n".join(lines) + "\n"


__all__ = ["ENV_PREFIX", "KEYS", "ConfigError", "Key", "Settings", "load", "render"]
