"""The backend seam: only relay/transport touches a QUIC library, and the few private
members each backend relies on still exist (these fail loudly on a library upgrade)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from relay.session.wire import MOQT
from relay.transport import QuicSettings, connect
from relay.transport.backend import (
    BACKENDS,
    BackendUnavailable,
    get_backend,
)

ROOT = Path(__file__).resolve().parents[2]
QUIC_LIBRARIES = ("aioquic", "qh3")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_only_the_transport_imports_a_quic_library() -> None:
    offenders = []
    for folder in ("relay", "storage", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(ROOT / "relay" / "transport"):
                continue
            bad = _imports(path) & set(QUIC_LIBRARIES)
            if bad:
                offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert offenders == []
    # and within the transport, each library only in its own backend module
    for path in sorted((ROOT / "relay" / "transport").glob("*.py")):
        for lib in _imports(path) & set(QUIC_LIBRARIES):
            assert path.name == f"_{lib}.py", f"{path.name} imports {lib}"


def test_both_backends_are_installed() -> None:
    # `make` installs the fast extra: a missing qh3 must fail here, not skip tests
    assert [get_backend(name).name for name in BACKENDS] == list(BACKENDS)


def _fresh(name: str) -> object:
    backend = get_backend(name)
    return backend.connection(backend.configuration(QuicSettings(), True, ["moqt-22"], 1200))


def _h3_uses(cls: type, name: str) -> bool:
    """``cls.__init__`` sets or reads attribute ``name``."""
    return name in cls.__init__.__code__.co_names


def test_aioquic_private_members_still_exist() -> None:
    from aioquic.h3.connection import H3Connection
    from aioquic.quic.connection import QuicConnection

    from relay.transport import _aioquic

    quic = _fresh("aioquic")
    for name in _aioquic.PRIVATE_MEMBERS[QuicConnection]:
        assert hasattr(quic, name), f"aioquic QuicConnection.{name}"
    for name in _aioquic.PRIVATE_MEMBERS[H3Connection]:
        assert _h3_uses(H3Connection, name), f"aioquic H3Connection.{name}"
    from aioquic.asyncio.server import QuicServer
    for name in _aioquic.PRIVATE_MEMBERS[QuicServer]:
        assert _h3_uses(QuicServer, name), f"aioquic QuicServer.{name}"
    from aioquic.quic.stream import QuicStreamSender
    sender = QuicStreamSender(stream_id=0, writable=True)
    for name in _aioquic.PRIVATE_MEMBERS[QuicStreamSender]:
        assert hasattr(sender, name), f"aioquic QuicStreamSender.{name}"
    # the controller and pacer the bbr model replaces (congestion.py, ModelPacer)
    from aioquic.quic.recovery import QuicPacketRecovery
    loss = quic._loss  # type: ignore[attr-defined]
    for name in _aioquic.PRIVATE_MEMBERS[QuicPacketRecovery]:
        assert hasattr(loss, name), f"aioquic QuicPacketRecovery.{name}"


def test_qh3_private_members_still_exist() -> None:
    from qh3._hazmat import QuicConnectionCore
    from qh3.h3.connection import H3Connection

    from relay.transport import _qh3

    quic = _fresh("qh3")
    for name in _qh3.PRIVATE_MEMBERS_INSTANCE:
        assert hasattr(quic, name), f"qh3 QuicConnection.{name}"
    # the core counters the view reads, and the receive calls the endpoint makes directly
    for name in ("bytes_in_flight", "stream_limits", "poll_transmit", "receive_many_datagrams",
                 "receive_gro_buffer"):
        assert hasattr(QuicConnectionCore, name), f"qh3 QuicConnectionCore.{name}"
    for name in _qh3.PRIVATE_MEMBERS_H3:
        assert _h3_uses(H3Connection, name), f"qh3 H3Connection.{name}"
    from qh3.asyncio.server import QuicServer
    for name in _qh3.PRIVATE_MEMBERS_SERVER:
        assert _h3_uses(QuicServer, name), f"qh3 QuicServer.{name}"


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError):
        get_backend("picoquic")
    with pytest.raises(ValueError):
        QuicSettings(backend="picoquic")


async def test_a_missing_backend_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "relay.transport._qh3", None)  # as if not installed
    with pytest.raises(BackendUnavailable, match=r"kvcs-relay\[fast\]"):
        await connect("moqt://127.0.0.1:9/", settings=QuicSettings(backend="qh3"), application=MOQT)


@pytest.mark.parametrize("argv", [
    ["relay", "--quic-backend", "qh3", "--metrics-listen", "off", "--listen", "127.0.0.1:0"],
    ["fetch", "--quic-backend", "qh3", "--relay", "moqt://127.0.0.1:9/", "--insecure",
     "--descriptor", __file__, "--scope-key", __file__, "--tokens", __file__],
])
def test_cli_without_qh3_is_one_line_and_exit_2(argv: list[str], tmp_path: Path) -> None:
    code = ("import sys; sys.modules['qh3'] = None; from relay.cli import main; "
            f"sys.argv = ['kvcs'] + {argv!r}; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "qh3" in lines[0] and "not installed" in lines[0], lines


def test_the_transport_holds_no_moqt_value() -> None:
    """The caller hands MOQT's ALPN and codes to the transport (relay/session/wire.py): no
    module of relay/transport spells the ALPN outside its docs, or names MOQT's codes."""
    import ast

    from relay.moqt.codes import ALPN

    for path in (Path(__file__).parents[2] / "relay" / "transport").glob("*.py"):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                  ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in docs:
                assert not (isinstance(node.value, str) and ALPN in node.value), path
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("relay.moqt"), path


