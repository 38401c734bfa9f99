"""The `kvcs` command line. Errors are one clear line on stderr and a non-zero exit."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import click


@click.group()
@click.version_option(package_name="kvcs-relay")
def main() -> None:
    """kvcs-relay: a caching MOQT relay for LLM KV caches, and its reference peers."""


def _hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


@main.command()
@click.option("--listen", default="127.0.0.1:4433", show_default=True,
              help="UDP HOST:PORT for raw QUIC (moqt-22) and WebTransport.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data"),
              show_default=True, help="LMDB store and the self-signed certificate live here.")
@click.option("--cert", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--key", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--upstream", multiple=True, help="Upstream relay URL (repeatable, in order).")
@click.option("--upstream-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--upstream-insecure", is_flag=True,
              help="Do not verify the upstream certificate (loopback development only).")
@click.option("--memory-bytes", type=int, default=1 << 30, show_default=True)
@click.option("--lmdb-bytes", type=int, default=8 << 30, show_default=True)
@click.option("--max-datagram-size", type=int, default=1200, show_default=True,
              help="UDP payload size; raise to the path MTU (e.g. 8952) on jumbo-frame paths.")
@click.option("--log-level", default="INFO", show_default=True)
def relay(listen: str, data_dir: Path, cert: Path | None, key: Path | None,
          upstream: tuple[str, ...], upstream_ca: Path | None, upstream_insecure: bool,
          memory_bytes: int, lmdb_bytes: int, max_datagram_size: int, log_level: str) -> None:
    """Run the caching relay."""
    from relay.service import RelayConfig, run_forever

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if (cert is None) != (key is None):
        raise click.UsageError("--cert and --key go together")
    host, port = _hostport(listen)
    config = RelayConfig(listen_host=host, listen_port=port, data_dir=data_dir, cert=cert,
                         key=key, upstream=list(upstream), upstream_ca=upstream_ca,
                         upstream_insecure=upstream_insecure, memory_bytes=memory_bytes,
                         lmdb_bytes=lmdb_bytes, max_datagram_size=max_datagram_size)
    try:
        asyncio.run(run_forever(config))
    except OSError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":  # pragma: no cover
    main()
