"""The engine options of ``kvcs prefill``, ``subscribe`` and ``fetch`` (--engine, --generate,
--threads) and what they do around a command. The engines are imported only when asked for,
so publish/subscribe/fetch without --generate never load PyTorch."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import click
import numpy as np

from relay.kvcs.descriptor import Descriptor

from .errors import PeerError


def engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    from .engines import ENGINES

    opts = [
        click.option("--engine", type=click.Choice(ENGINES), default="numpy",
                     show_default=True,
                     help="Inference engine: numpy (the project's own Llama, no PyTorch) or "
                          "transformers (Hugging Face transformers on PyTorch, CPU)."),
        click.option("--generate", type=click.IntRange(min=0), default=0, show_default=True,
                     metavar="N",
                     help="Continue the prompt for N greedy tokens with the engine and print "
                          "them (stdout); with --report, also the time to first token."),
        click.option("--threads", type=click.IntRange(min=1),
                     help="Engine threads (torch.set_num_threads / BLAS): equal logits "
                          "across processes need equal thread counts."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def require(engine: str) -> None:
    """EngineError (exit 2) at once if ``engine`` cannot be loaded (PyTorch missing)."""
    from .engines import require as require_engine

    require_engine(engine)


def load(engine: str, model: str, threads: int | None) -> tuple[Any, float]:
    """The engine and how long loading it took (ms); one clear error if it cannot load."""
    from relay.model import ModelError

    from .engines import load_engine

    require(engine)
    t0 = time.perf_counter()
    try:
        eng = load_engine(engine, model, threads=threads)
    except ModelError as e:
        raise PeerError(str(e)) from None
    return eng, round((time.perf_counter() - t0) * 1000, 3)


def check(engine: Any, descriptor: Descriptor) -> None:
    from .engines import check_descriptor

    check_descriptor(engine, descriptor)


def producer_continuation(engine: Any, cache: Any, logits: np.ndarray, n: int
                          ) -> dict[str, Any]:
    """The producer's own greedy continuation of its prompt (what a consumer of its cache
    must reproduce)."""
    from .engines import greedy
    from .engines.generate import text_of

    tokens, steps = greedy(engine, cache, logits, n)
    return {"engine": engine.name, "tokens": tokens, "text": text_of(engine, tokens),
            "logits_sha256": digests(steps)}


def digests(steps: Sequence[np.ndarray]) -> list[str]:
    """SHA-256 of each step's float32 logits: two processes compare them bit for bit."""
    return [hashlib.sha256(np.ascontiguousarray(s, dtype=np.float32).tobytes()).hexdigest()
            for s in steps]


def consumer_continuation(engine: Any, prompt: Sequence[int], n: int, *,
                          k: np.ndarray | None, v: np.ndarray | None, fetch_ms: float,
                          timed: bool) -> dict[str, Any]:
    from .engines.generate import continue_prompt

    c = continue_prompt(engine, prompt, n, k=k, v=v, fetch_ms=fetch_ms, local_prefill=timed)
    return {"engine": engine.name, **c.to_json(), "logits_sha256": digests(c.logits)}


def echo(doc: dict[str, Any], model_load_ms: float) -> None:
    """The continuation on stdout; a one-line summary of it on stderr."""
    click.echo(doc["text"])
    line = f"{doc['engine']}: {len(doc['tokens'])} tokens {doc['tokens']}"
    if "ttft_ms" in doc:
        line += (f"; reused {doc['reused_tokens']} tokens, computed {doc['computed_tokens']}; "
                 f"time to first token {doc['ttft_ms']:.0f} ms (fetch {doc['fetch_ms']:.0f}, "
                 f"load {doc['load_ms']:.1f}, first decode step {doc['first_decode_ms']:.0f})")
    if "local_prefill_ms" in doc:
        line += f"; a local full prefill took {doc['local_prefill_ms']:.0f} ms"
    click.echo(line + f"; model loaded in {model_load_ms / 1000:.1f} s", err=True)
