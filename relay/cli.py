"""The `kvcs` command line. Subcommands are added by the relay, publisher and subscriber."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="kvcs-relay")
def main() -> None:
    """kvcs-relay: a caching MOQT relay for LLM KV caches, and its reference peers."""


if __name__ == "__main__":  # pragma: no cover
    main()
