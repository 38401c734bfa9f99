"""Progress of a long publish or fetch on a terminal: layers done, MB and MB/s on one
rewritten line of stderr. Silent when stderr is not a terminal (logs, pipes, CI) or with
--quiet."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

MIN_INTERVAL = 0.1  # s between two redraws (a fetch reports every Object)


class Progress:
    def __init__(self, what: str, total_layers: int = 0, total_bytes: int = 0, *,
                 quiet: bool = False, stream: TextIO | None = None) -> None:
        self.what = what
        self.total = max(total_layers, 1)
        self.total_bytes = total_bytes
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and self.stream.isatty()
        self.done = 0
        self.shown = False
        self._start = time.monotonic()
        self._last = 0.0
        self._state: Any = None  # a retrieval's last state, drawn once more at the end

    def show(self, done: int, total: int, nbytes: int, detail: str = "",
             force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and done < total and now - self._last < MIN_INTERVAL):
            return
        self._last = now
        mb = nbytes / 1e6
        rate = mb / max(now - self._start, 1e-6)
        self.stream.write(f"\r{self.what}: layer {done}/{total}{detail} {mb:.1f} MB, "
                          f"{rate:.1f} MB/s ")
        self.stream.flush()
        self.shown = True

    def layer(self, segment: int, layer: int) -> None:
        """The publisher's on_layer hook: one more layer handed to QUIC."""
        self.done += 1
        self.show(self.done, self.total, self.total_bytes * self.done // self.total,
                  f" (segment {segment})")

    def retrieval(self, state: Any) -> None:
        """The retrieval's progress hook (a RetrievalState after each Object)."""
        self._state = state
        if self.enabled and time.monotonic() - self._last >= MIN_INTERVAL:
            self._draw_retrieval(state)

    def _draw_retrieval(self, state: Any, force: bool = False) -> None:
        self.show(len(state.usable_layers()), state.descriptor.layers,
                  sum(s.bytes for s in state.layers.values()), force=force)

    def close(self) -> None:
        if self.enabled and self._state is not None:
            self._draw_retrieval(self._state, force=True)
        if self.shown:
            self.stream.write("\n")  # the summary line starts on its own line
            self.stream.flush()


__all__ = ["Progress"]