def _library_privates(path: Path) -> set[str]:
    """Private names a backend module uses of its QUIC library: every ``x._name`` read or
    written whose name the module does not give itself (``self._name = ...``, a ``def`` or
    a slot), and every method a subclass of a library class overrides with a private name."""
    tree = ast.parse(path.read_text())
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                        t.value.id == "self":
                    own.add(t.attr)
                if isinstance(t, ast.Name) and t.id == "__slots__" and \
                        isinstance(node.value, ast.Tuple):
                    own.update(e.value for e in node.value.elts
                               if isinstance(e, ast.Constant) and isinstance(e.value, str))
    overrides: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        defs = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
        own |= {d for d in defs if d.startswith("_")}
        if cls.bases:  # subclassing a library class: its private defs override the library's
            overrides |= {d for d in defs if d.startswith("_") and not d.startswith("__")}
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and n.attr.startswith("_") and not n.attr.startswith("__")}
    return (used - own) | overrides


def test_every_private_member_a_backend_uses_is_listed_and_checked() -> None:
    """docs/transport.md: every private member of a QUIC library the transport touches is
    listed (PRIVATE_MEMBERS*), checked to exist by the two tests above, and named in the
    doc's list of them, which says why each is needed."""
    from relay.transport import _aioquic, _qh3

    folder = ROOT / "relay" / "transport"
    listed_aioquic = {n for names in _aioquic.PRIVATE_MEMBERS.values() for n in names}
    assert _library_privates(folder / "_aioquic.py") <= listed_aioquic
    listed_qh3 = {*_qh3.PRIVATE_MEMBERS_INSTANCE, *_qh3.PRIVATE_MEMBERS_H3,
                  *_qh3.PRIVATE_MEMBERS_SERVER}
    assert _library_privates(folder / "_qh3.py") <= listed_qh3
    # and each says why, in the doc's list
    doc = (ROOT / "docs" / "transport.md").read_text()
    listed = doc[doc.index("Private members still used"):doc.index("Gone since the seam")]
    assert {n for n in listed_aioquic | listed_qh3
            if f"`{n}`" not in listed and f".{n}`" not in listed} == set()
