"""Links between the workers of one relay (``kvcs relay --workers N``, docs/workers.md).

Each worker serves a second, loopback-only listener for its siblings and keeps one client
session to every sibling's, with a SUBSCRIBE_NAMESPACE on the empty prefix: the relay-tree
machinery, pointed sideways. A sibling answers that subscription with its *own* namespaces
only (its publishers' and its cache's), and serves requests arriving on that listener from its
own sources only (``RelayHandler(sibling=True)``), so a Track crosses from the worker that has
it to a worker that wants it once, over one hop, and never loops.

Workers find each other through the ready files in the run directory the supervisor made
(``worker-<i>.json``: index, pid, sibling port); a link that fails is dialled again on the
next scan, so a restarted worker is picked up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from relay.moqt.token import Token
from relay.session import LinkError, QuicSettings, SessionConfig, open_session
from relay.session.errors import SessionFailure

from .relay import Relay

log = logging.getLogger("kvcs.relay")

SCAN_INTERVAL = 0.25  # seconds between two looks at the run directory
LINK_CONNECT_TIMEOUT = 2.0  # a sibling's listener is on loopback: it answers at once


def read_worker_files(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The workers' ready files in ``run_dir`` by worker index (unreadable ones skipped:
    a worker writes its file atomically, so only a vanished file can be unreadable)."""
    found: dict[int, dict[str, Any]] = {}
    for path in run_dir.glob("worker-*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            info = json.loads(path.read_text())
            found[int(info["index"])] = info
    return found


class SiblingLinks:
    """One worker's sessions to its siblings' loopback listeners."""

    def __init__(self, relay: Relay, run_dir: Path, index: int, *, ca_file: str | Path,
                 secret: str | None, settings: QuicSettings) -> None:
        self.relay = relay
        self.run_dir = run_dir
        self.index = index
        self.ca_file = ca_file
        self.settings = settings
        tokens = (Token.use_value(secret.encode()),) if secret else ()
        self.config = SessionConfig(authorization_tokens=tokens)
        self._links: dict[int, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._scan())

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._links.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _scan(self) -> None:
        while True:
            for idx, info in read_worker_files(self.run_dir).items():
                if idx == self.index or idx in self._links or "sibling_port" not in info:
                    continue
                url = f"moqt://127.0.0.1:{info['sibling_port']}/"
                task = asyncio.get_running_loop().create_task(self._link(idx, url))
                self._links[idx] = task
                task.add_done_callback(lambda _t, i=idx: self._links.pop(i, None))
            await asyncio.sleep(SCAN_INTERVAL)

    async def _link(self, idx: int, url: str) -> None:
        session = None
        try:
            session = await asyncio.wait_for(open_session(
                url, config=self.config, settings=self.settings,
                ca_file=os.fspath(self.ca_file)), LINK_CONNECT_TIMEOUT)
            nsub = await asyncio.wait_for(session.subscribe_namespace(()),
                                          LINK_CONNECT_TIMEOUT)
            self.relay.routing.add_sibling(session, nsub)
            log.info("linked to sibling worker %d (%s)", idx, url)
            await session.wait_closed()
            log.info("link to sibling worker %d closed", idx)
        except (TimeoutError, SessionFailure, LinkError, OSError) as e:
            log.debug("no link to sibling worker %d yet: %s", idx, e)
            await asyncio.sleep(SCAN_INTERVAL)  # before the next scan dials it again
        finally:
            if session is not None and not session.closed:
                await session.aclose()
