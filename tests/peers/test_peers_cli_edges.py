"""The CLI's rough edges, tried as a new user would: a --ca that is no certificate, a publish
that fails with --out, a certificate mismatch, the relay's ready line, `kvcs inspect`,
`kvcs keygen` and the progress line."""

from __future__ import annotations

import asyncio
import io
import json
import os
import pty
import stat
import sys
import time
from pathlib import Path

import pytest
from cli_harness import KVCS, free_udp_port, run_kvcs

from relay.kvcs.cose import KeyStore, load_private_key
from relay.kvcs.identifiers import load_scope_key, write_scope_key
from relay.kvcs.kvfile import write_kvfile
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_kv, synthetic_tokens
from relay.peers.progress import Progress
from relay.transport import ensure_self_signed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from relay_helpers import relay_at

TIMEOUT = 30.0
SYNTH = "3,2,8,32,float16,1"


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def _publish(url: str, ca: Path, key: Path, *extra: str) -> list[str]:
    return ["publish", "--relay", url, "--ca", str(ca), "--synthetic", SYNTH, "--scope-key",
            str(key), *extra]


async def test_a_ca_that_is_no_certificate_is_one_line_exit_2_at_once(tmp_path: Path) -> None:
    bogus, key = tmp_path / "notes.txt", tmp_path / "scope.key"
    bogus.write_text("this is not a certificate\n")
    write_scope_key(key, os.urandom(32))
    started = time.monotonic()
    code, _, err = await run_kvcs(*_publish(f"moqt://127.0.0.1:{free_udp_port()}/", bogus,
                                            key), timeout=TIMEOUT)
    assert code == 2 and str(bogus) in _one_error_line(err)
    assert time.monotonic() - started < 8  # no 10 s wait for an answer


async def test_a_failed_publish_leaves_no_out_file(tmp_path: Path) -> None:
    ca = ensure_self_signed(tmp_path / "tls").certfile
    key, out = tmp_path / "scope.key", tmp_path / "published.kv"
    write_scope_key(key, os.urandom(32))
    code, _, err = await run_kvcs(*_publish(f"moqt://127.0.0.1:{free_udp_port()}/", ca, key,
                                            "--out", str(out), "--connect-ms", "300"),
                                  timeout=TIMEOUT)
    assert code == 1 and "no answer" in _one_error_line(err)
    assert not out.exists()


async def test_a_certificate_mismatch_is_only_the_projects_line(tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "relay")
    other = ensure_self_signed(tmp_path / "other").certfile
    key = tmp_path / "scope.key"
    write_scope_key(key, os.urandom(32))
    url = r.url
    try:
        code, _, err = await run_kvcs(*_publish(url, other, key), timeout=TIMEOUT)
    finally:
        await r.close()
    assert code == 1 and url in _one_error_line(err)


@pytest.mark.parametrize("backend", ["aioquic", "qh3"])
async def test_the_ready_line_names_certificate_path_fingerprint_and_heap(tmp_path: Path,
                                                                          backend: str) -> None:
    # the heap's setting, both ways: glibc's defaults asked for on one backend
    defaults = ("--malloc-defaults",) if backend == "aioquic" else ()
    proc = await asyncio.create_subprocess_exec(
        *KVCS, "relay", "--listen", "127.0.0.1:0", "--data-dir",
        str(tmp_path), "--metrics-listen", "off", "--quic-backend", backend, *defaults,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(TIMEOUT):
            while b"relay ready" not in (line := await proc.stderr.readline()):
                assert line
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.communicate(), TIMEOUT)
    text = line.decode()
    assert f"certificate={tmp_path / 'tls' / 'cert.pem'} sha256=" in text
    # the QUIC library the relay actually runs on, and its controller where there is a choice
    assert {"aioquic": " quic=aioquic cc=bbr ", "qh3": " quic=qh3 "}[backend] in text
    assert (" cc=" in text) == (backend == "aioquic")
    # relay/heap.py; an operator's MALLOC_* variables would say "operator"
    assert text.rstrip().endswith(" malloc=default" if defaults else " malloc=tuned")


async def test_inspect_tells_what_a_file_holds(tmp_path: Path) -> None:
    desc = synthetic_descriptor(3, 2, 8, "float16", 8)
    k, v = synthetic_kv(3, 2, 8, 32, "float16", 1)
    kv, d, rep, junk = (tmp_path / n for n in ("c.kv", "d.json", "r.json", "junk.bin"))
    write_kvfile(kv, k, v, desc, synthetic_tokens(32, 1))
    d.write_bytes(desc.canonical_json())
    rep.write_text(json.dumps({"namespace": "kvcs-1/00", "relays": ["moqt://x/"],
                               "tracks": 3, "objects": 12, "bytes": 100, "segments": 1,
                               "layers": 3, "elapsed_s": 0.1, "confirmed": True}))
    junk.write_bytes(os.urandom(64))
    code, out, err = await run_kvcs("inspect", "--json", str(kv), timeout=TIMEOUT)
    assert code == 0, err
    info = json.loads(out)
    assert info["kind"] == "kv cache file" and info["compat_id"] == desc.compat_id.hex()
    assert info["k_shape"] == list(k.shape) and info["blocks"] == 4 and info["layers"] == 3
    code, out, _ = await run_kvcs("inspect", str(d), timeout=TIMEOUT)
    assert code == 0 and "descriptor" in out and desc.compat_id.hex() in out
    code, out, _ = await run_kvcs("inspect", "--json", str(rep), timeout=TIMEOUT)
    assert code == 0 and json.loads(out)["kind"] == "publish report"
    code, _, err = await run_kvcs("inspect", str(junk), timeout=TIMEOUT)
    assert code == 1 and str(junk) in _one_error_line(err)
    # `kvcs inspect FILE | head`: the reader is gone before the output; no error line
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = await asyncio.create_subprocess_exec(*KVCS, "inspect", str(kv), stdout=write_end,
                                                    stderr=asyncio.subprocess.PIPE)
    finally:
        os.close(write_end)
    _, err_b = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert err_b.decode() == "" and proc.returncode != 0


