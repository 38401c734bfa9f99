"""Links to upstream relays (``--upstream URL``, tried in order, §14.4 relay trees).

A link keeps one client session to the first reachable upstream relay and re-dials on
demand after it dies. Namespaces, subscriptions and fetches the relay cannot serve locally
go through it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence

from relay.session import MoqtSession, SessionConfig, SessionHandler, open_session
from relay.session.errors import SessionFailure
from relay.transport import QuicSettings, TransportError

log = logging.getLogger("kvcs.relay")


class UpstreamLink:
    def __init__(self, urls: Sequence[str], *, config: SessionConfig,
                 settings: QuicSettings | None = None, handler: SessionHandler | None = None,
                 ca_file: str | os.PathLike[str] | None = None, insecure: bool = False) -> None:
        self.urls = list(urls)
        self.config = config
        self.settings = settings
        self.handler = handler
        self.ca_file = ca_file
        self.insecure = insecure
        self._session: MoqtSession | None = None
        self._lock = asyncio.Lock()
        self.on_connect: list[object] = []

    @property
    def configured(self) -> bool:
        return bool(self.urls)

    @property
    def session(self) -> MoqtSession | None:
        """The session new requests go to: not a closed one, nor one whose peer sent GOAWAY
        (§4.3: start no new requests there; the next ``get`` dials again)."""
        s = self._session
        return s if s is not None and not s.closed and s.goaway_received is None else None

    async def get(self) -> MoqtSession | None:
        """The live upstream session, dialling the URLs in order if needed (None: none up)."""
        if not self.urls:
            return None
        async with self._lock:
            if self.session is not None:
                return self._session
            for url in self.urls:
                try:
                    self._session = await open_session(
                        url, config=self.config, handler=self.handler,
                        settings=self.settings, ca_file=self.ca_file, insecure=self.insecure)
                    log.info("connected to upstream relay %s", url)
                    return self._session
                except (TransportError, SessionFailure, OSError) as e:
                    log.warning("upstream relay %s unreachable: %s", url, e)
            return None

    async def close(self) -> None:
        s = self._session
        if s is not None:
            await s.aclose(0, "relay shutting down")
