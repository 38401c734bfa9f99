"""Interop with aiomoqt 0.13.3 (an independent draft-22 implementation in Python on picoquic,
installed by `make install`'s interop extra; docs/interop.md):

* its interop test client (the moq-interop-runner's 12 cases, TAP output) against our relay,
  raw QUIC and WebTransport, on each backend;
* a picoquic client joining a qh3 relay while another client sends (the Retry, docs/transport.md);
* its publisher and subscriber benches through a tree of our relays (edge -> origin -> edge);
* our publisher against its relay (``moq_interop_relay``): what that relay does not do ends
  the publish within its bound, with a line that says what the relay answered.

Every aiomoqt program runs as a subprocess (python -m aiomoqt.tools...) against relays on
127.0.0.1; their certificates are self-signed, so the tools run with verification off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import interop_sys_path  # noqa: F401  (before relay_helpers: puts tests/core on sys.path)
import pytest
from processes import free_udp_port, ready_process
from relay_helpers import TIMEOUT, client, relay_at, wait_namespace
from udp_forwarder import ServerInitials, forwarding

from relay.kvcs.plan import PublicationPlan
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens
from relay.peers.connect import RelayAccess
from relay.peers.errors import Unconfirmed
from relay.peers.publisher import PublishOptions, publish_plan
from relay.peers.subscriber import RetrieveOptions, retrieve
from relay.service import RunningRelay
from relay.transport.tls import ensure_self_signed

pytest.importorskip("aiomoqt", reason="aiomoqt is not installed: `make install` (its interop "
                    "extra, scripts/install_interop.sh) installs it")

PY = sys.executable
CASES = ("setup-only", "announce-only", "publish-namespace-done", "subscribe-error",
         "rendezvous-timeout", "announce-subscribe", "subscribe-before-announce",
         "data-subgroup-basic", "subscribe-namespace-lifecycle", "namespace-discovery",
         "publish-track-only", "publish-track-subscribe")
_RESULT = re.compile(r"^(ok|not ok) \d+ - (\S+)")


def tap(stdout: str) -> dict[str, str]:
    """Each case of a TAP report: "ok", or "not ok: <its message>"."""
    results: dict[str, str] = {}
    last = None
    for line in stdout.splitlines():
        if m := _RESULT.match(line):
            last = m.group(2)
            results[last] = m.group(1)
        elif last and results[last] == "not ok" and line.strip().startswith("message:"):
            results[last] = "not ok: " + line.split(":", 1)[1].strip().strip('"')
    return results


async def run_tool(module: str, *args: str, timeout: float) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``python -m aiomoqt.tools.MODULE ARGS``."""
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", f"aiomoqt.tools.{module}", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def base(url: str) -> str:
    return url.rstrip("/")


