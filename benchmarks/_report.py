"""Shared output for benchmarks: one table on stdout, one JSON file per benchmark."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def report(name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
           extra: dict[str, Any] | None = None) -> Path:
    """Print `rows` as an aligned table and write them (plus `extra`) to results/<name>.json."""
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(str(c)), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(f"\n== {name}")
    print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"{name}.json"
    doc = {
        "benchmark": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "columns": list(columns),
        "rows": [list(r) for r in rows],
        **(extra or {}),
    }
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"(written to {out})")
    return out


def pyplot() -> Any:
    """matplotlib.pyplot drawing to files only, or None (with a note) when the `bench` extra
    is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("(matplotlib is not installed: no plot; it is in the `bench` extra)")
        return None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)
