"""Import rules of the layers, checked in a fresh interpreter (nothing already imported)."""

from __future__ import annotations

import subprocess
import sys


def loaded_after(imports: str, prefixes: tuple[str, ...]) -> str:
    """Run ``imports`` (Python statements) alone; '' if no module under ``prefixes`` was
    loaded, else what was (and any error)."""
    code = (f"import sys\n{imports}\n"
            f"bad = sorted(m for m in sys.modules if m.startswith({prefixes!r}))\n"
            "print(bad)\nsys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr
