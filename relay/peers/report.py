"""The consumer's JSON report: per-layer usable time, bytes, Objects verified/discarded,
retries and recovery decisions."""

from __future__ import annotations

from typing import Any

from .inputs import format_namespace
from .state import RetrievalState


def build_report(state: RetrievalState, mode: str, recompute: list[int], exit_code: int
                 ) -> dict[str, Any]:
    usable = state.usable_layers()
    layers = []
    for g in range(state.descriptor.layers):
        st = state.layers.get(g)
        layers.append({
            "layer": g,
            "usable_ms": round(usable[g], 3) if g in usable else None,
            "bytes": st.bytes if st else 0,
            "objects_verified": st.verified if st else 0,
            "objects_discarded": st.discarded if st else 0,
        })
    times = sorted(usable.values())
    manifest = state.manifest
    return {
        "mode": mode,
        "exit_code": exit_code,
        "error": None,  # the line a command that fails prints (relay/peers/cli.py, _reported)
        "namespace": format_namespace(state.namespace) if state.namespace else None,
        "manifest_signed": bool(state.verifier and state.verifier.signed),
        "deterministic": bool(manifest and manifest.deterministic),
        "segments": [{"segment": s, "blocks": t.blocks, "tracks": t.tracks,
                      "complete": t.reasm.complete}
                     for s, t in sorted(state.targets.items())],
        "prompt_blocks": len(state.keys),
        "reused_blocks": state.reused_blocks(),
        "reused_tokens": state.reused_blocks() * state.descriptor.block_tokens,
        "first_layer_ms": round(times[0], 3) if times else None,
        "all_layers_ms": round(times[-1], 3) if times and not recompute else None,
        "bytes": sum(x["bytes"] for x in layers),
        "objects_verified": sum(x["objects_verified"] for x in layers),
        "objects_discarded": sum(x["objects_discarded"] for x in layers),
        "objects_duplicate": state.duplicates,
        "retries": state.retries,
        "connections": [{"connection": c, "objects": n, "bytes": b}
                        for c, (n, b) in state.carried.items()],
        "recompute_layers": recompute,
        "deadline_passed": state.deadline_passed,
        # --require-cose: Objects received but never listed by a signed manifest version
        # (their layers are in recompute_layers, their data is not in the output)
        "unverified_objects": state.unverified_objects(),
        "layers": layers,
        "decisions": state.decisions,
        "discarded": state.discard_reasons,
    }
