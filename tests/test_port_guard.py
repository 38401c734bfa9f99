"""The guard of tests/port_guard.py: binding a relay's default port, or starting a relay that
would bind one, fails the test at once (nothing is bound, no process started)."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Iterator

import port_guard
import pytest
from port_guard import DEFAULT_PORTS, DefaultPortBound, relay_default_ports

RELAY = [sys.executable, "-m", "relay.cli", "relay", "--data-dir", "unused"]


@pytest.fixture
def expected_violations() -> Iterator[None]:
    """These tests break the rule on purpose: what they did is not held against them."""
    yield
    port_guard.violations.clear()


def test_the_default_ports_are_the_relays() -> None:
    assert sorted(DEFAULT_PORTS) == [4433, 9464]  # QUIC; metrics and admin (relay/options.py)


@pytest.mark.parametrize("port", sorted(DEFAULT_PORTS))
def test_binding_a_default_port_fails(port: int, expected_violations: None) -> None:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as s, pytest.raises(DefaultPortBound):
            s.bind(("127.0.0.1", port))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))  # the kernel's choice is the way


def test_a_relay_command_line_is_read_as_the_relay_reads_it() -> None:
    assert relay_default_ports(RELAY, {}) == {4433, 9464}
    assert relay_default_ports([*RELAY, "--listen", "127.0.0.1:0"], {}) == {9464}
    assert relay_default_ports(
        [*RELAY, "--listen", "127.0.0.1:0"],
        {"KVCS_RELAY_METRICS_LISTEN": "off"}) == set()
    assert relay_default_ports(
        [*RELAY, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"], {}) == set()
    assert relay_default_ports([*RELAY, "--print-config"], {}) == set()  # binds nothing
    assert relay_default_ports([*RELAY, "--drain-timeout", "-1"], {}) == set()  # refused
    # a network namespace of its own (tests/net) holds no port of this machine's
    assert relay_default_ports(["ip", "netns", "exec", "h1", *RELAY], {}) == set()
    assert relay_default_ports([sys.executable, "-m", "relay.cli", "fetch"], {}) == set()


async def test_starting_a_relay_on_a_default_port_fails(expected_violations: None) -> None:
    with pytest.raises(DefaultPortBound, match="9464"):
        await asyncio.wait_for(asyncio.create_subprocess_exec(
            *RELAY, "--listen", "127.0.0.1:0", stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL), 10)
