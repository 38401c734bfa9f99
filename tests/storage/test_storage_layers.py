"""Storage sits below the relay core: of `relay` it loads only the sans-IO MOQT codec, whose
vocabulary (Location, Object Status, Group Order, vi64) the relay and its store share."""

from __future__ import annotations

import pkgutil

from import_rules import loaded_after

import relay


def test_storage_loads_only_the_codec_of_the_relay() -> None:
    every_module = ("import importlib, pkgutil, storage\n"
                    "for m in pkgutil.iter_modules(storage.__path__):\n"
                    "    importlib.import_module('storage.' + m.name)")
    others = tuple(f"relay.{m.name}" for m in pkgutil.iter_modules(relay.__path__)
                   if m.name != "moqt")
    assert {"relay.core", "relay.session", "relay.transport", "relay.kvcs"} <= set(others)
    assert loaded_after(every_module, others) == ""
    # and the vocabulary is the codec's own, not a copy
    assert loaded_after(every_module, ("relay.moqt.codes",)) != ""
