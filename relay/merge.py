"""What the supervisor of several workers (relay/workers.py) answers as one relay: each
worker's /metrics text and /admin/ JSON, merged."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from relay.admin import scope_totals

# Gauges that say "yes/no" per process: the aggregate is the largest, not the sum.
_MAX_NOT_SUM = {"kvcs_relay_draining", "kvcs_relay_upstream_connected"}


def merge_admin_state(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every worker's ``GET /admin/state`` as one: sessions and bytes add up, a Track held
    by several workers is one entry (its tiers and subscribers joined)."""
    sessions: dict[str, int] = {}
    tracks: dict[tuple[str, str], dict[str, Any]] = {}
    namespaces: set[str] = set()
    for d in docs:
        for k, v in d["sessions"].items():
            sessions[k] = sessions.get(k, 0) + v
        namespaces.update(d["namespaces"])
        for t in d["tracks"]:
            key = (t["namespace"], t["name"])
            have = tracks.get(key)
            if have is None:
                tracks[key] = {**t, "bytes": dict(t["bytes"]), "workers": 1}
                continue
            have["workers"] += 1
            have["tiers"] = sorted(set(have["tiers"]) | set(t["tiers"]))
            have["subscribers"] += t["subscribers"]
            have["complete"] = have["complete"] or t["complete"]
            have["live"] = have["live"] or t["live"]
            have["aborted"] = have.get("aborted", False) or t.get("aborted", False)
            for tier, n in t["bytes"].items():
                have["bytes"][tier] = max(have["bytes"].get(tier, 0), n)
            if t["largest_object"] and (not have["largest_object"]
                                        or t["largest_object"] > have["largest_object"]):
                have["largest_object"] = t["largest_object"]
    merged = [tracks[k] for k in sorted(tracks)]
    return {"sessions": sessions, "workers": len(docs), "scopes": scope_totals(merged),
            "namespaces": sorted(namespaces), "tracks": merged}


def merge_admin_purge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every worker's ``POST /admin/purge`` answer as one."""
    removed: dict[tuple[str, str], dict[str, Any]] = {}
    for d in docs:
        for r in d["removed"]:
            have = removed.setdefault((r["namespace"], r["name"]), {**r, "tiers": []})
            have["tiers"] = sorted(set(have["tiers"]) | set(r["tiers"]))
    return {"prefix": docs[0]["prefix"] if docs else "",
            "removed": [removed[k] for k in sorted(removed)],
            "subscriptions_ended": sum(d["subscriptions_ended"] for d in docs),
            "namespaces_done": sorted({ns for d in docs for ns in d["namespaces_done"]})}


def merge_metrics(texts: list[str], *, up: int) -> str:
    """The workers' Prometheus text expositions as one: samples with the same name and
    labels are summed (counters, gauges of amounts, histogram buckets and sums), yes/no
    gauges take the largest value."""
    families: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            _, _, samples = families.setdefault(fam.name, (fam.type, fam.documentation, {}))
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue  # a creation time per process: nothing to add up
                key = (s.name, tuple(sorted(s.labels.items())))
                if fam.name in _MAX_NOT_SUM:
                    samples[key] = max(samples.get(key, s.value), s.value)
                else:
                    samples[key] = samples.get(key, 0.0) + s.value
    out = ["# HELP kvcs_relay_workers_up Relay workers that answered this scrape.",
           "# TYPE kvcs_relay_workers_up gauge", f"kvcs_relay_workers_up {up}"]
    for name, (mtype, doc, samples) in families.items():
        out.append(f"# HELP {name} {_escape_help(doc)}")
        out.append(f"# TYPE {name} {mtype}")
        for (sname, labels), value in samples.items():
            lbl = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
            out.append(f"{sname}{{{lbl}}} {_fmt(value)}" if lbl else f"{sname} {_fmt(value)}")
    return "\n".join(out) + "\n"


def _escape_help(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(int(v)) if v.is_integer() else repr(v)


__all__ = ["merge_admin_purge", "merge_admin_state", "merge_metrics"]
