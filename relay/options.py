"""The relay's settings, defined once: the dataclasses the relay is built from, each setting a
field whose metadata names its configuration key and says what it means.

Three dataclasses, from the inside out:

- :class:`RelayOptions`: what the core (relay/core/relay.py) reads at run time;
- :class:`RelayConfig`: what ``start_relay`` (relay/service.py) composes a relay from;
- :class:`LaunchOptions`: what only ``kvcs relay`` reads (the listen address, files holding
  secrets, workers, logs) and turns into some of the fields above.

A field made with :func:`setting` is a configuration key: a TOML key of its key name, the
flag ``--key-name`` and the environment variable ``KVCS_RELAY_KEY_NAME``
(relay/config.py parses and resolves them, relay/cli.py makes the flags, and
:func:`settings_table` renders docs/configuration.md's table, which a test keeps equal). A
field without that metadata is composition or protocol tuning, set only by code.

This module imports only the standard library: everything above it may read the settings,
nothing here reaches up (tests/test_layers.py).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

ENV_PREFIX = "KVCS_RELAY_"
# The UDP port of raw QUIC and WebTransport when none is given (RelayConfig, `listen`).
DEFAULT_PORT = 4433


class Role(Enum):
    """What an authorization token (``[[auth.tokens]]``) may be granted."""

    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"


def usable_cores() -> int:
    """The cores this process may run on: what ``workers = "auto"`` starts one worker per."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def setting(default: Any = dataclasses.MISSING, *, help: str, kind: str, key: str = "",
            unit: str = "", see: str = "", choices: tuple[str, ...] = (),
            factory: Callable[[], Any] | None = None, text: str | None = None) -> Any:
    """A field that is a configuration key.

    ``kind`` names the parser relay/config.py applies to a flag, env or TOML value ("int",
    "path", "bool", ...); ``key`` the key when it differs from the field's name; ``see`` a
    Markdown pointer the docs table adds to ``help``; ``text`` the default as written in a
    flag or TOML value where it is not simply the default printed."""
    meta = {"help": help, "kind": kind, "key": key, "unit": unit, "see": see,
            "choices": choices, "text": text}
    if factory is not None:
        return field(default_factory=factory, metadata={"setting": meta})
    return field(default=default, metadata={"setting": meta})


@dataclass
class RelayOptions:
    # What every session of the relay advertises (SETUP) and tolerates: a
    # relay.session.SessionConfig; None: the relay's own (relay/core/relay.py,
    # relay_session_config). Its upstream links use the same, with their own token.
    session: Any = None
    max_backlog_bytes: int = setting(
        256 * 1024 * 1024, kind="int", unit="bytes",
        help="Bytes queued for one subscriber beyond which its subscription ends as too far "
             "behind.")
    ingest_hold_bytes: int = setting(
        1024 * 1024, kind="int", unit="bytes",
        see='[relay.md, "Overload"](relay.md#overload)',
        help="Bytes queued for a Track's least-behind subscriber beyond which the relay stops "
             "taking that Track's Objects in until the subscriber has drained half of them "
             "(the publisher is held back by QUIC flow control; aioquic only); 0: never.")
    default_fill_timeout: float = setting(
        5.0, key="fill_timeout", kind="positive_float", unit="seconds",
        help="Seconds a fill or FETCH waits for unknown Objects when the request gives no "
             "FILL_TIMEOUT.")
    max_rendezvous_timeout: int = setting(
        10000, kind="int", unit="milliseconds",
        see='[relay.md, "Rendezvous"](relay.md#rendezvous)',
        help="Longest a SUBSCRIBE for a Track nobody publishes is held for a publisher: its "
             "RENDEZVOUS_TIMEOUT, capped by this. 0: answered at once.")
    in_flight_wait: float = setting(
        1.0, kind="positive_float", unit="seconds",
        see='[relay.md, "Fills and FETCH from cache"](relay.md#fills-and-fetch-from-cache)',
        help="Seconds a fill or FETCH waits for a range of a live Track the cache lacks, at or "
             "below its Largest Object, to arrive on the upstream subscription before it "
             "FETCHes it upstream (within the request's own fill timeout).")
    max_sessions: int = setting(
        0, kind="int",
        help="Sessions served at once; more are refused before SETUP and counted. 0: no bound.")
    upstream_push: bool = setting(
        False, kind="bool", see='[relay.md, "Trees"](relay.md#trees)',
        help="PUBLISH every Track this relay's publishers PUBLISH to the upstream relay as it "
             "arrives (off: pulled on demand).")
    lmdb_commit_delay: int = setting(
        5000, kind="int", unit="milliseconds",
        see='[relay.md, "Persistence"](relay.md#persistence)',
        help="Longest a complete Track waits for a quiet moment (50 ms with no Object in or "
             "out) before it is written to LMDB; memory three quarters full or a shutdown "
             "writes at once. 0: written as soon as it is complete.")


