"""`kvcs relay` closing a relay loop does not start: one error line, exit 2, no traceback
(docs/relay.md, "Cycles"; the in-process cases are in tests/core/test_relay_loops.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
from cli_harness import free_udp_port, run_kvcs
from relay_helpers import TIMEOUT, relay_at


async def test_kvcs_relay_whose_upstream_leads_back_to_it_does_not_start(
        tmp_path: Path) -> None:
    port = free_udp_port()
    # A's upstream is the relay about to start, which is not up yet: A's dial finds nobody
    a = await relay_at(tmp_path / "a", upstream=[f"moqt://127.0.0.1:{port}/"],
                       upstream_idle_timeout=0.5)
    try:
        code, _, err = await run_kvcs(
            "relay", "--listen", f"127.0.0.1:{port}", "--upstream", a.url,
            "--upstream-insecure", "--data-dir", str(tmp_path / "b"),
            "--metrics-listen", "off", timeout=2 * TIMEOUT)
    finally:
        await a.close()
    assert code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: upstream {a.url} leads back to this relay (relay loop: ")
    assert f":{port}/" in last and f":{a.port}/" in last
    assert "relay ready" not in err