@contextlib.contextmanager
def relay_errors(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """The ERROR (and worse) lines our in-process relays logged inside the block."""
    caplog.set_level(logging.WARNING)
    found: list[str] = []
    yield found
    found += [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# -- 1. the interop test client's 12 cases ----------------------------------------------------


async def test_aiomoqt_interop_client_passes_every_case(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Raw QUIC and WebTransport at once against one relay (two client processes; the cases
    mostly wait on the network, so side by side they cost one run's wall time)."""
    r = await relay_at(tmp_path)
    try:
        with relay_errors(caplog) as errors:
            # each run under a namespace prefix of its own: the client names its Tracks
            # from the clock, and two runs started together published the same ones
            runs = await asyncio.gather(*(
                run_tool("moq_interop_client", "-r", url, "--tls-disable-verify",
                         "--draft", "22", "--namespace-prefix", prefix, timeout=90)
                for url, prefix in ((base(r.url), "raw"), (r.wt_url, "wt"))))
    finally:
        await r.close()
    for (_code, out, err), transport in zip(runs, ("raw QUIC", "WebTransport"), strict=True):
        got = tap(out)
        assert set(got) == set(CASES), (transport, got, err[-2000:])
        failed = {c: v for c, v in got.items() if v != "ok"}
        assert failed == {}, (transport, failed)
    assert errors == []


# -- 2. a picoquic client joining a busy qh3 relay --------------------------------------------


async def test_a_picoquic_client_joins_while_another_client_sends(tmp_path: Path) -> None:
    """Issue 36: aiomoqt's subscriber never got a session from a qh3 relay that its publisher
    was feeding. qh3 counted only picoquic's Initial packet (307 bytes, the datagram padded
    after it) toward the anti-amplification budget and sent a 921-byte ServerHello datagram,
    which picoquic discards (RFC 9000 14.1); a qh3 relay now sends that client a Retry. Here
    aiomoqt's publisher sends while its setup-only case connects through a forwarder that
    sees every server Initial: the first is full size and the session is set up."""
    r = await relay_at(tmp_path)
    pub = asyncio.ensure_future(run_tool(
        "pub_bench", base(r.url), "-k", "--draft", "22", "-N", "busy", "-T", "t1", "-s", "4096",
        "-r", "500", "-t", "20", timeout=30))
    try:
        async with forwarding(ServerInitials, r.port) as (fwd, port):
            await wait_announced(r, (b"busy",))
            _code, out, err = await run_tool(
                "moq_interop_client", "-r", f"moqt://127.0.0.1:{port}", "-t", "setup-only",
                "--tls-disable-verify", "--draft", "22", timeout=30)
        assert tap(out) == {"setup-only": "ok"}, (out, err[-2000:])
        # the server's first Initial carries its ServerHello (ack-only ones may be shorter)
        assert fwd.initial_sizes and fwd.initial_sizes[0] >= 1200, fwd.initial_sizes
        assert not pub.done()  # it was publishing all along
    finally:
        pub.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pub
        await r.close()


# -- 3. aiomoqt's publisher and subscriber through a tree of our relays ----------------------


async def test_aiomoqt_publisher_and_subscriber_across_a_tree(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    """pub_bench at edge A, sub_bench at edge B, both under origin R: the subscriber's
    SUBSCRIBE is routed B -> R -> A -> publisher, and every Object it counts arrives, none
    lost (sub_bench's own accounting)."""
    origin = await relay_at(tmp_path / "r")
    a = await relay_at(tmp_path / "a", upstream=[origin.url])
    b = await relay_at(tmp_path / "b", upstream=[origin.url])
    try:
        with relay_errors(caplog) as errors:
            pub = asyncio.ensure_future(run_tool(
                "pub_bench", base(a.url), "-k", "--draft", "22", "-N", "tree", "-T", "t1",
                "-s", "2000", "-r", "200", "-g", "20", "-t", "6", timeout=30))
            await wait_announced(origin, (b"tree",))
            code, out, err = await run_tool(
                "sub_bench", base(b.url), "-k", "--draft", "22", "-N", "tree", "-T", "t1",
                "-t", "1", timeout=30)
            pub.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pub
    finally:
        for x in (b, a, origin):
            await x.close()
    report = out + err
    objects = re.search(r"Objects:\s+([\d,]+)", report)
    assert code == 0 and objects, report[-3000:]
    assert int(objects.group(1).replace(",", "")) > 0, report[-3000:]
    assert re.search(r"Lost:\s+0 ", report), report[-3000:]
    # one subscription per hop, B -> R -> A; A has the Track by PUBLISH, so none from A
    assert [x.relay.counters.upstream_subscriptions for x in (b, origin, a)] == [1, 1, 0]
    assert errors == []


async def wait_announced(r: RunningRelay, namespace: tuple[bytes, ...]) -> None:
    """Until ``r`` announces ``namespace`` to a client of its own (SUBSCRIBE_NAMESPACE)."""
    ours = await client(r)
    try:
        await wait_namespace(ours, namespace)
    finally:
        await ours.aclose()


# -- 4. our publisher against aiomoqt's relay -------------------------------------------------


@contextlib.asynccontextmanager
async def aiomoqt_relay(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """aiomoqt's ``moq_interop_relay`` (raw QUIC, draft-22) on 127.0.0.1: its URL and the
    certificate it serves. (It takes a port, not 0: it would not say which one it got.)"""
    paths = ensure_self_signed(tmp_path / "tls")
    port = free_udp_port()
    argv = [PY, "-m", "aiomoqt.tools.moq_interop_relay", "--bind", "127.0.0.1", "--port",
            str(port), "--cert", str(paths.certfile), "--key", str(paths.keyfile), "--quic",
            "--draft", "22"]
    async with ready_process(argv, rb"Listening on", TIMEOUT, "aiomoqt's relay"):
        yield f"moqt://127.0.0.1:{port}/", paths.certfile


SCOPE_KEY = bytes(range(32))


def small_plan(seed: int) -> PublicationPlan:
    """A small synthetic publication (3 blocks of 4 tokens) of the prompt ``prompt(seed)``;
    each seed is a publication of its own (namespace)."""
    d = synthetic_descriptor(4, 2, 8, "float16", block_tokens=4)
    k, v = synthetic_kv(4, 2, 8, 12, "float16", seed)
    return PublicationPlan(k, v, d, SCOPE_KEY, prompt(seed))


def prompt(seed: int) -> list[int]:
    return synthetic_tokens(12, seed)


async def test_kvcs_peers_with_aiomoqt_relay(tmp_path: Path) -> None:
    """Our peers against aiomoqt's relay (docs/interop.md, which says what works):

    * a publication goes in (PUBLISH, PUBLISH_NAMESPACE, the Objects; `--confirm none`);
    * while its publisher is connected, a completed-mode fetch gets it bit for bit (the
      relay forwards each FETCH to the publisher);
    * live mode is left out: through that relay it stalls until the stall timeout and then
      FETCHes, or its session breaks on an End of Range marker (docs/interop.md);
    * `--confirm status` / `fetch` cannot succeed there (TRACK_STATUS of an ended Track is
      refused DOES_NOT_EXIST; a whole-Track FETCH is answered to Group 0, without End of
      Track): issue 36 saw `kvcs publish` print nothing for a minute; it ends at its bound
      with a line naming the last answer (for TRACK_STATUS it said "()")."""
    plan = small_plan(1)
    async with aiomoqt_relay(tmp_path) as (url, cert):
        access = RelayAccess((url,), ca_file=cert)
        hold, confirmed = asyncio.Event(), asyncio.Event()
        pub = asyncio.ensure_future(publish_plan(plan, access, PublishOptions(
            confirm="none", hold=hold, confirmed=confirmed)))
        try:
            await asyncio.wait_for(confirmed.wait(), TIMEOUT)
            d = plan.descriptor
            got = await asyncio.wait_for(retrieve(RetrieveOptions(
                access, d, SCOPE_KEY, prompt(1), mode="completed")), TIMEOUT)
            assert got.exit_code == 0 and got.k.tobytes() == plan.k.tobytes() \
                and got.v.tobytes() == plan.v.tobytes()
        finally:
            hold.set()
            await asyncio.wait_for(pub, TIMEOUT)
        outcomes = await asyncio.gather(*(
            asyncio.wait_for(publish_plan(small_plan(seed), access, PublishOptions(
                confirm=mode, confirm_timeout=1.0)), TIMEOUT)
            for seed, mode in ((2, "status"), (3, "fetch"))), return_exceptions=True)
    status, fetch = outcomes
    assert isinstance(status, Unconfirmed), status
    assert "TRACK_STATUS refused: DOES_NOT_EXIST" in str(status), status
    assert isinstance(fetch, Unconfirmed), fetch
    assert "without End of Track" in str(fetch), fetch