@dataclass
class RelayConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = DEFAULT_PORT
    data_dir: Path = setting(
        Path("data"), kind="path",
        help="Directory of the LMDB store and of the self-signed certificate.")
    cert: Path | None = setting(
        None, kind="opt_path",
        help="TLS certificate chain (PEM); with --key. Without both, a self-signed "
             "certificate is made in the data directory.")
    key: Path | None = setting(None, kind="opt_path", help="TLS private key (PEM); with --cert.")
    upstream: list[str] = setting(
        kind="str_list", factory=list,
        help="Upstream relay URL (moqt://HOST:PORT/ or https://…); repeatable, tried in order. "
             "Env: comma-separated.")
    upstream_spread: bool = setting(
        False, kind="bool", see='[relay.md, "A root of several replicas"]'
                                '(relay.md#root-replicas)',
        help="Start at the upstream URL this relay's host name picks (a StatefulSet ordinal, "
             "else a hash) instead of the first, so a tier's replicas spread over the root "
             "tier's replicas.")
    upstream_ca: Path | None = setting(
        None, kind="opt_path", help="CA file for the upstream relay's certificate.")
    upstream_insecure: bool = setting(
        False, kind="bool",
        help="Do not verify the upstream certificate (loopback development only).")
    # Presented to the upstream relay in SETUP (its per-scope authorization applies to
    # everything this relay asks for on behalf of its clients); None: no token. Read from
    # the file LaunchOptions.upstream_token names.
    upstream_token: bytes | None = None
    # PINGs every third of it keep a quiet link up: a dead upstream is noticed within about
    # this long.
    upstream_idle_timeout: float = setting(
        3.0, kind="positive_float", unit="seconds",
        help="Seconds without a packet from the upstream relay or a peer (PINGed every third "
             "of it) before its session counts as dead; also bounds each dial.")
    peer: list[str] = setting(
        kind="str_list", factory=list, see='[relay.md, "A root of several replicas"]'
                                           '(relay.md#root-replicas)',
        help="A peer relay of this tier (moqt://HOST:PORT/ or https://…), linked as a sibling: "
             "each routes to what the other's clients announced. Repeatable; this relay's own "
             "URL is recognised and skipped. Env: comma-separated.")
    peer_ca: Path | None = setting(
        None, kind="opt_path", help="CA file for the peer relays' certificates.")
    peer_insecure: bool = setting(
        False, kind="bool",
        help="Do not verify the peer relays' certificates (loopback development only).")
    # Presented to the peers in SETUP and granted everything here when tokens are on (the
    # tier shares it); None: no token. Read from the file LaunchOptions.peer_token names.
    peer_token: bytes | None = None
    upstream_announce_fields: int = setting(
        1, kind="int", see='[relay.md, "Trees"](relay.md#trees)',
        help="Announcing upward: one PUBLISH_NAMESPACE per distinct first N fields of the "
             "namespaces this relay holds (1: one for all of KVCS; 2: per scope); 0: one "
             "per whole namespace.")
    memory_bytes: int = setting(
        1 << 30, kind="int", unit="bytes",
        help="Byte bound of the memory tier (per-entry overhead included).")
    lmdb_bytes: int = setting(8 << 30, kind="int", unit="bytes",
                              help="Byte bound of the LMDB tier.")
    lmdb_max_age: float | None = setting(
        None, kind="opt_float", unit="seconds",
        help="Seconds after which a committed Track expires from LMDB (unset: never).")
    # The transport's own default (QuicSettings), where the relay has no reason to differ
    # (a test keeps them equal)
    max_datagram_size: int | str = setting(
        "auto", kind="datagram_size", unit="bytes",
        see='[transport.md, "Datagram size"](transport.md#datagram-size)',
        help="UDP payload size of the QUIC packets sent: auto (per connection, the MTU of the "
             "route to the peer minus IP and UDP headers, up to 16384 on aioquic and 65507 on "
             "qh3; 1200 where unknown) or "
             "a number from 1200 to 16384 (1200: safe on any path, the switch back).")
    # "aioquic" or "qh3"; None: the process default (relay.transport.backend), which tests
    # switch to run the relay on either backend. Set from LaunchOptions.quic_backend.
    quic_backend: str | None = None
    # aioquic's; qh3 has its own. The transport's default too (a test keeps them equal).
    congestion_control: str = setting(
        "bbr", kind="congestion_control", see='[transport.md, "Congestion control"]'
                                              "(transport.md#congestion-control)",
        help="aioquic congestion controller of all the relay's connections: bbr (paces at a "
             "model of the path; random loss does not slow it), or aioquic's loss-based reno "
             "or cubic. qh3 has its own and no choice (setting it with qh3 is an error); see "
             "docs/transport.md.")
    # Small: Objects waiting for a slow subscriber wait in the relay's scheduler (in
    # priority order, counted against max_backlog_bytes), not in QUIC's queue.
    send_buffer_bytes: int = setting(
        1 << 20, kind="int", unit="bytes",
        help="Bytes queued for sending on one connection before its writers wait (half of it "
             "per stream).")
    wt_path: str = setting("/moq", kind="wt_path",
                           help="Path of the WebTransport endpoint (https://HOST:PORT<path>).")
    options: RelayOptions = field(default_factory=RelayOptions)
    auth_tokens: list[dict[str, object]] = field(default_factory=list)
    # TCP (host, port) of /metrics, /healthz, /readyz; None: no listener (the library
    # default, so in-process relays in tests do not fight over a port; the CLI's is
    # LaunchOptions.metrics_listen).
    metrics_listen: tuple[str, int] | None = None
    drain_timeout: float = setting(
        10.0, kind="positive_float", unit="seconds",
        help="Seconds, after SIGTERM/SIGINT and GOAWAY, for fills and FETCHes in flight and "
             "LMDB commits to finish.")
    ready_file: Path | None = setting(
        None, kind="opt_path",
        help='Once listening, write {"port", "metrics_port", "pid"} as JSON to this file (for '
             "supervisors and tests).")
    malloc_defaults: bool = setting(
        False, kind="bool", see='[relay.md, "The heap"](relay.md#the-heap)',
        help="Leave glibc's malloc at its defaults. Unset, the relay makes malloc keep freed "
             "buffers for reuse (mmap threshold 32 MiB, trim threshold 64 MiB) instead of "
             "faulting fresh pages in for each large buffer, unless glibc's "
             "MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ is set.")
    # Bearer token of /admin/ on the metrics listener; None: the admin API is off (404).
    admin_token: str | None = None
    # Per-scope byte quotas of both tiers (a storage.quota.ScopeQuotas); None: none.
    scope_quotas: Any = None
    # One worker of `kvcs relay --workers N` (a relay.service.WorkerRole; docs/workers.md):
    # share the UDP port (SO_REUSEPORT), serve siblings on a loopback listener, link to theirs.
    worker: Any = None
    # Wall clock of both tiers and of expiry (lmdb_max_age, MAX_CACHE_DURATION); tests
    # inject one to age the cache without waiting.
    clock: Callable[[], float] = time.time


