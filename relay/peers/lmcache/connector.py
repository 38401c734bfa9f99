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

LMCache runs every method below on its own event loop (a thread of its own) and treats a
connector error as a miss only in some paths, so nothing here raises into LMCache: a lookup
or a get that fails for any reason (unreachable relay, refusal, a bad Object) is a miss,
bounded by ``timeout``, and after a failed connect the relay is not dialled again for
``RETRY_S``, so an engine whose relay is down recomputes at once instead of waiting on every
chunk. Exists and batched contains ask TRACK_STATUS of every key's data track at once on the
connector's one session: one round trip for the whole prefix. A put is one publication
(``publish_plan``, on a connection of its own), which the relay commits to LMDB once the
track ends.
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
import time
from collections.abc import Sequence
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
from relay.peers.connect import connect
from relay.peers.publisher import PublishOptions, publish_plan
from relay.session import MoqtSession, ReceivedObject, RequestRejected
from relay.transport.backend import set_default_backend

from .chunks import ChunkPlan, LayerWriter
from .mapping import DATA_TRACK, ChunkNames, EngineShape, KeyMapper
from .settings import SCHEME, KvcsSettings, parse_settings

log = logging.getLogger("kvcs.lmcache")
PLUGIN_TYPE = "kvcs"
RETRY_S = 1.0  # after a failed connect, misses without dialling for this long


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
        self._session: MoqtSession | None = None
        self._dialling = asyncio.Lock()
        self._down_until = 0.0
        self._puts: set[asyncio.Task[Any]] = set()

    # -- names and the session -------------------------------------------------------------------

    def names(self, key: CacheEngineKey) -> ChunkNames:
        return self.mapper.names(key.model_name, key.world_size, key.worker_id,
                                 TORCH_DTYPE_TO_STR_DTYPE[key.dtype], key.chunk_hash, key.tags)

    async def _connected(self) -> MoqtSession | None:
        """The connector's session, dialled on first use and after a loss; None while the
        relay is unreachable (a miss, not an error)."""
        async with self._dialling:
            s = self._session
            if s is not None and not s.closed:
                return s
            if time.monotonic() < self._down_until:
                return None
            self._session = None
            try:
                self._session = await connect(self.settings.relay_url, self.settings.access)
            except Exception as e:
                log.warning("KVCS relay unreachable, LMCache recomputes: %s", reason_of(e))
            finally:
                # also when the caller's bound cancelled the dialling
                if self._session is None:
                    self._down_until = time.monotonic() + RETRY_S
            return self._session

    async def _bounded(self, aw: Any, what: str) -> Any:
        try:
            return await asyncio.wait_for(aw, self.settings.timeout)
        except RequestRejected as e:  # the relay answered: the session is fine
            log.debug("KVCS %s: a miss (%s)", what, e)
        except Exception as e:
            # no answer in time, or the session broke (e.g. the relay restarted): the next
            # call dials again instead of waiting on a session that may be dead
            self._drop(f"{what}: {e or type(e).__name__}")
        return None

    def _drop(self, reason: str) -> None:
        log.info("KVCS session dropped, a miss (%s)", reason)
        s, self._session = self._session, None
        if s is not None:
            with contextlib.suppress(Exception):
                s.close()

    # -- lookups -------------------------------------------------------------------------------

    async def _complete(self, keys: Sequence[CacheEngineKey]) -> list[bool]:
        """Whether each key's data track has ended at the relay (every layer held): one
        TRACK_STATUS per key, all in flight at once."""
        session = await self._connected()
        if session is None or not keys:
            return [False] * len(keys)
        end = Location(self.layers, 0)  # End of Track after the last layer's Group

        async def one(key: CacheEngineKey) -> bool:
            ns = self.names(key).namespace
            ok = await session.track_status(ns.fields, DATA_TRACK.encode())
            return bool(ok.params.largest_object == end)

        got = await asyncio.gather(*(one(k) for k in keys), return_exceptions=True)
        broken = [r for r in got if isinstance(r, Exception)
                  and not isinstance(r, RequestRejected)]
        if broken:
            self._drop(f"lookup: {broken[0] or type(broken[0]).__name__}")
        return [r is True for r in got]

    async def exists(self, key: CacheEngineKey) -> bool:
        found = await self._bounded(self._complete([key]), "exists")
        return bool(found and found[0])

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self._sync(self.exists(key), False)

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey],
                                     pin: bool = False) -> int:
        return _prefix(await self._bounded(self._complete(keys), "contains"))

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        return _prefix(self._sync(self._bounded(self._complete(keys), "contains"), None))

    def _sync(self, coro: Any, failed: Any) -> Any:
        """Run ``coro`` on LMCache's loop from another thread, bounded."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(self.settings.timeout + 1.0)
        except Exception:
            future.cancel()
            return failed

    # -- get -------------------------------------------------------------------------------------

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return await self._bounded(self._get(key), "get")

    async def _get(self, key: CacheEngineKey) -> MemoryObj | None:
        session = await self._connected()
        if session is None:
            return None
        names = self.names(key)
        resp = await session.fetch(names.namespace.fields, DATA_TRACK.encode(), Params(
            location_filter=LocationFilter.absolute_group_end(0, 0, self.layers - 1),
            group_order=GroupOrder.ASCENDING))
        obj: MemoryObj | None = None
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
            if obj is None or not writer.complete:
                raise LookupError("the relay holds part of the chunk only")
            done, obj = obj, None
            return done
        finally:
            if obj is not None:
                obj.ref_count_down()

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return list(await asyncio.gather(*(self.get(k) for k in keys)))

    # -- put -------------------------------------------------------------------------------------

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        """Publish a full chunk once; a partial chunk (LMCache's ``save_unfull_chunk``) is
        not stored: KVCS publishes full blocks only, and the tail is recomputed anyway."""
        task = asyncio.current_task()
        if task is not None:
            self._puts.add(task)
        try:
            if memory_obj.get_size() != self.full_chunk_size_bytes \
                    or time.monotonic() < self._down_until:
                return  # a partial chunk, or the relay is unreachable: dropped, not queued
            if await self.exists(key):
                return  # the same chunk, already published (its names are deterministic)
            if self._session is None:
                return  # the lookup could not reach the relay: no second wait to publish
            names = self.names(key)
            plan = ChunkPlan(_bytes_of(memory_obj, self.full_chunk_size_bytes), names,
                             self.settings.scope_key)
            await publish_plan(plan, self.settings.access, PublishOptions(
                confirm=self.settings.confirm, confirm_timeout=self.settings.timeout))
        except Exception as e:
            log.warning("KVCS put of chunk %x failed: %s", key.chunk_hash, reason_of(e))
        finally:
            self._puts.discard(task)  # type: ignore[arg-type]

    async def drain(self) -> None:
        """Wait for the puts in flight to end (close does, so a shutdown loses none)."""
        pending = [t for t in self._puts if t is not asyncio.current_task()]
        if pending:
            await asyncio.wait(pending)

    # -- the rest ----------------------------------------------------------------------------------

    async def list(self) -> list[str]:
        """Always empty: the relay knows anchor keys, one-way HMACs of the chunk hashes."""
        return []

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.drain(), self.settings.timeout)
        s, self._session = self._session, None
        if s is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.aclose(), self.settings.timeout)

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
