"""PUBLISH_NAMESPACE and SUBSCRIBE_NAMESPACE, both sides (§7.12, §7.13):
``PublishedNamespace`` / ``IncomingPublishNamespace`` and ``NamespaceSubscription`` /
``IncomingSubscribeNamespace``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from relay.moqt.codes import MessageType, SessionErrorCode, StreamResetCode
from relay.moqt.messages import (
    Message,
    Namespace,
    NamespaceDone,
    PublishNamespace,
    RequestOk,
    RequestUpdate,
    SubscribeNamespace,
)
from relay.moqt.params import Params
from relay.moqt.primitives import TrackNamespace, namespace_suffix
from relay.transport import StreamReset, TransportError

from .errors import SessionClosed
from .event_queue import EventQueue, EventSource
from .events import NamespaceEvent
from .request_stream import RequestStream
from .requests import IncomingRequest, request_ok

if TYPE_CHECKING:
    from .base import SessionBase


# -- PUBLISH_NAMESPACE ------------------------------------------------------------------------


class PublishedNamespace:
    """A PUBLISH_NAMESPACE we sent and the peer accepted; withdraw by cancelling (§7.12)."""

    def __init__(self, session: SessionBase, rs: RequestStream, namespace: TrackNamespace
                 ) -> None:
        self.session = session
        self.rs = rs
        self.namespace = namespace
        self.withdrawn = asyncio.Event()

    async def _watch(self) -> None:
        try:
            while await self.rs.recv() is not None:
                pass  # GOAWAY: the state checked it; nothing else may come (§5.2)
        except StreamReset:
            pass
        self.withdrawn.set()

    def withdraw(self) -> None:
        self.rs.cancel(StreamResetCode.CANCELLED)
        self.withdrawn.set()


async def start_publish_namespace(session: SessionBase, namespace: TrackNamespace,
                                  params: Params) -> PublishedNamespace:
    rs, _, _ = await request_ok(session, lambda rid: PublishNamespace(rid, namespace, params))
    handle = PublishedNamespace(session, rs, namespace)
    session.spawn(handle._watch(), "publish-namespace")
    return handle


class IncomingPublishNamespace(IncomingRequest):
    TYPE = MessageType.PUBLISH_NAMESPACE
    msg: PublishNamespace

    def __init__(self, session: SessionBase, rs: RequestStream, msg: PublishNamespace) -> None:
        super().__init__(session, rs, msg)
        self.withdrawn = asyncio.Event()

    @property
    def namespace(self) -> TrackNamespace:
        return self.msg.track_namespace

    async def accept(self) -> None:
        """REQUEST_OK; ``withdrawn`` is set when the request stream ends in either direction
        (FIN, RESET_STREAM or STOP_SENDING, §18 rule 4) or the session closes."""
        self._answer()
        await self.rs.send(RequestOk(Params()))
        self.session.spawn(self._watch(), "published-namespace")

    async def _watch(self) -> None:
        try:
            while (msg := await self.rs.recv()) is not None:
                if isinstance(msg, RequestUpdate):
                    await self.rs.send(RequestOk(Params()))
        except (StreamReset, TransportError):
            pass
        finally:
            self.withdrawn.set()

    def withdraw(self) -> None:
        """Withdraw from our side (cancel the stream)."""
        self.rs.cancel(StreamResetCode.CANCELLED)
        self.withdrawn.set()


# -- SUBSCRIBE_NAMESPACE ----------------------------------------------------------------------


class NamespaceSubscription(EventSource[NamespaceEvent]):
    """A SUBSCRIBE_NAMESPACE we sent: iterate for ``NamespaceEvent``s (§7.13)."""

    def __init__(self, session: SessionBase, rs: RequestStream, prefix: TrackNamespace) -> None:
        self.session = session
        self.rs = rs
        self.prefix = prefix
        self.active: set[TrackNamespace] = set()
        self._events = EventQueue(1 << 16)

    async def _loop(self) -> None:
        try:
            await self._read()
        finally:
            # however the reading ended (the session closed and cancelled this task, the
            # connection failed): the iterator ends, never waits forever (no-op after END)
            code, reason = self.session.close_info or (SessionErrorCode.INTERNAL_ERROR, "")
            self._events.put_nowait_end(SessionClosed(code, reason))

    def _event(self, msg: Message) -> NamespaceEvent | None:
        if isinstance(msg, Namespace):
            ns = self.prefix + msg.suffix
            self.active.add(ns)
            return NamespaceEvent(msg.suffix, ns, True)
        if isinstance(msg, NamespaceDone):  # announced before: the state checked
            ns = self.prefix + msg.suffix
            self.active.discard(ns)
            return NamespaceEvent(msg.suffix, ns, False)
        return None

    def queued(self) -> int:
        """Events received and not yet taken."""
        return len(self._events)

    def _absorb(self, msgs: list[Message]) -> None:
        """What arrived with REQUEST_OK is queued before the caller gets the subscription:
        the namespaces the responder knew when it answered (§7.13) are there at once."""
        for msg in msgs:
            ev = self._event(msg)
            if ev is not None:
                self._events.put_nowait(ev)

    async def _read(self) -> None:
        try:
            while True:
                msg = await self.rs.recv()
                if msg is None:
                    break
                ev = self._event(msg)
                if ev is not None:
                    await self._events.put(ev)
        except StreamReset:
            pass
        # §7.13: a reset or FIN of the response direction means every namespace is done.
        for ns in sorted(self.active):
            await self._events.put(NamespaceEvent(ns[len(self.prefix):], ns, False))
        self.active.clear()
        self._events.put_nowait_end()

    def session_closed(self, code: int, reason: str) -> None:
        self._events.put_nowait_end(SessionClosed(code, reason))

    def cancel(self) -> None:
        self.rs.cancel(StreamResetCode.CANCELLED)
        self._events.put_nowait_end(discard=True)


async def start_subscribe_namespace(session: SessionBase, prefix: TrackNamespace,
                                    params: Params) -> NamespaceSubscription:
    rs, _, _ = await request_ok(session, lambda rid: SubscribeNamespace(rid, prefix, params))
    handle = NamespaceSubscription(session, rs, prefix)
    handle._absorb(rs.take_received())
    session.spawn(handle._loop(), "subscribe-namespace")
    return handle


class IncomingSubscribeNamespace(IncomingRequest):
    TYPE = MessageType.SUBSCRIBE_NAMESPACE
    msg: SubscribeNamespace

    def __init__(self, session: SessionBase, rs: RequestStream, msg: SubscribeNamespace
                 ) -> None:
        super().__init__(session, rs, msg)
        self.cancelled = asyncio.Event()
        self._announced: set[TrackNamespace] = set()

    @property
    def prefix(self) -> TrackNamespace:
        return self.msg.track_namespace

    async def accept(self) -> None:
        """REQUEST_OK; then call :meth:`announce` / :meth:`withdraw` (§7.13)."""
        self._answer()
        await self.rs.send(RequestOk(Params()))
        self.session.spawn(self._watch(), "namespace-subscription")

    async def announce(self, namespace: TrackNamespace) -> None:
        """NAMESPACE for a full ``namespace`` under the prefix (sent once per namespace)."""
        if namespace in self._announced or self.cancelled.is_set():
            return
        self._announced.add(namespace)
        await self._send(Namespace(namespace_suffix(namespace, self.prefix)))

    async def withdraw(self, namespace: TrackNamespace) -> None:
        """NAMESPACE_DONE for a namespace announced before."""
        if namespace not in self._announced or self.cancelled.is_set():
            return
        self._announced.discard(namespace)
        await self._send(NamespaceDone(namespace_suffix(namespace, self.prefix)))

    async def _send(self, msg: Namespace | NamespaceDone) -> None:
        try:
            await self.rs.send(msg)
        except TransportError:
            self.cancelled.set()

    async def _watch(self) -> None:
        # requester FIN: it sends no more updates; keep announcing
        try:
            while (msg := await self.rs.recv()) is not None:
                if isinstance(msg, RequestUpdate):
                    await self.rs.send(RequestOk(Params()))
        except (StreamReset, TransportError):
            self.cancelled.set()
