"""Layering: the relay never imports an engine (nor PyTorch), and the peers import PyTorch
only when --engine transformers is asked for."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers")


def _imported(modules: str, prefixes: tuple[str, ...]) -> list[str]:
    code = (f"import sys, {modules}; "
            f"print([m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or "
            f"m.startswith({prefixes!r})])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return list(eval(proc.stdout))  # a printed list of module names


def test_the_relay_never_imports_an_engine() -> None:
    assert _imported("relay.service, relay.core.relay, relay.cli, relay.metrics",
                     ("relay.peers", "relay.model", "relay.kvcs")) == []


@pytest.mark.parametrize("modules", [
    "relay.peers.cli, relay.peers.subscriber, relay.peers.publisher",
    "relay.peers.engines, relay.peers.engines.streaming, relay.peers.engines.generate, "
    "relay.peers.engines.numpy_llama, relay.peers.engine_options",
])
def test_the_peers_import_pytorch_only_for_the_transformers_engine(modules: str) -> None:
    assert _imported(modules, ("relay.peers.engines.hf",)) == []


def test_the_kvcs_library_and_the_model_import_no_engine() -> None:
    assert _imported("relay.kvcs.plan, relay.kvcs.kvfile, relay.model, relay.model.smollm2",
                     ("relay.peers",)) == []
