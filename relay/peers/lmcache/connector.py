"""LMCache's remote-storage plugin for a KVCS relay tree (LMCache 0.5.6).

vLLM / LMCache configuration (docs/engines.md, "LMCache")::

    remote_storage_plugins: ["kvcs"]
    extra_config:
      remote_storage_plugin.kvcs.module_path: relay.peers.lmcache.connector
      remote_storage_plugin.kvcs.class_name: KvcsConnectorAdapter
      kvcs.url: kvcs://relay.example:4433/
      kvcs.ca_file: /etc/kvcs/ca.pem
      kvcs.scope_key_file: /etc/kvcs/scope.key

or ``remote_url: kvcs://HOST:PORT/?ca=...&scope_key=...`` with the same plugin entries.

LMCache calls the async methods below on its own event loop (a thread it owns: its storage
threads hand each coroutine over with ``run_coroutine_threadsafe``), the sync ones
(``exists_sync``, ``batched_contains``) from its other threads, which hand theirs to that loop
too. So everything the connector holds lives on that one loop: its one session (link.py) for
puts, gets and lookups, dialled on first use and again after a loss, and its puts in flight
(puts.py). Nothing here raises into LMCache, which treats a connector error as a miss only in
some paths: a lookup or a get that fails for any reason (unreachable relay, refusal, a bad
Object) is a miss, bounded by ``timeout``. Exists and batched contains ask TRACK_STATUS of
every key's data track at once: one round trip for the whole prefix. A batched get has the
FETCHes of consecutive chunks in flight together, the next one sent while the last layers of
this one arrive, each layer decoded straight from the received Object into the buffer LMCache
allocated (chunks.py). A put returns once its Objects are
queued; its confirmation comes in a batch with the others' (puts.py).
"""

from __future__ import annotations

import os

# Usage reporting to LMCache's servers is off before LMCache is imported (it reads these at
# import), here as in every test and benchmark that loads LMCache.
os.environ["LMCACHE_TRACK_USAGE"] = "false"
os.environ["DO_NOT_TRACK"] = "1"

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
from lmcache.utils import TORCH_DTYPE_TO_STR_DTYPE, CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.connector import (
    ConnectorAdapter,
    ConnectorContext,
    extract_plugin_type,
)
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from relay.logs import reason_of
from relay.moqt.codes import GroupOrder
from relay.moqt.location_filter import LocationFilter
from relay.moqt.params import Params
from relay.moqt.primitives import Location
from relay.session import MoqtSession, ReceivedObject, RequestRejected
from relay.transport.backend import set_default_backend

from .chunks import ChunkPlan, LayerWriter
from .link import RelayLink
from .mapping import DATA_TRACK, ChunkNames, EngineShape, KeyMapper
from .puts import ChunkPuts, ChunkServer
from .settings import SCHEME, KvcsSettings, parse_settings

log = logging.getLogger("kvcs.lmcache")
PLUGIN_TYPE = "kvcs"
# A batched get sends the next chunk's FETCH once all but the last 1/NEXT_FETCH_AT of this
# chunk's layers are in: its round trip overlaps their arrival, and the two chunks share the
# wire only that long (every FETCH at once cost 15-20 % more client CPU here, in more and
# smaller reads of chunks interleaved on the wire, for no more MiB/s)
NEXT_FETCH_AT = 4


