"""The relay's configuration: one table of keys, each with a CLI flag, a ``KVCS_RELAY_*``
environment twin and a TOML key, resolved flag > env > file > default.

The table is the single source: cli.py builds its options from it, ``--print-config`` walks it
and docs/configuration.md documents it (a test checks that every key is documented).
Authorization tokens are secrets and come only from TOML files (``[[auth.tokens]]`` in the
config file or in ``tokens_file``), never from a flag (visible in ``ps``) or the environment
(visible in ``/proc``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.core.relay import RelayOptions
from relay.service import RelayConfig
from relay.session.tokens import read_token_file
from relay.transport.config import CONGESTION_CONTROLS

ENV_PREFIX = "KVCS_RELAY_"
_QUIC_CC = RelayConfig.congestion_control


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
        from relay.workers import usable_cores

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


@dataclass(frozen=True)
class Key:
    name: str  # TOML key; the flag is --name-with-dashes, the env var KVCS_RELAY_NAME
    parse: Callable[[Any], Any]
    default: Any
    help: str
    text_default: str  # the default as written in a flag, env var or TOML value
    multiple: bool = False  # repeatable flag (lists)
    is_flag: bool = False  # boolean switch on the command line
    # the RelayConfig field it sets ("options.x": RelayOptions.x); "": the key's own name;
    # None: read elsewhere (the CLI, the logs, the token and quota tables)
    to: str | None = ""

    @property
    def target(self) -> str | None:
        return self.name if self.to == "" else self.to

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


KEYS: tuple[Key, ...] = (
    Key("listen", _hostport, (RelayConfig.listen_host, RelayConfig.listen_port),
        "UDP HOST:PORT for raw QUIC (moqt-22) and WebTransport.",
        f"{RelayConfig.listen_host}:{RelayConfig.listen_port}", to=None),
    Key("data_dir", _path, Path("data"), "Directory of the LMDB store and of the self-signed "
        "certificate.", "data"),
    Key("cert", _opt_path, None, "TLS certificate chain (PEM); with --key. Without both, a "
        "self-signed certificate is made in the data directory.", ""),
    Key("key", _opt_path, None, "TLS private key (PEM); with --cert.", ""),
    Key("upstream", _str_list, [], "Upstream relay URL (moqt://HOST:PORT/ or https://…); "
        "repeatable, tried in order. Env: comma-separated.", "", multiple=True),
    Key("upstream_ca", _opt_path, None, "CA file for the upstream relay's certificate.", ""),
    Key("upstream_token", _opt_path, None, "File holding the token the relay presents to "
        "its upstream relay (AUTHORIZATION_TOKEN in SETUP); unset: none.", "", to=None),
    Key("upstream_idle_timeout", _positive_float, RelayConfig.upstream_idle_timeout,
        "Seconds without a packet from the upstream relay (PINGed every third of it) before "
        "its session counts as dead; also bounds each dial.",
        str(RelayConfig.upstream_idle_timeout)),
    Key("upstream_announce_fields", _int, RelayConfig.upstream_announce_fields,
        "Announcing upward: one PUBLISH_NAMESPACE per distinct first N fields of the "
        "namespaces this relay holds (2: per KVCS scope); 0: one per whole namespace.",
        str(RelayConfig.upstream_announce_fields)),
    Key("upstream_push", _bool, False, "PUBLISH every Track this relay's publishers PUBLISH "
        "to the upstream relay as it arrives (off: pulled on demand).", "false", is_flag=True,
        to="options.upstream_push"),
    Key("upstream_insecure", _bool, False, "Do not verify the upstream certificate (loopback "
        "development only).", "false", is_flag=True),
    Key("memory_bytes", _int, RelayConfig.memory_bytes, "Byte bound of the memory tier "
        "(per-entry overhead included).", str(RelayConfig.memory_bytes)),
    Key("lmdb_bytes", _int, RelayConfig.lmdb_bytes, "Byte bound of the LMDB tier.",
        str(RelayConfig.lmdb_bytes)),
    Key("lmdb_max_age", _opt_float, None, "Seconds after which a committed Track expires "
        "from LMDB (unset: never).", ""),
    Key("scope_memory_bytes", _int, 0, "Memory-tier quota of each scope (KVCS Scope ID) "
        "without one of its own in [scopes.\"<hex>\"]; 0: none.", "0", to=None),
    Key("scope_lmdb_bytes", _int, 0, "LMDB quota of each scope without one of its own in "
        "[scopes.\"<hex>\"]; 0: none.", "0", to=None),
    Key("max_datagram_size", _int, RelayConfig.max_datagram_size, "UDP payload size; raise "
        "to the path MTU (e.g. 8952) on jumbo-frame paths.", str(RelayConfig.max_datagram_size)),
    Key("workers", _workers, 1, "Relay worker processes sharing the UDP port and the LMDB "
        "store (SO_REUSEPORT); auto: one per usable core. See docs/workers.md.", "1",
        to=None),
    Key("quic_backend", _choice("aioquic", "qh3"), "aioquic", "QUIC library: aioquic, or "
        "qh3 (the fast extra: a native QUIC core, several times the throughput per core); "
        "see docs/transport.md.", "aioquic"),
    Key("congestion_control", _choice(*CONGESTION_CONTROLS), _QUIC_CC, "aioquic congestion "
        "controller of all the relay's connections: bbr (paces at a model of the path; random "
        "loss does not slow it), or aioquic's loss-based reno or cubic. qh3 has its own and "
        "no choice (setting it with qh3 is an error); see docs/transport.md.", _QUIC_CC),
    Key("max_backlog_bytes", _int, RelayOptions.max_backlog_bytes, "Bytes queued for one "
        "subscriber beyond which its subscription ends as too far behind.",
        str(RelayOptions.max_backlog_bytes), to="options.max_backlog_bytes"),
    Key("max_sessions", _int, RelayOptions.max_sessions, "Sessions served at once; more are "
        "refused before SETUP and counted. 0: no bound.", str(RelayOptions.max_sessions),
        to="options.max_sessions"),
    Key("fill_timeout", _positive_float, RelayOptions.default_fill_timeout, "Seconds a fill "
        "or FETCH waits for unknown Objects when the request gives no FILL_TIMEOUT.",
        str(RelayOptions.default_fill_timeout), to="options.default_fill_timeout"),
    Key("metrics_listen", _hostport_or_off, ("127.0.0.1", 9464), "TCP HOST:PORT of the "
        "/metrics, /healthz and /readyz listener, or 'off'.", "127.0.0.1:9464"),
    Key("drain_timeout", _positive_float, RelayConfig.drain_timeout, "Seconds, after "
        "SIGTERM/SIGINT and GOAWAY, for fills and FETCHes in flight and LMDB commits to "
        "finish.", str(RelayConfig.drain_timeout)),
    Key("ready_file", _opt_path, None, "Once listening, write {\"port\", \"metrics_port\", "
        "\"pid\"} as JSON to this file (for supervisors and tests).", ""),
    Key("send_buffer_bytes", _int, RelayConfig.send_buffer_bytes, "Bytes queued for sending "
        "on one connection before its writers wait (half of it per stream).",
        str(RelayConfig.send_buffer_bytes)),
    Key("wt_path", _wt_path, RelayConfig.wt_path, "Path of the WebTransport endpoint "
        "(https://HOST:PORT<path>).", RelayConfig.wt_path),
    Key("tokens_file", _opt_path, None, "A TOML file holding only [[auth.tokens]] (e.g. a "
        "mounted Kubernetes Secret); added to the tokens of the config file.", "", to=None),
    Key("admin_token_file", _opt_path, None, "File holding the bearer token of the admin API "
        "(/admin/ on the metrics listener); unset: the admin API is off.", "", to=None),
    Key("log_level", _log_level, "INFO", "DEBUG, INFO, WARNING, ERROR or CRITICAL.",
        "INFO", to=None),
    Key("log_format", _choice("text", "json"), "text", "text (one line per event) or json "
        "(one object per line).", "text", to=None),
)
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
    # [scopes."<hex Scope ID>"]: (memory_bytes, lmdb_bytes), None where not given
    scope_overrides: dict[bytes, tuple[int | None, int | None]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def relay_config(self) -> Any:
        """The :class:`relay.service.RelayConfig` these settings describe."""
        v = self.values
        cfg = RelayConfig()
        for key in KEYS:
            if key.target is not None:
                obj, _, attr = key.target.rpartition(".")
                value = v[key.name]
                setattr(getattr(cfg, obj) if obj else cfg, attr,
                        list(value) if isinstance(value, list) else value)
        cfg.listen_host, cfg.listen_port = v["listen"]
        cfg.auth_tokens = [dict(t) for t in self.auth_tokens]
        cfg.admin_token = self.admin_token
        cfg.upstream_token = self.upstream_token
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
    from relay.core.auth import Role

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
    for name in ("cert", "key", "upstream_ca"):
        p = values[name]
        if p is not None and not Path(p).is_file():
            raise ConfigError(f"{name} ({sources[name]}): {p} is not a file")
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
    settings.scope_overrides = scope_overrides
    return settings


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
    """The admin API's token: the file's text, surrounding whitespace removed."""
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"admin_token_file ({source}): cannot read {path}: "
                          f"{getattr(e, 'strerror', None) or e}") from None
    if len(token) < 16 or any(c.isspace() for c in token):
        raise ConfigError(f"admin_token_file ({source}): {path} must hold one token of at "
                          "least 16 characters")
    return token


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
