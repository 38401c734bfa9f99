"""Shared pieces of the engine tests: the engines (each loaded once per test process, which
is the suite's one session: transformers' GGUF load takes about 20 s), prompts, and a
producer -> relay -> consumer round trip."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from model_helpers import SCOPE_KEY, TIMEOUT, access, fetch_back, relay_at

from relay.model.smollm2 import load_tokenizer
from relay.peers.engines import Engine, greedy, load_engine
from relay.peers.engines.generate import Continuation, continue_prompt
from relay.peers.engines.streaming import PrefillResult, prefill_and_publish
from relay.service import RunningRelay

TEXTS = (
    "Media over QUIC is a protocol for delivering live media through relays. A publisher "
    "sends tracks made of groups and objects; subscribers ask relays for the tracks they "
    "want, and relays cache what passes through them.",
    "The same machinery can carry the key and value cache of a language model: each layer "
    "becomes a group, each block of tokens an object, and a consumer that shares a prompt "
    "prefix with the producer can fetch the cache instead of computing it again, which "
    "saves time when the prefix is long.",
)
GENERATE = 8  # tokens of greedy continuation compared


def hf() -> Engine:
    return load_engine("transformers")


def numpy_engine() -> Engine:
    return load_engine("numpy")


def prompt(i: int, n: int) -> list[int]:
    """The first ``n`` token IDs of TEXTS[i] (the numpy engine's tokenizer: fast, and the
    same IDs for both engines; test_engine_cross checks it agrees with transformers')."""
    ids = load_tokenizer().encode(TEXTS[i])
    assert len(ids) >= n, len(ids)
    return ids[:n]


@dataclass
class Produced:
    result: PrefillResult
    tokens: list[int]  # the producer's own greedy continuation
    logits: list[np.ndarray]


async def produce(engine: Engine, r: RunningRelay, toks: list[int], block: int, chunk: int,
                  **kw: Any) -> Produced:
    d = engine.descriptor(block)
    res = await asyncio.wait_for(prefill_and_publish(
        engine, d, SCOPE_KEY, toks, access(r), chunk_blocks=chunk, **kw), 120)
    tokens, logits = greedy(engine, res.cache, res.logits, GENERATE)
    return Produced(res, tokens, logits)


async def consume(engine: Engine, r: RunningRelay, toks: list[int], block: int
                  ) -> Continuation:
    got = await fetch_back(r, engine.descriptor(block), toks)
    assert got.k.shape[2] == len(toks) // block * block
    return continue_prompt(engine, toks, GENERATE, k=got.k, v=got.v)


async def restarted(r: RunningRelay, data: Path) -> RunningRelay:
    """The relay stopped once its LMDB commits are done, and started again on the same
    data: what it serves now comes from LMDB."""
    assert await asyncio.wait_for(r.drain(TIMEOUT), TIMEOUT + 5)
    await r.close()
    return await relay_at(data)