async def test_keygen_writes_usable_keys_with_safe_modes(tmp_path: Path) -> None:
    for alg in ("p256", "ed25519"):
        d = tmp_path / alg
        code, _, err = await run_kvcs("keygen", "--out-dir", str(d), "--alg", alg,
                                        "--kid", "prod-1", timeout=TIMEOUT)
        assert code == 0, err
        for p in (d / "scope.key", d / "prod-1.pem"):
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        assert len(load_scope_key(d / "scope.key")) == 32
        load_private_key(d / "prod-1.pem")
        assert b"prod-1" in KeyStore.from_directory(d / "keys")
        code, _, err = await run_kvcs("keygen", "--out-dir", str(d), timeout=TIMEOUT)
        assert code == 1 and "exists" in _one_error_line(err)


def test_progress_only_on_a_terminal_and_not_with_quiet() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, quiet, shown in ((Tty(), False, True), (Tty(), True, False),
                                 (io.StringIO(), False, False)):
        p = Progress("publish", 4, 4_000_000, quiet=quiet, stream=stream)
        for layer in range(4):
            p.layer(0, layer)
        p.close()
        text = stream.getvalue()
        assert ("layer 4/4" in text and "MB/s" in text) if shown else text == ""


async def _on_a_terminal(*args: str) -> tuple[int, str]:
    """Run ``kvcs ARGS`` with stderr on a pseudo-terminal; (exit code, what it showed)."""
    master, slave = pty.openpty()
    proc = await asyncio.create_subprocess_exec(*KVCS, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=slave)
    os.close(slave)
    await asyncio.wait_for(proc.communicate(), TIMEOUT)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert proc.returncode is not None
    return proc.returncode, shown.decode()


async def test_publish_and_fetch_show_progress_on_a_terminal_only(tmp_path: Path) -> None:
    r = await relay_at(tmp_path / "relay")
    key, out = tmp_path / "scope.key", tmp_path / "pub.kv"
    write_scope_key(key, os.urandom(32))
    try:
        code, shown = await _on_a_terminal(*_publish(r.url, r.certfile, key, "--out",
                                                      str(out)))
        assert code == 0 and "publish: layer 3/3" in shown and "MB/s" in shown, shown
        code, shown = await _on_a_terminal(
            "fetch", "--relay", r.url, "--ca", str(r.certfile), "--descriptor", str(out),
            "--tokens", str(out), "--scope-key", str(key))
        assert code == 0 and "fetch: layer 3/3" in shown, shown
        code, shown = await _on_a_terminal(*_publish(r.url, r.certfile, key, "--quiet"))
        assert code == 0 and "publish: layer" not in shown, shown
    finally:
        await r.close()


def test_receiving_commands_default_to_qh3_and_publishing_ones_to_aioquic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """fetch and subscribe receive: their bytes are the relay's to send, so they take qh3,
    which receives at a fraction of aioquic's CPU (docs/transport.md); publish and prefill
    send, and keep aioquic with bbr. Naming an aioquic controller, or qh3 missing, means
    aioquic."""
    from relay.peers import cli
    from relay.transport import backend
    from relay.transport.backend import BackendUnavailable, default_backend

    defaults = {c.name: next(p.default for p in c.params if p.name == "quic_backend")
                for c in (cli.fetch, cli.subscribe, cli.publish, cli.prefill)}
    assert defaults == {"fetch": None, "subscribe": None, "publish": "aioquic",
                        "prefill": "aioquic"}
    chosen = cli._with_quic_backend(lambda: default_backend("client"))
    saved = default_backend("client")
    try:
        assert chosen(quic_backend=None, congestion_control=None) == "qh3"
        assert chosen(quic_backend=None, congestion_control="bbr") == "aioquic"
        assert chosen(quic_backend="aioquic", congestion_control=None) == "aioquic"
        real = backend.get_backend

        def no_qh3(name: str = "aioquic") -> backend.QuicBackend:
            if name == "qh3":
                raise BackendUnavailable("QUIC backend 'qh3' is not installed")
            return real(name)

        monkeypatch.setattr(cli, "get_backend", no_qh3)
        assert chosen(quic_backend=None, congestion_control=None) == "aioquic"
    finally:
        cli._congestion_control = None
        backend.set_default_backend(client=saved)