class KvcsConnectorAdapter(ConnectorAdapter):
    """Parses ``kvcs://`` URLs and ``plugin://kvcs[.NAME]``."""

    def __init__(self) -> None:
        super().__init__(SCHEME)

    def can_parse(self, url: str) -> bool:
        if url.startswith(SCHEME):
            return True
        return url.startswith("plugin://") and \
            extract_plugin_type(url[len("plugin://"):]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        config = context.config
        extra = getattr(config, "extra_config", None) if config is not None else None
        return KvcsConnector(context, parse_settings(context.url, extra))


class KvcsConnector(RemoteConnector):
    def __init__(self, context: ConnectorContext, settings: KvcsSettings) -> None:
        backend = context.local_cpu_backend
        metadata = context.metadata or backend.metadata
        super().__init__(context.config or backend.config, metadata)
        if settings.quic_backend is not None:
            set_default_backend(client=settings.quic_backend)
        self.settings = settings
        self.loop = context.loop
        self.local_cpu_backend = backend
        layers, _, chunk, kv_heads, head_dim = metadata.kv_shape
        self.mapper = KeyMapper(settings.scope_key,
                                EngineShape(layers, kv_heads, head_dim, chunk))
        self.layers = int(layers)
        server = ChunkServer()
        self.link = RelayLink(settings, server)
        self.puts = ChunkPuts(self.link, server, settings.timeout)
        self._putting: set[asyncio.Task[Any]] = set()  # put calls still before their puts

    @property
    def stats(self) -> dict[str, int]:
        """Sessions opened (one for the connector's life, plus one per loss) and puts."""
        return {**asdict(self.link.stats), **{f"puts_{k}": v
                                              for k, v in asdict(self.puts.stats).items()}}

    def names(self, key: CacheEngineKey) -> ChunkNames:
        return self.mapper.names(key.model_name, key.world_size, key.worker_id,
                                 TORCH_DTYPE_TO_STR_DTYPE[key.dtype], key.chunk_hash, key.tags)

    async def _bounded(self, aw: Awaitable[Any], session: MoqtSession, what: str) -> Any:
        """``aw`` on ``session`` within ``timeout``; a failure is a miss (None), and a failure
        other than the relay's refusal drops the session: the next call dials again instead
        of waiting on a session that may be dead (the relay restarted, or went away)."""
        try:
            return await asyncio.wait_for(aw, self.settings.timeout)
        except (RequestRejected, LookupError) as e:  # the relay answered: the session is fine
            log.debug("KVCS %s: a miss (%s)", what, e)
        except Exception as e:
            self.link.drop(session, f"{what}: {reason_of(e)}")
        return None

    async def _session(self) -> MoqtSession | None:
        try:
            return await asyncio.wait_for(self.link.session(), self.settings.timeout)
        except TimeoutError:
            return None

    # -- lookups -------------------------------------------------------------------------------

    async def _complete(self, keys: Sequence[CacheEngineKey]) -> list[bool]:
        """Whether each key's data track has ended at the relay (every layer held): one
        TRACK_STATUS per key, all in flight at once; all False when the relay is out of
        reach."""
        session = await self._session() if keys else None
        if session is None:
            return [False] * len(keys)
        end = Location(self.layers, 0)  # End of Track after the last layer's Group

        async def one(key: CacheEngineKey) -> bool:
            ns = self.names(key).namespace
            ok = await session.track_status(ns.fields, DATA_TRACK.encode())
            return bool(ok.params.largest_object == end)

        async def every() -> list[Any]:
            return await asyncio.gather(*(one(k) for k in keys), return_exceptions=True)

        got = await self._bounded(every(), session, "lookup")
        if got is None:
            return [False] * len(keys)
        broken = [r for r in got if isinstance(r, Exception)
                  and not isinstance(r, RequestRejected)]
        if broken:
            self.link.drop(session, f"lookup: {broken[0] or type(broken[0]).__name__}")
        return [r is True for r in got]

    async def exists(self, key: CacheEngineKey) -> bool:
        return (await self._complete([key]))[0]

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return bool(self._sync(self.exists(key), False))

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey],
                                     pin: bool = False) -> int:
        return _prefix(await self._complete(keys))

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        return _prefix(self._sync(self._complete(keys), None))

    def _sync(self, coro: Any, failed: Any) -> Any:
        """Run ``coro`` on LMCache's loop from another thread (LMCache's), bounded."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(self.settings.timeout + 1.0)
        except Exception:
            future.cancel()
            return failed

    # -- get -------------------------------------------------------------------------------------

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        session = await self._session()
        if session is None:
            return None
        return await self._bounded(self._get(session, key), session, "get")

    async def _get(self, session: MoqtSession, key: CacheEngineKey, priority: int = 128,
                   near_end: asyncio.Event | None = None) -> MemoryObj | None:
        """One FETCH of the chunk's layers into a buffer LMCache allocates; ``near_end`` is
        set once the last layers are coming (or the FETCH is over)."""
        names = self.names(key)
        try:
            resp = await session.fetch(names.namespace.fields, DATA_TRACK.encode(), Params(
                location_filter=LocationFilter.absolute_group_end(0, 0, self.layers - 1),
                group_order=GroupOrder.ASCENDING, subscriber_priority=priority))
        except BaseException:
            if near_end is not None:
                near_end.set()
            raise
        obj: MemoryObj | None = None
        near = self.layers - max(1, self.layers // NEXT_FETCH_AT)
        try:
            async for ev in resp:
                if not isinstance(ev, ReceivedObject):
                    continue
                if obj is None:
                    obj = self.local_cpu_backend.allocate(self.meta_shapes[0],
                                                          self.meta_dtypes[0], self.meta_fmt)
                    if obj is None:
                        return None  # LMCache's buffer is full: a miss
                    writer = LayerWriter(_bytes_of(obj, self.full_chunk_size_bytes), names)
                writer.write(ev.group, ev.object_id, ev.payload)
                if near_end is not None and len(writer.layers) >= near:
                    near_end.set()
            if obj is None or not writer.complete:
                raise LookupError("the relay holds part of the chunk only")
            done, obj = obj, None
            return done
        finally:
            if near_end is not None:
                near_end.set()
            if obj is not None:  # failed or cut short: the rest of the FETCH is not wanted
                resp.cancel()
                obj.ref_count_down()

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        """The chunks' FETCHes in order, each sent while the last layers of the one before
        are arriving: no round trip falls between chunks, and the chunks barely share the
        wire (Subscriber Priority puts the earlier first where they do). LMCache reuses a
        prefix only, so nothing is fetched past a chunk that missed. Each chunk is bounded
        by ``timeout`` on its own."""
        session = await self._session()
        if session is None or not keys:
            return [None] * len(keys)
        tasks: list[asyncio.Future[MemoryObj | None]] = []
        for i, key in enumerate(keys):
            near = asyncio.Event()
            tasks.append(asyncio.ensure_future(self._bounded(
                self._get(session, key, min(i, 255), near), session, "get")))
            if i + 1 == len(keys):
                break
            waiting = asyncio.ensure_future(near.wait())
            await asyncio.wait({waiting, tasks[-1]}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if tasks[-1].done() and tasks[-1].result() is None:
                break  # a miss: the chunks after it are of no use to LMCache
        got = list(await asyncio.gather(*tasks))
        return got + [None] * (len(keys) - len(got))

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[CacheEngineKey]
                                       ) -> list[MemoryObj]:
        """The held prefix of ``keys`` (LMCache's contract), fetched as ``batched_get``."""
        got = await self.batched_get(keys)
        n = got.index(None) if None in got else len(got)
        for late in got[n:]:
            if late is not None:
                late.ref_count_down()
        return [g for g in got[:n] if g is not None]

    # -- put -------------------------------------------------------------------------------------

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: Sequence[CacheEngineKey], memory_objs: Sequence[MemoryObj]
                          ) -> None:
        """Publish full chunks the relay does not hold yet, in order, each returning once its
        Objects are queued (puts.py confirms them). A partial chunk (LMCache's
        ``save_unfull_chunk``) is not stored: KVCS publishes full blocks only, and the tail is
        recomputed anyway. Nothing is queued while the relay is unreachable."""
        full = [(k, m) for k, m in zip(keys, memory_objs, strict=True)
                if m.get_size() == self.full_chunk_size_bytes]
        if not full or self.link.down:
            return
        task = asyncio.current_task()
        if task is not None:
            self._putting.add(task)  # drain waits for it from here on
        try:
            held = await self._complete([k for k, _ in full])
            session = self.link.current
            if session is None:
                return  # the lookup could not reach the relay: no second wait to publish
            for (key, obj), there in zip(full, held, strict=True):
                if session.closed:
                    return  # lost under an earlier put of this batch: the rest is dropped
                names = self.names(key)
                if there or self.puts.in_flight(names.namespace.pub_id):
                    self.puts.stats.skipped += 1
                    continue  # the same chunk, published already (its names are deterministic)
                plan = ChunkPlan(_bytes_of(obj, self.full_chunk_size_bytes), names,
                                 self.settings.scope_key)
                await self.puts.put(session, plan, obj.ref_count_up, obj.ref_count_down)
        except Exception as e:
            log.warning("KVCS put failed: %s", reason_of(e))
        finally:
            self._putting.discard(task)  # type: ignore[arg-type]

    async def drain(self) -> None:
        """Wait for the puts in flight to be confirmed (close does, so a shutdown loses
        none)."""
        pending = [t for t in self._putting if t is not asyncio.current_task()]
        if pending:
            await asyncio.wait(pending)
        await self.puts.drain()

    # -- the rest ----------------------------------------------------------------------------------

    async def list(self) -> list[str]:
        """Always empty: the relay knows anchor keys, one-way HMACs of the chunk hashes."""
        return []

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.drain(), self.settings.timeout)
        self.puts.abort()
        await self.link.close()

    def __repr__(self) -> str:
        return f"<KvcsConnector {self.settings.relay_url}>"


def _prefix(found: list[bool] | None) -> int:
    """How many keys from the first on are held (LMCache reuses a prefix only)."""
    if not found:
        return 0
    return found.index(False) if False in found else len(found)


def _bytes_of(obj: MemoryObj, size: int) -> np.ndarray:
    """A writable uint8 view of a MemoryObj's first ``size`` bytes (LMCache's own buffer)."""
    return np.frombuffer(obj.byte_array, dtype=np.uint8, count=size)
