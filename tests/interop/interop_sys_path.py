"""Imported first by the interop tests: makes tests/core importable (tests/ subfolders are not
packages) so they reuse its relay helpers. Not a conftest.py on purpose: tests/transport
imports its conftest by module name, which a second conftest.py would shadow."""

from __future__ import annotations

import sys
from pathlib import Path

CORE = str(Path(__file__).resolve().parent.parent / "core")
if CORE not in sys.path:
    sys.path.insert(0, CORE)
