"""What the layers above the session (the relay core) get of the transport, under the session
layer's names, so that they import nothing of relay.transport themselves.

- :class:`SendBacklog`: what the core's send scheduler reads of a stream a writer sends on
  (``SubgroupWriter.stream``, ``FetchWriter.stream``): how much is queued, whether a write
  would have to wait. The core never writes to a stream itself: it writes through the
  session's writers.
- :data:`LinkError`: the failure of the connection or of one stream under a session (the
  peer went, a stream was reset or stopped, a dial failed), raised by the session's
  methods and writers. It is the transport's own error class, let through unchanged: a
  copy made at every session method would cost a frame on each Object written and turn
  any path it missed into an uncaught error; the name is the seam, so the core catches
  ``LinkError`` whatever the transport below calls it.
- :data:`RequestStreams`: a session's request streams in use and granted, each way (what
  the relay reports per link, docs/metrics.md).
- :data:`Connection` (what :meth:`MoqtSession.start` serves) and :data:`QuicSettings` (what
  :func:`open_session` dials with): handed through from the listener and the launcher.
"""

from __future__ import annotations

from typing import Protocol

from relay.transport import Connection, QuicSettings, RequestStreams, TransportError

LinkError = TransportError


class SendBacklog(Protocol):
    """A send stream as the relay's scheduler sees it (relay/core/scheduler.py)."""

    @property
    def unsent(self) -> int:
        """Bytes written to this stream and not yet sent."""
        ...

    @property
    def connection_unsent(self) -> int:
        """Bytes written to all the connection's streams and not yet sent."""
        ...

    @property
    def connection_full(self) -> bool:
        """The connection's send buffer is at its bound: every write waits."""
        ...

    def would_wait(self, n: int) -> bool:
        """A write of ``n`` bytes would wait for room."""
        ...


__all__ = ["Connection", "LinkError", "QuicSettings", "RequestStreams", "SendBacklog"]