@dataclass
class LaunchOptions:
    """What ``kvcs relay`` reads for itself: values it turns into RelayConfig fields (the
    listen address, files holding secrets, quotas) and settings of the process."""

    listen: tuple[str, int] = setting(
        ("127.0.0.1", DEFAULT_PORT), kind="hostport",
        help="UDP HOST:PORT for raw QUIC (moqt-22) and WebTransport.")
    # the relay's choice made explicit; RelayConfig's None means the process default
    quic_backend: str = setting(
        "aioquic", kind="choice", choices=("aioquic", "qh3"),
        help="QUIC library: aioquic, or qh3 (the fast extra: a native QUIC core, several times "
             "the throughput per core); see docs/transport.md.")
    workers: int = setting(
        1, kind="workers",
        help="Relay worker processes sharing the UDP port and the LMDB store (SO_REUSEPORT); "
             "auto: one per usable core. See docs/workers.md.")
    metrics_listen: tuple[str, int] | None = setting(
        ("127.0.0.1", 9464), kind="hostport_or_off",
        help="TCP HOST:PORT of the /metrics, /healthz and /readyz listener, or 'off'.")
    upstream_token: Path | None = setting(
        None, kind="opt_path",
        help="File holding the token the relay presents to its upstream relay "
             "(AUTHORIZATION_TOKEN in SETUP); unset: none.")
    peer_token: Path | None = setting(
        None, kind="opt_path",
        help="File holding the token the peer relays of this tier share (presented to them, "
             "granted everything here); needed with --peer when tokens are configured.")
    scope_memory_bytes: int = setting(
        0, kind="int", unit="bytes",
        help='Memory-tier quota of each scope (KVCS Scope ID) without one of its own in '
             '`[scopes."<hex>"]`; 0: none.')
    scope_lmdb_bytes: int = setting(
        0, kind="int", unit="bytes",
        help='LMDB quota of each scope without one of its own in `[scopes."<hex>"]`; 0: none.')
    tokens_file: Path | None = setting(
        None, kind="opt_path",
        help="A TOML file holding only [[auth.tokens]] (e.g. a mounted Kubernetes Secret); "
             "added to the tokens of the config file.")
    admin_token_file: Path | None = setting(
        None, kind="opt_path",
        help="File holding the bearer token of the admin API (/admin/ on the metrics "
             "listener); unset: the admin API is off.")
    log_level: str = setting("INFO", kind="log_level",
                             help="DEBUG, INFO, WARNING, ERROR or CRITICAL.")
    log_format: str = setting(
        "text", kind="choice", choices=("text", "json"),
        help="text (one line per event) or json (one object per line).")


