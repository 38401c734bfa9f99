"""The lab fixture: a fresh network of namespaces per test, torn down after it (also when it
failed), and a sweep at the start of the session of labs a killed run left behind."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netlab import Lab, sweep_stale, unavailable

_WHY_NOT = unavailable()


@pytest.fixture(scope="session")
def _swept() -> None:
    if _WHY_NOT is None:
        sweep_stale()


@pytest.fixture
async def lab(tmp_path: Path, _swept: None) -> AsyncIterator[Lab]:
    if _WHY_NOT is not None:
        pytest.skip(_WHY_NOT)
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        await lab.close()
