"""``kvcs admin state|purge``: a thin client of the relay's admin API (relay/admin.py).

It prints the relay's JSON answer on stdout. Failures are one line on stderr: exit 1 for an
unreachable relay or an error answer, 2 for bad usage (click's code, also an unreadable token
file), 3 when the relay refused the token (401) or has no admin API (404)."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from relay.session.tokens import read_token_file

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
TIMEOUT = 10.0


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _token(path: Path) -> str:
    try:
        return read_token_file(path).decode()
    except ValueError as e:
        _fail(f"token file: {e}", EXIT_USAGE)
    return ""  # unreachable: _fail exits


def call(base: str, token: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One admin request; returns the decoded JSON answer or exits with one line."""
    if not base.startswith(("http://", "https://")):
        _fail(f"--relay-admin {base!r}: expected http://HOST:PORT", EXIT_USAGE)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base.rstrip("/") + path, data=data,
                                 method="POST" if data is not None else "GET")
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        why = e.read().decode(errors="replace").strip().splitlines()
        line = why[0] if why else e.reason
        if e.code == 401:
            _fail(f"{base}: the relay refused the token (401)", EXIT_REFUSED)
        if e.code == 404:
            _fail(f"{base}: no admin API there (404: is an admin token configured?)",
                  EXIT_REFUSED)
        _fail(f"{base}: {e.code} {line}", EXIT_ERROR)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        _fail(f"{base}: {reason}", EXIT_ERROR)
    except ValueError:
        _fail(f"{base}: the answer is not JSON", EXIT_ERROR)
    return None  # unreachable: _fail exits


def _options(fn: Any) -> Any:
    fn = click.option("--token-file", required=True,
                      type=click.Path(dir_okay=False, path_type=Path),
                      help="File holding the admin token (the relay's admin_token_file).")(fn)
    return click.option("--relay-admin", required=True, metavar="URL",
                        help="The relay's metrics listener, e.g. http://127.0.0.1:9464")(fn)


@click.group("admin")
def admin() -> None:
    """Look into a relay and purge publications (its admin API). Exit codes: 0 ok, 1 error,
    2 usage, 3 token refused or admin API off."""


@admin.command("state")
@_options
def state(relay_admin: str, token_file: Path) -> None:
    """Print sessions, scopes, namespaces and Tracks (JSON)."""
    doc = call(relay_admin, _token(token_file), "/admin/state")
    click.echo(json.dumps(doc, indent=2))


@admin.command("purge")
@_options
@click.option("--prefix", required=True, metavar="NS",
              help="Namespace prefix as kvcs admin state prints it, e.g. kvcs-1/hex:<scope>.")
def purge(relay_admin: str, token_file: Path, prefix: str) -> None:
    """Remove every Track under a namespace prefix from memory and LMDB; print what went."""
    doc = call(relay_admin, _token(token_file), "/admin/purge", {"prefix": prefix})
    click.echo(json.dumps(doc, indent=2))
    click.echo(f"purged {len(doc.get('removed', []))} tracks", err=True)


__all__ = ["admin", "call"]
