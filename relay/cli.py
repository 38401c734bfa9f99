"""The `kvcs` command line. Errors are one clear line on stderr and a non-zero exit
(2 for an invalid configuration, 1 for a run-time failure such as a port in use)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from relay.config import KEYS, ConfigError, load, render


class _Commands(click.Group):
    """Loads the peer commands (publish, subscribe, fetch) on first use, so `kvcs relay` never
    imports the KVCS library (the relay must not look into payloads)."""

    _peers_loaded = False

    def _load_peers(self) -> None:
        if not self._peers_loaded:
            self._peers_loaded = True
            from relay.peers.cli import register

            register(self)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is None:
            self._load_peers()
            cmd = super().get_command(ctx, name)
        return cmd

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_peers()
        return super().list_commands(ctx)


@click.group(cls=_Commands)
@click.version_option(package_name="kvcs-relay")
def main() -> None:
    """kvcs-relay: a caching MOQT relay for LLM KV caches, and its reference peers."""


def _config_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """One option per configuration key; values stay text here and are parsed (and their
    precedence over env and file decided) by relay.config, so every source is validated
    the same way. Defaults are None: "not given on the command line"."""
    for key in reversed(KEYS):
        # the help is also the docs table's Markdown: code spans read as plain text here
        help_text = (f"{key.help.replace('`', '')} "
                     f"[env {key.env}; default {key.text_default or 'unset'}]")
        if key.is_flag:
            f = click.option(key.flag, key.name, is_flag=True, default=None,
                             help=help_text)(f)
        else:
            f = click.option(key.flag, key.name, multiple=key.multiple, default=None,
                             metavar="TEXT", help=help_text)(f)
    return f


@main.command()
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help="TOML configuration file (env KVCS_RELAY_CONFIG); flags and env win.")
@click.option("--print-config", is_flag=True,
              help="Print the effective configuration (secrets masked) and exit.")
@_config_options
def relay(config_file: Path | None, print_config: bool, **flags: Any) -> None:
    """Run the caching relay."""
    from relay import logs

    try:
        settings = load(flags, config_file=config_file)
    except ConfigError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if print_config:
        click.echo(render(settings), nl=False)
        return
    from relay.transport.backend import BackendUnavailable, get_backend

    try:
        get_backend(settings.quic_backend)
    except BackendUnavailable as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    logs.setup(settings.log_level, settings.log_format,
               secrets=[t["token"] for t in settings.auth_tokens]
               + [settings.admin_token or ""])
    from relay.core.loops import RelayLoop
    from relay.service import WorkerRole, run_forever

    config = settings.relay_config()
    worker_dir = os.environ.get("KVCS_WORKER_DIR")
    try:
        if worker_dir:  # started by a supervisor (relay/workers.py)
            supervisor = os.environ.get("KVCS_WORKER_SUPERVISOR")
            if supervisor:  # a worker must not outlive its supervisor (docs/workers.md)
                from relay.workers import follow_supervisor

                pipe = os.environ.get("KVCS_WORKER_PIPE")
                if not follow_supervisor(int(supervisor), int(pipe) if pipe else None):
                    click.echo("error: the supervisor is gone", err=True)
                    sys.exit(1)
            fd = os.environ.get("KVCS_WORKER_FD")
            config.worker = WorkerRole(int(os.environ["KVCS_WORKER_INDEX"]), Path(worker_dir),
                                       os.environ["KVCS_WORKER_SECRET"],
                                       int(fd) if fd else None,
                                       os.environ.get("KVCS_WORKER_RELAY_ID", ""))
        elif settings.workers > 1:
            from relay.workers import supervise

            env = _as_env(flags)
            if config_file is not None:
                env["KVCS_RELAY_CONFIG"] = str(config_file.resolve())
            sys.exit(asyncio.run(supervise(config, settings.workers, env)))
        asyncio.run(run_forever(config))
    except RelayLoop as e:  # a configuration error, found across relays
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except OSError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        pass
    except Exception as e:  # e.g. an unusable LMDB directory: one line, never a traceback
        click.echo(f"error: {type(e).__name__}: {e}", err=True)
        sys.exit(1)


from relay.admin_client import admin as _admin_command  # noqa: E402 (after the group exists)

main.add_command(_admin_command)

def _as_env(flags: dict[str, Any]) -> dict[str, str]:
    """The command line's settings as KVCS_RELAY_* variables, for the worker processes (who
    get the same environment and configuration file, and their own few flags)."""
    env = {}
    for key in KEYS:
        raw = flags.get(key.name)
        if raw is None or raw == ():
            continue
        env[key.env] = ",".join(raw) if key.multiple else ("true" if raw is True else str(raw))
    return env


if __name__ == "__main__":  # pragma: no cover
    main()
