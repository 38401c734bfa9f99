"""The data plane, received (§11): subgroup streams and datagrams reach a subscription by
Track Alias, fetch and fill fetch streams their request by Request ID (``DataRoute``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from relay.moqt.codes import ObjectStatus, PropertyType, StreamResetCode
from relay.moqt.dataplane.datagram import decode_datagram
from relay.moqt.dataplane.fetch import FetchStreamParser
from relay.moqt.dataplane.objects import EndOfRange, FetchObject, SubgroupHeader
from relay.moqt.dataplane.subgroup import SubgroupStreamParser
from relay.moqt.errors import protocol_violation
from relay.moqt.kvp import Properties
from relay.transport import RecvStream, StreamReset

from .events import RangeMarker, ReceivedObject, Source, StreamEnded, StreamInfo

if TYPE_CHECKING:
    from .base import SessionBase

_DATAGRAM = StreamInfo(-1, Source.DATAGRAM)


async def read_subgroup_stream(session: SessionBase, recv: RecvStream,
                               parser: SubgroupStreamParser, items: list[Any]) -> None:
    """A subgroup stream (§11.2): routed by its Track Alias to a subscription."""
    while parser.header is None:
        chunk = await _read_or_none(recv)
        if chunk is None:
            return
        items += parser.feed(chunk, not chunk)
        if not chunk and parser.header is None:
            raise protocol_violation("subgroup stream ended inside its header")
    header: SubgroupHeader = parser.header
    sub = await session.route_for_alias(header.track_alias)
    if sub is None or sub.ended:
        recv.stop_sending(StreamResetCode.CANCELLED)
        return
    info = StreamInfo(recv.stream_id, Source.SUBGROUP, header)
    sub.stream_opened()
    last: int | None = None
    prio = header.publisher_priority
    if prio is None:
        prio = _default_priority(sub.track_properties)
    try:
        while True:
            for item in items:
                if isinstance(item, SubgroupHeader):
                    continue
                last = item.object_id
                subgroup = parser.subgroup_id if parser.subgroup_id is not None else 0
                await sub.deliver(ReceivedObject(
                    header.group_id, subgroup, item.object_id, prio, item.status,
                    item.properties, item.payload, info))
            chunks = await recv.read_chunks()  # as received: the parser decides what to join
            if not chunks:
                parser.end_of_stream()
                await sub.deliver(StreamEnded(info, True, None, last))
                return
            items = parser.feed_chunks(chunks)
    except StreamReset as e:
        await sub.deliver(StreamEnded(info, False, e.code, last))
    finally:
        sub.stream_closed()


def _default_priority(props: Properties) -> int:
    for p in props:
        if p.type == PropertyType.DEFAULT_PUBLISHER_PRIORITY and isinstance(p.value, int):
            return p.value
    return 128


async def _read_or_none(recv: RecvStream) -> bytes | None:
    try:
        return await recv.read()
    except StreamReset:
        return None


async def read_fetch_stream(session: SessionBase, recv: RecvStream, parser: FetchStreamParser,
                            items: list[Any]) -> None:
    """A fetch or fill fetch stream (§11.6): routed by the Request ID in its header."""
    while parser.header is None:
        chunk = await _read_or_none(recv)
        if chunk is None:
            return  # reset before the header (§18 rule 3)
        items += parser.feed(chunk, not chunk)
        if not chunk and parser.header is None:
            raise protocol_violation("fetch stream ended inside its header")
    rid = parser.header.request_id
    route = await session.route_for_request(rid)
    if route is None or route.ended:
        recv.stop_sending(StreamResetCode.CANCELLED)
        return
    route.stream_opened()
    info: StreamInfo | None = None
    fin = False
    reset: int | None = None
    try:
        started = await route.fetch_stream_started(parser)
        if started is None:
            recv.stop_sending(StreamResetCode.CANCELLED)
            return
        source, released = started
        info = StreamInfo(recv.stream_id, source)
        items += released
        while True:
            for item in items:
                if isinstance(item, FetchObject):
                    await route.deliver(ReceivedObject(
                        item.group_id, item.subgroup_id or 0, item.object_id,
                        item.publisher_priority, ObjectStatus.NORMAL, item.properties,
                        item.payload, info))
                elif isinstance(item, EndOfRange):
                    await route.deliver(RangeMarker(item.type, item.location, info))
            chunks = await recv.read_chunks()
            if not chunks:
                items = parser.end_of_stream()
                if items:
                    continue
                fin = True
                return
            items = parser.feed_chunks(chunks)
    except StreamReset as e:
        reset = e.code
    finally:
        route.stream_closed()
        if info is not None and (fin or reset is not None):
            await route.fetch_stream_ended(info, fin, reset)


async def read_datagrams(session: SessionBase) -> None:
    """OBJECT_DATAGRAMs (§11.8): routed by Track Alias; unknown aliases are dropped."""
    while True:
        data = await session.conn.receive_datagram()
        d = decode_datagram(data)
        if d is None:
            continue  # padding
        sub = session.alias_route(d.track_alias)
        if sub is None or sub.ended:
            continue
        prio = d.publisher_priority if d.publisher_priority is not None else 128
        await sub.deliver(ReceivedObject(
            d.group_id, 0, d.object_id, prio, d.status or ObjectStatus.NORMAL,
            d.properties, d.payload, _DATAGRAM))
