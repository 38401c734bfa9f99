"""Log set-up for the relay process: text (default) or JSON lines, and secret scrubbing.

The relay logs one line per session open/close and per error, with the spec code. It never
logs payloads; as a second line of defence, the configured authorization tokens are replaced
by ``***`` in any record that would contain one (a token passed through an error message, for
instance).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

_STD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class _Scrub(logging.Filter):
    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            msg = record.getMessage()
            if any(s in msg for s in self.secrets):
                for s in self.secrets:
                    msg = msg.replace(s, "***")
                record.msg, record.args = msg, None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, any ``extra=`` fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _STD and not k.startswith("_"):
                out[k] = v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def reason_of(e: BaseException) -> str:
    """What a log line says of why ``e`` happened: its message, or for an exception raised
    without one (``asyncio.wait_for``'s TimeoutError, a bare OSError) what it means, never
    an empty reason. (``e or "..."`` never falls back: an exception object is always true.)"""
    text = str(e)
    if text:
        return text
    return "no answer in time" if isinstance(e, TimeoutError) else type(e).__name__


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup(level: str = "INFO", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Configure the root logger for the process (stderr)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(_Scrub(secrets))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aioquic logs every connection event at INFO and qh3 every peer close at WARNING (both
    # as "quic"); sessions ending is the relay's to report, so keep its own lines readable.
    logging.getLogger("quic").setLevel(max(logging.ERROR, root.level))


__all__ = ["JsonFormatter", "reason_of", "setup"]
