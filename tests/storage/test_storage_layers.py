"""Storage sits below the relay: importing every storage module loads no relay module."""

from __future__ import annotations

from import_rules import loaded_after


def test_storage_never_imports_the_relay() -> None:
    every_module = ("import importlib, pkgutil, storage\n"
                    "for m in pkgutil.iter_modules(storage.__path__):\n"
                    "    importlib.import_module('storage.' + m.name)")
    assert loaded_after(every_module, ("relay.",)) == ""
