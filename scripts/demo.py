"""`make demo`: a relay, a synthetic KV cache published through it, fetched back, verified.

Runs everything in one process on 127.0.0.1 with the session API directly (the reference
publisher/subscriber in relay/peers/ is the richer path; this demo only needs MOQT):

1. start a relay (in a temporary data directory, with its metrics listener),
2. publish a synthetic KV cache (real KVCS Objects from PublicationPlan) with PUBLISH,
3. wait until the relay committed every Track to LMDB,
4. FETCH every Track from a second session and compare it bit for bit,
5. when the model extra is installed, `kvcs prefill` SmolLM2-135M on a short prompt (each
   layer published as it is computed) and `kvcs fetch` it back with discovery,
6. print a summary and a few of the relay's own metrics, then stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from relay.kvcs.plan import PlannedObject, PublicationPlan
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens
from relay.moqt.codes import ObjectStatus
from relay.moqt.primitives import FullTrackName, Location
from relay.service import RelayConfig, RunningRelay, start_relay
from relay.session import MoqtSession, open_session

TIMEOUT = 30.0
LAYERS, KV_HEADS, HEAD_DIM, TOKENS = 16, 4, 64, 512


async def publish(session: MoqtSession, plan: PublicationPlan) -> dict[str, dict]:  # type: ignore[type-arg]
    """Push every Track of ``plan``; returns what was sent per Track."""
    ns = plan.namespace.fields
    tracks: dict[str, dict[int, list[PlannedObject]]] = defaultdict(lambda: defaultdict(list))
    for obj in plan:
        tracks[obj.track][obj.group].append(obj)
    await asyncio.wait_for(session.publish_namespace(ns), TIMEOUT)
    sent: dict[str, dict[Location, bytes]] = {}
    for name, groups in tracks.items():
        served = await asyncio.wait_for(session.publish(ns, name.encode()), TIMEOUT)
        sent[name] = {}
        for g, objs in sorted(groups.items()):
            w = await served.open_subgroup(g, 0, objs[0].priority)
            for o in objs:
                await w.write_object(o.object_id, o.payload)
                sent[name][Location(g, o.object_id)] = o.payload
            await w.write_status(objs[-1].object_id + 1, ObjectStatus.END_OF_GROUP, fin=True)
        last = max(groups)
        w = await served.open_subgroup(last + 1, 0, 128)
        await w.write_status(0, ObjectStatus.END_OF_TRACK, fin=True)
        await served.done()
    return sent


async def fetch_all(session: MoqtSession, ns: tuple[bytes, ...], names: list[str]
                    ) -> dict[str, dict[Location, bytes]]:
    got: dict[str, dict[Location, bytes]] = {}
    for name in names:
        resp = await asyncio.wait_for(session.fetch(ns, name.encode()), TIMEOUT)
        async with asyncio.timeout(TIMEOUT):
            got[name] = {e.location: bytes(e.payload) for e in await resp.collect()}
    return got


async def scrape(running: RunningRelay) -> list[str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", running.metrics_port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), TIMEOUT)
    writer.close()
    wanted = ("kvcs_relay_objects_received_total", "kvcs_relay_lmdb_committed_tracks_total",
              'kvcs_relay_cache_hits_total{op="fetch"', "kvcs_relay_sent_bytes_total")
    return [ln for ln in data.decode().splitlines() if ln.startswith(wanted)]


async def _kvcs(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode or 0, out.decode(), err.decode()


def _last_line(*texts: str) -> str:
    for text in texts:
        lines = [x for x in text.strip().splitlines() if x.strip()]
        if lines:
            return lines[-1]
    return ""


async def real_model(running: RunningRelay, tmp: Path) -> bool:
    """When the model extra is installed: SmolLM2-135M prefills a prompt and publishes each
    layer as it is computed (`kvcs prefill`); `kvcs fetch` then discovers and fetches it."""
    try:
        from relay.model.smollm2 import gguf_path

        gguf_path()
    except Exception:  # the model extra or its weights are not installed: skip this part
        print("model     (SmolLM2 not installed: `make install` brings it)")
        return True
    key, desc, cache = tmp / "scope.key", tmp / "smollm2.json", tmp / "smollm2.safetensors"
    key.write_bytes(os.urandom(32))
    relay = ["--relay", running.url, "--ca", str(running.certfile), "--scope-key", str(key)]
    t0 = time.perf_counter()
    code, out, err = await _kvcs(
        "prefill", *relay, "--model", "smollm2", "--descriptor-out", str(desc),
        "--out", str(cache), "--text",
        "The KV cache of a prompt is computed once by a prefill node and reused by every "
        "decode node that needs the same prefix: a relay caches it layer by layer.")
    t_prefill = time.perf_counter() - t0
    if code != 0:
        print(f"model     kvcs prefill failed: {err.strip().splitlines()[-1:]}")
        return False
    t0 = time.perf_counter()
    code, out2, err2 = await _kvcs("fetch", *relay, "--descriptor", str(desc),
                                   "--tokens", str(cache), "--out", str(tmp / "got.kv"))
    t_fetch = time.perf_counter() - t0
    if code != 0:
        print(f"model     kvcs fetch failed: {err2.strip().splitlines()[-1:]}")
        return False
    print(f"model     SmolLM2-135M prefill + publish in {t_prefill:.1f} s "
          f"(model load included): {_last_line(err, out)}")
    print(f"          kvcs fetch in {t_fetch:.1f} s: {_last_line(out2, err2)}")
    return True


async def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kvcs-demo-") as tmp:
        running = await start_relay(RelayConfig(
            listen_port=0, data_dir=Path(tmp), memory_bytes=256 << 20, lmdb_bytes=256 << 20,
            metrics_listen=("127.0.0.1", 0)))
        try:
            print(f"relay     {running.url}  metrics http://127.0.0.1:{running.metrics_port}"
                  "/metrics")
            k, v = synthetic_kv(LAYERS, KV_HEADS, HEAD_DIM, TOKENS, "float16", seed=1)
            desc = synthetic_descriptor(LAYERS, KV_HEADS, HEAD_DIM, "float16")
            plan = PublicationPlan(k, v, desc, os.urandom(32), synthetic_tokens(TOKENS))
            ns = plan.namespace.fields

            pub = await asyncio.wait_for(open_session(running.url, ca_file=running.certfile),
                                         TIMEOUT)
            t0 = time.perf_counter()
            sent = await publish(pub, plan)
            for name in sent:
                ok = await running.relay.wait_committed(FullTrackName(ns, name.encode()),
                                                        TIMEOUT)
                assert ok, f"{name} was not committed"
            t_pub = time.perf_counter() - t0
            await pub.aclose()

            sub = await asyncio.wait_for(open_session(running.url, ca_file=running.certfile),
                                         TIMEOUT)
            t0 = time.perf_counter()
            got = await fetch_all(sub, ns, list(sent))
            t_fetch = time.perf_counter() - t0
            await sub.aclose()

            objects = sum(len(t) for t in sent.values())
            nbytes = sum(len(p) for t in sent.values() for p in t.values())
            identical = got == sent
            print(f"published {LAYERS} layers x {KV_HEADS} KV heads x {TOKENS} tokens "
                  f"(float16): {len(sent)} tracks, {objects} objects, {nbytes / 1e6:.1f} MB "
                  f"in {t_pub:.2f} s (committed to LMDB)")
            print(f"fetched   {sum(len(t) for t in got.values())} objects in {t_fetch:.2f} s "
                  f"({nbytes / 1e6 / max(t_fetch, 1e-9):.1f} MB/s): "
                  f"{'bit-identical' if identical else 'MISMATCH'}")
            model_ok = await real_model(running, Path(tmp))
            print("relay metrics:")
            for line in await scrape(running):
                print("  " + line)
            return 0 if identical and model_ok else 1
        finally:
            await running.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)  # the relay's "open relay" warning is expected
    sys.exit(asyncio.run(main()))
