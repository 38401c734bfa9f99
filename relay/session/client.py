"""Dial a MOQT session from a relay URL (``moqt://host:port/path`` or ``https://…``)."""

from __future__ import annotations

import dataclasses
import os
from urllib.parse import urlsplit

from relay.transport import QuicSettings, connect

from .config import SessionConfig
from .handler import SessionHandler
from .session import MoqtSession
from .wire import MOQT


async def open_session(url: str, *, config: SessionConfig | None = None,
                       handler: SessionHandler | None = None,
                       settings: QuicSettings | None = None,
                       ca_file: str | os.PathLike[str] | None = None,
                       insecure: bool = False) -> MoqtSession:
    """Connect and complete SETUP. Native QUIC sends PATH and AUTHORITY from the URL
    (§1.1); WebTransport carries them in the CONNECT request instead."""
    config = config or SessionConfig()
    parts = urlsplit(url)
    if parts.scheme == "moqt":
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        config = dataclasses.replace(config, path=path, authority=parts.netloc)
    conn = await connect(url, application=MOQT, settings=settings, ca_file=ca_file,
                         insecure=insecure)
    try:
        return await MoqtSession.start(conn, config, handler)
    except BaseException:
        conn.close(0, "")
        raise
