"""Prefill with an engine and publish each layer as soon as it is computed (the layer
pipelining KVCS exists for).

The engine runs in a worker thread, pass by pass (one pass per segment, plus a last pass for
the trailing partial block, which is computed but not published), and its per-layer hook
writes each layer's K/V into preallocated arrays. ``StreamingPlan`` is a PublicationPlan
over those arrays whose payloads wait until their (segment, layer) is computed, so
publish_plan, unchanged, sends layer g while the engine computes layer g+1. The publisher's
on_layer hook waits (asynchronously) for the layer after next, so the event loop keeps
sending while the engine computes; the plan's own wait (blocking) is only a fallback.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from relay.kvcs.descriptor import Descriptor
from relay.kvcs.plan import PublicationPlan, TrackSpec

from ..connect import RelayAccess
from ..publisher import PublishOptions, PublishSummary, publish_plan
from .base import Engine, check_descriptor

LAYER_WAIT = 300.0  # seconds a payload may wait for its layer before the publication fails


class LayerFeed:
    """Readiness of each (segment, layer), set by the compute thread in production order."""

    def __init__(self, segments: int, layers: int) -> None:
        self.segments, self.layers = segments, layers
        self._ready = [threading.Event() for _ in range(segments * layers)]
        self.error: BaseException | None = None
        self.computed_at: dict[tuple[int, int], float] = {}

    def index(self, segment: int, layer: int) -> int:
        return segment * self.layers + layer

    def put(self, segment: int, layer: int) -> None:
        self.computed_at[(segment, layer)] = time.monotonic()
        self._ready[self.index(segment, layer)].set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        for e in self._ready:
            e.set()

    def wait(self, segment: int, layer: int, timeout: float = LAYER_WAIT) -> None:
        if not self._ready[self.index(segment, layer)].wait(timeout):
            raise TimeoutError(f"layer {layer} of segment {segment} not computed in {timeout} s")
        if self.error is not None:
            raise RuntimeError(f"prefill failed: {self.error}") from self.error

    async def wait_async(self, index: int, timeout: float = LAYER_WAIT) -> None:
        if index < len(self._ready) and not self._ready[index].is_set():
            await asyncio.to_thread(self._ready[index].wait, timeout)


class StreamingPlan(PublicationPlan):
    """A PublicationPlan whose K/V arrays are filled while it is being published."""

    def __init__(self, k: np.ndarray, v: np.ndarray, descriptor: Descriptor, scope_key: bytes,
                 tokens: Sequence[int] | np.ndarray, feed: LayerFeed, **kw: Any) -> None:
        super().__init__(k, v, descriptor, scope_key, tokens, **kw)
        self.feed = feed
        self._segment_of = {s.first_block + i: s.segment
                            for s in self.segments for i in range(s.blocks)}

    def _payload(self, spec: TrackSpec, layer: int, first_block: int, obj: int) -> bytes:
        self.feed.wait(self._segment_of[first_block], layer)
        return super()._payload(spec, layer, first_block, obj)


@dataclass
class PrefillResult:
    summary: PublishSummary
    plan: StreamingPlan
    cache: Any  # the engine's, of the whole prompt, including the unpublished partial block
    logits: np.ndarray  # of the prompt's last token
    computed_at: dict[tuple[int, int], float] = field(default_factory=dict)
    published_at: dict[tuple[int, int], float] = field(default_factory=dict)

    def __repr__(self) -> str:
        # Short on purpose, like Retrieval's: asyncio.run() formats its finished main task,
        # result (the engine's whole cache) included, as it puts SIGINT's handler back.
        return (f"PrefillResult(objects={self.summary.objects}, bytes={self.summary.bytes}, "
                f"layers={self.summary.layers})")


def segment_blocks(full_blocks: int, chunk_blocks: int | None) -> list[int]:
    if not chunk_blocks:
        return [full_blocks]
    sizes = [chunk_blocks] * (full_blocks // chunk_blocks)
    if full_blocks % chunk_blocks:
        sizes.append(full_blocks % chunk_blocks)
    return sizes


class _Stopped(Exception):
    """The publication ended: the engine's pass is abandoned at its next layer."""


