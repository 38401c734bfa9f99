"""No test binds a port a relay binds by default (tests/conftest.py installs this in every
test process).

A relay an operator or another session runs on this machine holds its default ports (QUIC
4433, metrics and admin 9464: relay/options.py), so a test that binds one fails with
"address already in use" there, and only there. Tests bind port 0 (the kernel's choice),
or one `processes.free_udp_port` picked below the ephemeral range, never a default one.
Checked twice: every ``socket.socket.bind`` of the test process (in-process relays, asyncio
servers, bare sockets), and every ``kvcs relay`` command line a test starts (resolved as
the relay resolves it: flags, then environment, then its configuration file).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def default_ports() -> frozenset[int]:
    """Every port a relay binds when not told otherwise."""
    from relay.options import RelayConfig, key_fields

    ports = {k.field.default[1] for k in key_fields()
             if k.meta["kind"].startswith("hostport") and isinstance(k.field.default, tuple)}
    ports |= {f.default for f in dataclasses.fields(RelayConfig) if f.name == "listen_port"}
    return frozenset(ports)


DEFAULT_PORTS = default_ports()


class DefaultPortBound(AssertionError):
    """A test bound, or started a relay that would bind, one of :data:`DEFAULT_PORTS`."""


# what the current test did wrong, also where the code under test swallowed the error
violations: list[str] = []


def _refuse(what: str) -> None:
    message = (f"{what}: a default relay port ({', '.join(map(str, sorted(DEFAULT_PORTS)))}) "
               "collides with any relay running on this machine; bind port 0")
    violations.append(message)
    raise DefaultPortBound(message)


def relay_default_ports(args: str | bytes | Sequence[Any], env: Mapping[str, str] | None
                        ) -> set[int]:
    """The default ports a ``kvcs relay`` command line would bind; empty for any other
    command, for one run in a network namespace of its own (tests/net), and for one that
    binds nothing (``--print-config``, a configuration the relay refuses)."""
    argv = shlex.split(os.fsdecode(args)) if isinstance(args, (str, bytes)) else \
        [os.fsdecode(a) for a in args]
    if argv[:2] == ["ip", "netns"]:
        return set()
    at = next((i for i, a in enumerate(argv) if a == "relay.cli" or Path(a).name == "kvcs"),
              None)
    if at is None or argv[at + 1:at + 2] != ["relay"]:
        return set()
    import click

    from relay.cli import relay as command
    from relay.config import ConfigError, load

    try:
        params = dict(command.make_context("relay", argv[at + 2:],
                                           resilient_parsing=True).params)
    except click.ClickException:
        return set()
    config_file = params.pop("config_file", None)
    if params.pop("print_config", False):
        return set()
    try:
        settings = load(params, os.environ if env is None else env, config_file)
    except ConfigError:
        return set()
    bound = {settings.listen[1]}
    if settings.metrics_listen is not None:
        bound.add(settings.metrics_listen[1])
    return bound & DEFAULT_PORTS


def install() -> None:
    """Guard ``socket.socket.bind`` and ``subprocess.Popen`` (which asyncio's subprocesses
    use too) for the rest of this process."""
    bind = socket.socket.bind
    popen_init = subprocess.Popen.__init__

    def guarded_bind(self: socket.socket, address: Any) -> None:
        if isinstance(address, tuple) and len(address) >= 2 and address[1] in DEFAULT_PORTS:
            _refuse(f"bind to {address!r}")
        bind(self, address)

    def guarded_popen(self: subprocess.Popen[Any], args: Any, *a: Any, **kw: Any) -> None:
        if ports := relay_default_ports(args, kw.get("env")):
            _refuse(f"a relay started on port(s) {sorted(ports)}: {args!r}")
        popen_init(self, args, *a, **kw)

    socket.socket.bind = guarded_bind  # type: ignore[method-assign]
    subprocess.Popen.__init__ = guarded_popen  # type: ignore[assignment,method-assign]
