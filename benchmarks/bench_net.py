"""Real networks: time to the last usable layer of a KV cache over a path with round trip and
loss, ours on each QUIC backend against moq-rs's own server in the same harness and run.

The harness is tests/net's (network namespaces, veth, a seeded UDP impairment forwarder on the
hub; needs root): a relay host (our `kvcs relay`, or moq-rs's server) with the publisher
beside it, and a consumer host dialling the forwarder in front of the relay. Per scenario (one
way delay = RTT / 2 and random loss, both directions):

* **ours**: a completed publication (`kvcs publish --synthetic LAYERS,8,128,TOKENS,float16,1`)
  fetched with `kvcs fetch`; the figure is its report's ``all_layers_ms`` (from the start of
  the retrieval: connecting and discovery included) when it exits 0 (every layer verified
  bit for bit by the CLI and compared with the published file here), else the deadline
  passed (``> N s``, with the layers that were usable).
* **moq-rs**: the same bytes (``layers`` groups of 32 KiB frames) from moq-rs's publisher
  through its server to its subscriber (benchmarks/_moqrs_net.py: from the first frame
  written, once the subscription is live, to the last received; every frame checked).

The forwarder's settings and counters are written with each row. Options (after ``net``):
``--size-mib 64 --rtt-ms 0,20,40,80 --loss-pct 0,0.1,1 --deadline-s 90 --stacks
qh3,aioquic,moq-rs,raw-qh3,raw-aioquic --seed 1`` (``raw-*``: QUIC alone, the same bytes
on one stream through ``relay.transport``, benchmarks/_raw_net.py; ``raw-aiopquic``:
picoquic alone, and ``raw-BACKEND[:CC][@SIZE]`` variants, see there; ``aioquic/qh3``: our
relay on aioquic, `kvcs fetch` on qh3: a stack of ours is RELAY or RELAY/CONSUMER;
a stack of ours alone, ``aioquic``, runs `kvcs fetch` on that backend too);
``--relay-arg=--flag`` / ``--peer-arg=--flag`` (repeatable) pass flags to our relay / to
`kvcs fetch`, and ``--label`` names such a row (e.g. a congestion controller option), so a
variant can be measured next to the defaults in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._moqrs_net import moqrs_in_lab
from benchmarks._raw_net import raw_in_lab
from benchmarks._report import report
from relay.transport.backend import BACKENDS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "net"))
from impair import Impairment
from netlab import Lab, sweep_stale, unavailable
from test_net_scenarios import publish, same_cache

LAYERS = 8
HEADS, DIM = 8, 128
ONLY_BY_NAME = True  # needs root and takes about half an hour: not part of `make bench`


def _options(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks net")
    p.add_argument("--size-mib", type=int, default=64)
    p.add_argument("--rtt-ms", default="0,20,40,80")
    p.add_argument("--loss-pct", default="0,0.1,1")
    p.add_argument("--deadline-s", type=float, default=90.0)
    p.add_argument("--stacks", default="qh3,aioquic,moq-rs,raw-qh3,raw-aioquic")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--relay-arg", action="append", default=[])
    p.add_argument("--peer-arg", action="append", default=[])
    p.add_argument("--label", default="")
    return p.parse_known_args(argv)[0]


def _ends(stack: str) -> tuple[str, str]:
    """A stack of ours is RELAY or RELAY/CONSUMER (``aioquic/qh3``: the relay, with the
    publisher beside it, on aioquic; `kvcs fetch` on qh3): each end's backend governs what
    that end sends, and a fetch's bytes are the relay's to send."""
    relay, _, consumer = stack.partition("/")
    return relay, consumer or relay


def _synthetic(size_mib: int) -> str:
    # K and V of LAYERS layers, HEADS x DIM float16 per token: 4 KiB per token and layer
    tokens = size_mib * (1 << 20) // (LAYERS * 2 * HEADS * DIM * 2)
    return f"{LAYERS},{HEADS},{DIM},{tokens},float16,1"


async def _ours(lab: Lab, relay_host: Any, consumer: Any, url: str, imp: Impairment,
                backend: str, opts: argparse.Namespace, n: int) -> dict[str, Any]:
    via = await lab.forwarder(url, imp)
    tmp = lab.workdir
    published, out = tmp / "published.safetensors", tmp / f"fetched{n}.safetensors"
    code, _out, err = await lab.kvcs(
        consumer, "fetch", "--relay", via, "--ca", str(lab.certs()[0]), "--descriptor",
        str(published), "--tokens", str(published), "--scope-key", str(tmp / "scope.key"),
        "--out", str(out), "--report", str(out.with_suffix(".json")), "--deadline-ms",
        str(int(opts.deadline_s * 1000)), *opts.peer_arg, timeout=opts.deadline_s + 60,
        backend=backend)
    (stats,) = await lab.forwarder_stats()
    rep = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(
        ".json").exists() else {}
    usable = sum(1 for la in rep.get("layers", []) if la.get("usable_ms") is not None)
    result: dict[str, Any] = {"exit": code, "forwarder": stats, "usable_layers": usable,
                              "error": err.strip()[-300:] if code else ""}
    if code == 0:
        if not same_cache(published, out):
            raise RuntimeError(f"{backend}: the fetched cache differs from the published")
        result["seconds"] = rep["all_layers_ms"] / 1e3
        result["mbps"] = rep["bytes"] / result["seconds"] / 1e6
        # after start-up (handshake, discovery, slow start): the layers after the first,
        # from the first usable to the last
        first = rep["first_layer_ms"] / 1e3
        result["first_layer_s"] = first
        # from the layers' FETCHes on (connecting, discovery and the manifest left out): the
        # part that compares with moq-rs's figure, which starts once its subscription is live
        asked = [d["t_ms"] for d in rep["decisions"] if d["action"] == "fetch-layers"]
        if asked:
            result["from_fetch_s"] = result["seconds"] - asked[0] / 1e3
        if result["seconds"] > first:
            result["mbps_after_first_layer"] = \
                rep["bytes"] * (LAYERS - 1) / LAYERS / (result["seconds"] - first) / 1e6
    out.unlink(missing_ok=True)
    return result


def _cell(r: dict[str, Any] | None, deadline: float) -> str:
    if r is None:
        return "-"
    if "seconds" in r:
        return f"{r['seconds']:.2f} s" if r["seconds"] < 10 else f"{r['seconds']:.1f} s"
    if "failed" in r:
        return "failed"
    if "usable_layers" in r:
        return f"> {deadline:g} s ({r['usable_layers']}/{LAYERS} layers)"
    return f"> {deadline:g} s ({r.get('bytes', 0) / 2**20:.0f} MiB)"


async def _run(opts: argparse.Namespace) -> None:
    stacks = opts.stacks.split(",")
    scenarios = [(float(r), float(lo)) for r in opts.rtt_ms.split(",")
                 for lo in opts.loss_pct.split(",")]
    nbytes = opts.size_mib << 20
    results: dict[tuple[float, float], dict[str, Any]] = {s: {} for s in scenarios}
    with tempfile.TemporaryDirectory(prefix="kvcs-bench-net-") as d:
        lab = Lab(Path(d))
        try:
            relay_host, consumer = lab.add_host("relay"), lab.add_host("consumer")
            for n, stack in enumerate(stacks):
                urls: str | None = None
                relay_be, consumer_be = _ends(stack)
                if relay_be in BACKENDS:
                    urls = await lab.relay(relay_host, *opts.relay_arg, backend=relay_be,
                                           port=4433 + n)
                    await publish(lab, relay_host, urls, relay_be, _synthetic(opts.size_mib))
                for i, (rtt, loss) in enumerate(scenarios):
                    imp = Impairment(delay_ms=rtt / 2, loss=loss / 100, seed=opts.seed + i)
                    try:
                        if stack == "moq-rs":
                            r = await moqrs_in_lab(lab, relay_host, consumer, imp, nbytes,
                                                   LAYERS)
                        elif urls is None:  # raw-qh3, raw-aioquic: QUIC alone
                            r = await raw_in_lab(lab, relay_host, consumer, imp, nbytes,
                                                 stack.removeprefix("raw-"), opts.deadline_s)
                        else:
                            r = await _ours(lab, relay_host, consumer, urls, imp,
                                            consumer_be, opts, n * 100 + i)
                    except Exception as e:  # one failed cell must not lose the others
                        await lab.forwarder_stats()
                        r = {"failed": f"{type(e).__name__}: {e}"[:300]}
                    r["settings"] = imp.describe()
                    results[(rtt, loss)][stack] = r
                    print(f"  {stack:11} {imp.describe():22} {_cell(r, opts.deadline_s)}",
                          flush=True)
        finally:
            await lab.close()
    label = f" {opts.label}" if opts.label else ""
    ours = [s for s in stacks if _ends(s)[0] in BACKENDS]
    columns = ["RTT ms", "loss %", *(s + label if s in ours else s for s in stacks)]
    if "moq-rs" in stacks:
        columns += [f"{s} : moq-rs" for s in ours]
    rows = []
    for (rtt, loss), by in results.items():
        row: list[Any] = [f"{rtt:g}", f"{loss:g}",
                          *(_cell(by.get(s), opts.deadline_s) for s in stacks)]
        ref = by.get("moq-rs", {}).get("seconds")
        for s in ours:
            if "moq-rs" in stacks:
                mine = by.get(s, {}).get("seconds")
                row.append(f"{mine / ref:.1f}x" if mine and ref else "-")
        rows.append(row)
    name = "net" + (f"-{opts.label}" if opts.label else "")  # a variant keeps its own file
    report(name, columns, rows, extra={
        "size_bytes": nbytes, "layers": LAYERS, "deadline_s": opts.deadline_s,
        "relay_args": opts.relay_arg, "peer_args": opts.peer_arg, "label": opts.label,
        "results": [{"rtt_ms": k[0], "loss_pct": k[1], **v} for k, v in results.items()]})


def main() -> None:
    why = unavailable()
    if why is not None:
        print(f"net: skipped: {why}")
        return
    sweep_stale()  # a run stopped by a signal leaves its lab behind: gone before this one
    asyncio.run(_run(_options(sys.argv[1:])))


if __name__ == "__main__":
    main()
