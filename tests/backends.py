"""Which QUIC backends a suite runs on: every test of the parametrized suites runs once per
entry, server (relay) side first, client side second.

qh3 is installed by ``make`` (the ``fast`` extra), so it is never skipped: a missing qh3
fails these suites.
"""

from __future__ import annotations

from collections.abc import Iterator

from relay.transport.backend import default_backend, set_default_backend

SAME = {"aioquic": ("aioquic", "aioquic"), "qh3": ("qh3", "qh3")}
MIXED = {"qh3-server": ("qh3", "aioquic"), "qh3-client": ("aioquic", "qh3")}
ALL = {**SAME, **MIXED}


def credit_follows_reads(role: str = "server") -> bool:
    """True if ``role``'s backend returns receive credit only as the application reads
    (aioquic); qh3 instead stops a stream that overflows its window."""
    return default_backend(role) == "aioquic"


def use_backends(server: str, client: str) -> Iterator[None]:
    """Make ``server``/``client`` the process defaults for the duration of a test."""
    saved = default_backend("server"), default_backend("client")
    set_default_backend(server=server, client=client)
    try:
        yield
    finally:
        set_default_backend(server=saved[0], client=saved[1])