# Launch options given on, as they are, to the RelayConfig field of the same name (the
# others are read by the launcher: relay/config.py, Settings.relay_config)
PASSED_ON = ("quic_backend", "metrics_listen")


@dataclass(frozen=True)
class KeyField:
    """One configuration key: the field holding it and where that field sits."""

    owner: type  # RelayOptions, RelayConfig or LaunchOptions
    field: dataclasses.Field[Any]

    @property
    def meta(self) -> dict[str, Any]:
        return self.field.metadata["setting"]  # type: ignore[no-any-return]

    @property
    def name(self) -> str:
        return self.meta["key"] or self.field.name

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def default(self) -> Any:
        f = self.field
        return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]

    @property
    def text_default(self) -> str:
        """The default as written in a flag, env var or TOML value ('' for unset)."""
        if self.meta["text"] is not None:
            return str(self.meta["text"])
        return _text(self.default)

    @property
    def help(self) -> str:
        return str(self.meta["help"])

    @property
    def multiple(self) -> bool:  # a repeatable flag (lists)
        return self.meta["kind"] == "str_list"

    @property
    def is_flag(self) -> bool:  # a boolean switch on the command line
        return self.meta["kind"] == "bool"


def _text(v: Any) -> str:
    if v is None or v == []:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return f"{v[0]}:{v[1]}"
    return str(v)


def key_fields() -> Iterator[KeyField]:
    """Every configuration key, in the order of the docs: the launcher's, then the relay's,
    then the core's."""
    for owner in (LaunchOptions, RelayConfig, RelayOptions):
        for f in dataclasses.fields(owner):
            if "setting" in f.metadata:
                yield KeyField(owner, f)


def settings_table() -> str:
    """docs/configuration.md's table of keys (scripts/config_table.py prints it)."""
    lines = ["| Key | Flag | Environment | Default | Unit | Meaning |",
             "|-----|------|-------------|---------|------|---------|"]
    for k in key_fields():
        meaning = k.help + (f" See {k.meta['see']}." if k.meta["see"] else "")
        lines.append(f"| `{k.name}` | `{k.flag}` | `{k.env}` | `{k.text_default or 'unset'}` "
                     f"| {k.meta['unit'] or '—'} | {meaning} |")
    return "\n".join(lines) + "\n"


__all__ = ["ENV_PREFIX", "PASSED_ON", "KeyField", "LaunchOptions", "RelayConfig",
           "RelayOptions", "Role", "key_fields", "setting", "settings_table", "usable_cores"]
