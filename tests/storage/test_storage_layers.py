"""Storage sits below the relay: importing every storage module loads no relay module."""

from __future__ import annotations

import subprocess
import sys


def test_storage_never_imports_the_relay() -> None:
    code = ("import sys, pkgutil, importlib, storage; "
            "[importlib.import_module('storage.' + m.name) "
            " for m in pkgutil.iter_modules(storage.__path__)]; "
            "bad = sorted(m for m in sys.modules if m == 'relay' or m.startswith('relay.')); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
