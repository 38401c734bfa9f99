"""MOQT codec throughput: encode and decode of subgroup and fetch streams of 32 KiB Objects.

Decode is measured with several receive-chunk sizes: 1200 B (one QUIC packet per
StreamDataReceived, the worst case: every payload spans ~28 chunks and is joined once),
16 KiB, 64 KiB and the whole stream in one chunk. Streams are ~1 MB and decoded ROUNDS times,
so the data is cache-hot as it is when aioquic has just decrypted it (a cold 65 MB stream
measures this machine's memory bandwidth instead). Baseline (same run): copying the same
stream bytes once (``bytes.join``). The target is >= 100k Objects/s for encode + decode (20x a
session's object rate).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from benchmarks._report import report
from relay.moqt import (
    FetchStreamEncoder,
    FetchStreamParser,
    GroupOrder,
    SubgroupHeader,
    SubgroupStreamEncoder,
    SubgroupStreamParser,
)

OBJECT_SIZE = 32 * 1024
OBJECTS_PER_STREAM = 32
ROUNDS = 60
OBJECTS = OBJECTS_PER_STREAM * ROUNDS  # per measurement
OBJECTS_PER_GROUP = 8
TARGET = 100_000


def _best(fn: Callable[[], object], repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _encode_subgroup(payload: bytes) -> list[bytes | memoryview]:
    enc = SubgroupStreamEncoder(SubgroupHeader(1, 3, 0, 12, first_object=True))
    out: list[bytes | memoryview] = [enc.header_bytes()]
    for oid in range(OBJECTS_PER_STREAM):
        out.append(enc.object_header(oid, len(payload)))
        out.append(payload)  # written as-is by the session: no copy
    return out


def _encode_fetch(payload: bytes) -> list[bytes | memoryview]:
    enc = FetchStreamEncoder(4, GroupOrder.ASCENDING)
    out: list[bytes | memoryview] = [enc.header_bytes()]
    for i in range(OBJECTS_PER_STREAM):
        g, o = divmod(i, OBJECTS_PER_GROUP)
        out.append(enc.object_header(g, 0, o, g % 256, len(payload)))
        out.append(payload)
    return out


def _chunks(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


def _decode(make: Callable[[], SubgroupStreamParser | FetchStreamParser],
            chunks: list[bytes]) -> int:
    n = 0
    for _ in range(ROUNDS):
        parser = make()
        feed = parser.feed
        for c in chunks:
            n += len(feed(c))
        parser.end_of_stream()
    return n - ROUNDS  # minus the stream headers


def _rounds(fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        for _ in range(ROUNDS):
            fn()
    return run


def main() -> None:
    payload = bytes(range(256)) * (OBJECT_SIZE // 256)
    rows: list[list[object]] = []
    results: dict[str, float] = {}
    for name, encode, make in (
        ("subgroup", _encode_subgroup, SubgroupStreamParser),
        ("fetch", _encode_fetch, lambda: FetchStreamParser(GroupOrder.ASCENDING)),
    ):
        parts = encode(payload)
        stream = b"".join(parts)
        mb = len(stream) * ROUNDS / 1e6
        t_copy = _best(_rounds(lambda parts=parts: b"".join(parts)))
        rows.append([name, "baseline: copy stream once", "-", OBJECTS / t_copy, mb / t_copy, 1.0])
        t_enc = _best(_rounds(lambda encode=encode: encode(payload)))
        rows.append([name, "encode (framing, payload by ref)", "-", OBJECTS / t_enc, mb / t_enc,
                     t_copy / t_enc])
        results[f"{name}_encode"] = OBJECTS / t_enc
        for size in (len(stream), 65536, 16384, 1200):
            chunks = _chunks(stream, size)
            assert _decode(make, chunks) == OBJECTS  # type: ignore[arg-type]
            t_dec = _best(lambda chunks=chunks, make=make: _decode(make, chunks))  # type: ignore[misc]
            label = "whole" if size == len(stream) else f"{size} B"
            rows.append([name, "decode", label, OBJECTS / t_dec, mb / t_dec, t_copy / t_dec])
            both = OBJECTS / (t_enc + t_dec)
            rows.append([name, "encode+decode", label, both, mb / (t_enc + t_dec),
                         t_copy / (t_enc + t_dec)])
            results[f"{name}_encode_decode_{label.replace(' ', '')}"] = both
    worst = min(v for k, v in results.items() if "encode_decode" in k)
    report(
        "codec",
        ["stream", "operation", "chunks", "objects/s", "MB/s", "vs copy"],
        rows,
        {
            "object_size": OBJECT_SIZE,
            "objects_per_stream": OBJECTS_PER_STREAM,
            "rounds": ROUNDS,
            "target_objects_per_s": TARGET,
            "worst_encode_decode_objects_per_s": worst,
            "meets_target": worst >= TARGET,
            "results": results,
        },
    )
    print(f"worst encode+decode: {worst:,.0f} objects/s (target {TARGET:,}): "
          f"{'OK' if worst >= TARGET else 'BELOW TARGET'}")


if __name__ == "__main__":
    main()
