"""Import rules between the layers: the MOQT codec and the session's rules state are sans-IO
(the standard library only, no asyncio, no sockets), and ``relay/session`` has no import
cycle. (Only the transport imports a QUIC library: tests/transport/test_transport_backend.py;
the relay never imports the KVCS library: tests/core/test_relay_robustness.py.)"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from import_rules import loaded_after

ROOT = Path(__file__).resolve().parents[1]
IO_MODULES = {"asyncio", "socket", "selectors", "ssl", "threading", "time"}


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of every module ``path`` (module ``module``) imports, also under
    TYPE_CHECKING."""
    parts = module.split(".")
    package = parts if path.name == "__init__.py" else parts[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                assert node.module is not None
                out.add(node.module)
                continue
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                out.add(".".join([*base, node.module]))
            else:  # from . import name: a submodule (or a name in the package)
                out.update(".".join([*base, a.name]) for a in node.names)
    return out


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_the_codec_and_the_session_state_are_sans_io() -> None:
    offenders = []
    for path in sorted((ROOT / "relay" / "moqt").rglob("*.py")):
        for name in _imports(path, _module(path)):
            top = name.split(".")[0]
            if top == "__future__" or name.startswith("relay.moqt"):
                continue
            if top not in sys.stdlib_module_names or top in IO_MODULES:
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []
    # and importing the state loads no I/O module at all
    code = ("import sys; before = set(sys.modules); import relay.moqt.state; "
            "new = set(sys.modules) - before; "
            f"bad = sorted(m for m in new if m.split('.')[0] in {sorted(IO_MODULES)!r} "
            "or m.startswith(('relay.session', 'relay.transport'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _assert_no_cycle(package: str) -> None:
    """No import cycle among the modules of ``package``, imports under TYPE_CHECKING
    included: a module that names another's type depends on it as much as one that calls
    it (a reader must know both), and a type-only back edge is exactly how a hub hides
    (``if TYPE_CHECKING: from .relay import Relay`` in every part of the relay core)."""
    folder = ROOT.joinpath(*package.split("."))
    graph: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        if path.name == "__init__.py":
            continue  # the package's face: it imports every module, none imports it
        name = _module(path)
        # ``from . import x`` and ``from .x import y`` both name the module x
        graph[name] = {".".join(m.split(".")[:3]) for m in _imports(path, name)
                       if m.startswith(package + ".")}
    assert len(graph) > 5
    # depth-first search for a back edge
    state = dict.fromkeys(graph, 0)  # 0 new, 1 on the path, 2 done
    path: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            assert state.get(m, 2) != 1, " -> ".join([*path[path.index(m):], m])
            if state.get(m) == 0:
                visit(m)
        path.pop()
        state[n] = 2

    for n in sorted(graph):
        if state[n] == 0:
            visit(n)


def test_the_session_modules_import_no_cycle() -> None:
    _assert_no_cycle("relay.session")


def test_the_core_modules_import_no_cycle() -> None:
    """relay/core's parts get their collaborators from `Relay`, which builds them: none
    reaches back to relay.py (docs/relay.md, "The core's parts")."""
    _assert_no_cycle("relay.core")


def test_the_reference_peers_never_import_the_relay_core() -> None:
    """The publisher and subscriber are clients of a relay: what they share with the relay
    (the session, the token a client presents) lives below both."""
    offenders = [f"{path.relative_to(ROOT)}: {name}"
                 for path in sorted((ROOT / "relay" / "peers").rglob("*.py"))
                 for name in _imports(path, _module(path))
                 if name.startswith(("relay.core", "relay.service", "relay.workers"))]
    assert offenders == []


def _project_imports(path: Path) -> set[str]:
    return {n for n in _imports(path, _module(path)) if n.split(".")[0] in ("relay", "storage")}


def test_the_settings_are_a_leaf_and_the_configuration_reads_only_them() -> None:
    """relay/options.py (the settings, defined once) imports nothing of the project, so any
    layer may read it; relay/config.py (keys, parsing, precedence) builds on it and on the
    session's token files, never on the relay it configures (relay.core, relay.service), not
    even through what it imports."""
    assert _project_imports(ROOT / "relay" / "options.py") == set()
    assert {n for n in _project_imports(ROOT / "relay" / "config.py")
            if n.startswith(("relay.core", "relay.service", "relay.workers"))} == set()
    assert loaded_after("import relay.config", ("relay.core", "relay.service")) == ""


def test_the_core_imports_nothing_of_the_transport() -> None:
    """The relay core reaches QUIC only through the session layer: its errors, stream
    handles and settings come under the session's names (relay/session/handles.py), so the
    transport can change below the session without the core knowing."""
    offenders = [f"{path.relative_to(ROOT)}: {name}"
                 for path in sorted((ROOT / "relay" / "core").rglob("*.py"))
                 for name in _imports(path, _module(path))
                 if name == "relay.transport" or name.startswith("relay.transport.")]
    assert len(list((ROOT / "relay" / "core").rglob("*.py"))) > 10
    assert offenders == []


def test_the_session_handles_are_what_the_transport_gives() -> None:
    """The core's names fit what arrives: every error the transport raises is a LinkError,
    and a transport send stream has every member of SendBacklog."""
    from relay.session import LinkError, SendBacklog
    from relay.transport import SendStream, errors

    members = {n for n in vars(SendBacklog) if not n.startswith("_")}
    assert members >= {"unsent", "would_wait"}
    assert [n for n in sorted(members) if not hasattr(SendStream, n)] == []
    raised = [c for c in vars(errors).values()
              if isinstance(c, type) and issubclass(c, Exception)]
    assert len(raised) > 3 and all(issubclass(c, LinkError) for c in raised)