def _compute(engine: Engine, tokens: np.ndarray, k: np.ndarray, v: np.ndarray,
             passes: list[tuple[int, int]], feed: LayerFeed, cache: Any,
             after_layer: Callable[[int, int], None] | None) -> np.ndarray:
    published = k.shape[2]
    logits = np.empty(0, dtype=np.float32)
    try:
        for p, (a, b) in enumerate(passes):
            end = min(b, published)

            def on_layer(layer: int, kn: np.ndarray, vn: np.ndarray,
                         p: int = p, a: int = a, end: int = end) -> None:
                if feed.error is not None:
                    raise _Stopped
                if a < end:
                    k[layer, :, a:end] = kn[:, :end - a]
                    v[layer, :, a:end] = vn[:, :end - a]
                    feed.put(p, layer)
                if after_layer is not None:
                    after_layer(p, layer)

            logits = engine.run([int(t) for t in tokens[a:b]], cache, on_layer)
    except _Stopped:
        return logits  # the publication is over: nothing more to compute for it
    except BaseException as e:
        feed.fail(e)
        raise
    return logits


async def prefill_and_publish(engine: Engine, descriptor: Descriptor, scope_key: bytes,
                              tokens: Sequence[int], access: RelayAccess, *,
                              chunk_blocks: int | None = None,
                              options: PublishOptions | None = None,
                              after_layer: Callable[[int, int], None] | None = None,
                              **plan_kw: Any) -> PrefillResult:
    """Prefill ``tokens`` (in passes of ``chunk_blocks`` blocks, one segment each; None = one
    pass) and publish every full block's K/V layer by layer while later layers compute.

    ``after_layer(pass, layer)`` runs in the compute thread after each layer (tests use it
    to observe or gate the computation)."""
    d = descriptor
    check_descriptor(engine, d)
    toks = np.asarray(tokens, dtype=np.int64)
    B = d.block_tokens
    full = len(toks) // B
    if full < 1:
        raise ValueError(f"the prompt is shorter than one block ({B} tokens)")
    sizes = segment_blocks(full, chunk_blocks)
    passes: list[tuple[int, int]] = []
    first = 0
    for n in sizes:
        passes.append((first * B, (first + n) * B))
        first += n
    if len(toks) > full * B:
        if chunk_blocks:
            passes.append((full * B, len(toks)))
        else:
            passes[-1] = (0, len(toks))  # one pass: the partial block rides along
    shape = (engine.layers, engine.kv_heads, full * B, engine.head_dim)
    k, v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    feed = LayerFeed(len(sizes), engine.layers)
    plan = StreamingPlan(k, v, d, scope_key, [int(t) for t in toks], feed,
                         segment_blocks=sizes, **plan_kw)
    opts = options or PublishOptions()
    published_at: dict[tuple[int, int], float] = {}
    user_hook = opts.on_layer

    async def on_layer(segment: int, layer: int) -> None:
        published_at[(segment, layer)] = time.monotonic()
        if user_hook is not None:
            result = user_hook(segment, layer)
            if result is not None:
                await result
        # The plan already holds the next layer; wait for the one after it here, where the
        # event loop stays free to send, rather than in the plan, where it would block.
        await feed.wait_async(feed.index(segment, layer) + 2)

    cache = engine.new_cache()
    compute = asyncio.ensure_future(asyncio.to_thread(
        _compute, engine, toks, k, v, passes, feed, cache, after_layer))
    try:
        summary = await publish_plan(plan, access, replace(opts, on_layer=on_layer))
        logits = await compute
    finally:
        if not compute.done():
            feed.fail(RuntimeError("publication ended"))
            # The thread cannot be interrupted; it stops at its next layer's hook or pass.
    return PrefillResult(summary, plan, cache, logits, dict(feed.computed_at), published_at)
