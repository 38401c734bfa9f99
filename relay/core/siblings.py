"""Sibling links: the workers of one relay (``kvcs relay --workers N``, docs/workers.md), and
the peer relays of one tier (``--peer URL``, docs/relay.md, "A root of several replicas").

A relay keeps one client session to every sibling, with a SUBSCRIBE_NAMESPACE on the empty
prefix: the relay-tree machinery, pointed sideways. A sibling answers that subscription with
its *own* namespaces only (its publishers', its lower relays', its cache's), and serves
requests arriving on a sibling's session from its own sources only (``Reach.NO_SIBLINGS``),
so a Track crosses from the sibling that has it to one that wants it once, over one hop, and
never loops.

Workers find each other through the ready files in the run directory the supervisor made
(``worker-<i>.json``: index, pid, sibling port) and are served on a loopback listener of their
own; a link that fails is dialled again on the next scan, so a restarted worker is picked up.
Peers are fixed URLs, served on the relay's own listener: a session says it is a sibling's in
SETUP (MOQT_IMPLEMENTATION ``kvcs-relay/0.1 sibling <instance>``), and a link that fails is
dialled again with a backoff. The instance is random per relay process: a relay whose own
URL is in its peer list (a chart renders one list for every replica) recognises the session
as its own, closes it with ``SELF_LINK``, and the dialling side never dials that URL again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from relay.logs import reason_of
from relay.moqt.messages import Setup
from relay.session import (
    LinkError,
    MoqtSession,
    QuicSettings,
    RequestRejected,
    SessionConfig,
    open_session,
)
from relay.session.errors import SessionClosed, SessionFailure

from .upstream import BACKOFF_FIRST, BACKOFF_MAX  # a failed peer link is dialled as one up

log = logging.getLogger("kvcs.relay")

SCAN_INTERVAL = 0.25  # seconds between two looks at the run directory
# MOQT_IMPLEMENTATION of a sibling's session, followed by the dialling relay's instance
SIBLING_IMPLEMENTATION = "kvcs-relay/0.1 sibling"
SELF_LINK = "a sibling link to itself"  # the close reason of a relay's session to itself


def sibling_instance(setup: Setup | None) -> str | None:
    """The instance of the relay that dialled a session as its sibling, or None (not a
    sibling's session)."""
    impl = (setup.moqt_implementation or "") if setup is not None else ""
    head, _, instance = impl.partition(" sibling ")
    return instance if instance and f"{head} sibling" == SIBLING_IMPLEMENTATION else None


def read_worker_files(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The workers' ready files in ``run_dir`` by worker index (unreadable ones skipped:
    a worker writes its file atomically, so only a vanished file can be unreadable)."""
    found: dict[int, dict[str, Any]] = {}
    for path in run_dir.glob("worker-*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            info = json.loads(path.read_text())
            found[int(info["index"])] = info
    return found


class SiblingRouter(Protocol):
    """Where a sibling link is handed once up (``Routing.add_sibling``, through `Relay`)."""

    def add_sibling(self, session: MoqtSession, nsub: Any) -> None: ...


class SiblingLinks:
    """One relay's sessions to its siblings: workers found in a run directory
    (:meth:`watch_workers`), peer relays at fixed URLs (:meth:`keep_peers`), or both."""

    def __init__(self, router: SiblingRouter, *, config: SessionConfig, settings: QuicSettings,
                 connect_timeout: float, ca_file: str | os.PathLike[str] | None = None,
                 insecure: bool = False) -> None:
        self.router = router
        # SETUP says whose sibling session it is (see the module docstring)
        self.config = config
        self.settings = settings
        self.connect_timeout = connect_timeout
        self.ca_file = ca_file
        self.insecure = insecure
        self._links: dict[Any, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.linked: set[str] = set()  # URLs a link is up to now
        self.itself: set[str] = set()  # peer URLs found to be this relay: never dialled again

    async def close(self) -> None:
        tasks = [*self._tasks, *self._links.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- workers -----------------------------------------------------------------------------

    def watch_workers(self, run_dir: Path, index: int) -> None:
        """Link to every other worker whose ready file is in ``run_dir``."""
        self._tasks.append(asyncio.get_running_loop().create_task(self._scan(run_dir, index)))

    async def _scan(self, run_dir: Path, index: int) -> None:
        while True:
            for idx, info in read_worker_files(run_dir).items():
                if idx == index or idx in self._links or "sibling_port" not in info:
                    continue
                url = f"moqt://127.0.0.1:{info['sibling_port']}/"
                task = asyncio.get_running_loop().create_task(self._worker(idx, url))
                self._links[idx] = task
                task.add_done_callback(lambda _t, i=idx: self._links.pop(i, None))
            await asyncio.sleep(SCAN_INTERVAL)

    async def _worker(self, idx: int, url: str) -> None:
        if not await self._link(f"sibling worker {idx}", url):
            await asyncio.sleep(SCAN_INTERVAL)  # before the next scan dials it again

    # -- peers -------------------------------------------------------------------------------

    def keep_peers(self, urls: Sequence[str]) -> None:
        """Keep a link to each peer relay at ``urls`` (each dialled again after it fails,
        with a backoff; none of them delays anything else)."""
        loop = asyncio.get_running_loop()
        for url in dict.fromkeys(urls):
            self._tasks.append(loop.create_task(self._peer(url)))

    async def _peer(self, url: str) -> None:
        backoff = 0.0
        while url not in self.itself:
            if await self._link(f"peer relay {url}", url):
                backoff = 0.0  # it was up: dial again at once, it may be restarting
            else:
                if not backoff and url not in self.itself:  # once per outage
                    log.warning("peer relay %s unreachable: dialling it again, up to %.0f s "
                                "apart", url, BACKOFF_MAX)
                backoff = min(BACKOFF_MAX, backoff * 2 or BACKOFF_FIRST)
            if url not in self.itself:
                await asyncio.sleep(backoff)

    # -- one link ----------------------------------------------------------------------------

    async def _link(self, what: str, url: str) -> bool:
        """Dial ``url``, follow its namespaces until the session ends. False if it could
        not be established (a link to this relay itself is noted in ``itself``)."""
        session = None
        try:
            session = await asyncio.wait_for(open_session(
                url, config=self.config, settings=self.settings, ca_file=self.ca_file,
                insecure=self.insecure), self.connect_timeout)
            nsub = await asyncio.wait_for(session.subscribe_namespace(()),
                                          self.connect_timeout)
        except (TimeoutError, SessionFailure, LinkError, OSError) as e:
            if await self._closed_by_itself(session, e):
                self.itself.add(url)
                log.info("%s is this relay: not linked", what)
            else:
                log.debug("no link to %s yet: %s", what, reason_of(e))
            if session is not None and not session.closed:
                await session.aclose()
            return False
        try:
            self.router.add_sibling(session, nsub)
            self.linked.add(url)
            log.info("linked to %s", what)
            code, reason = await session.wait_closed()
            log.info("link to %s closed: code 0x%x %s", what, code, reason)
        finally:
            self.linked.discard(url)
            if not session.closed:
                await session.aclose()
        return True

    async def _closed_by_itself(self, session: MoqtSession | None, e: BaseException) -> bool:
        """The dial failed because the relay it reached is this one (``SELF_LINK``). The
        request that failed may have noticed the close before the session did: a session
        that is going away is waited for (bounded), so its close reason is known."""
        if isinstance(e, SessionClosed) and e.reason == SELF_LINK:
            return True
        if session is None or isinstance(e, (RequestRejected, TimeoutError)):
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(session.wait_closed(), self.connect_timeout)
        info = session.close_info
        return info is not None and info[1] == SELF_LINK
