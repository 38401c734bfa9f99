"""Imported first by the model's CLI test: makes tests/peers importable (tests/ subfolders are
not packages) so it shares the peers' subprocess harness. Not a conftest.py on purpose:
tests/transport imports its conftest by module name, which a second one would shadow."""

from __future__ import annotations

import sys
from pathlib import Path

PEERS = str(Path(__file__).resolve().parent.parent / "peers")
if PEERS not in sys.path:
    sys.path.insert(0, PEERS)
