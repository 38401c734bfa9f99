"""Progress of a long publish on a terminal: layers done, MB and MB/s on one rewritten line
of stderr. Silent when stderr is not a terminal (logs, pipes, CI) or with --quiet."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, what: str, total_layers: int, total_bytes: int, *, quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.what = what
        self.total = max(total_layers, 1)
        self.total_bytes = total_bytes
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and self.stream.isatty()
        self.done = 0
        self._start = time.monotonic()

    def layer(self, segment: int, layer: int) -> None:
        """The publisher's on_layer hook: one more layer handed to QUIC."""
        self.done += 1
        if not self.enabled:
            return
        mb = self.total_bytes * self.done / self.total / 1e6
        rate = mb / max(time.monotonic() - self._start, 1e-6)
        self.stream.write(f"\r{self.what}: layer {self.done}/{self.total} (segment {segment}) "
                          f"{mb:.1f} MB, {rate:.1f} MB/s ")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            self.stream.write("\n")  # the summary line starts on its own line
            self.stream.flush()


__all__ = ["Progress"]
