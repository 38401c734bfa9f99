"""What the supervisor of several workers (relay/workers.py) answers as one relay: each
worker's /metrics text and /admin/ JSON, merged."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

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


def merge_metrics(texts: list[str], extra: list[Metric], *, up: int) -> str:
    """The workers' Prometheus text expositions as one, plus ``extra`` (the supervisor's
    own counts of the same families): samples with the same name and labels are summed
    (counters, gauges of amounts, histogram buckets and sums), yes/no gauges take the
    largest value.

    The result is written by prometheus_client's own exposition, as a single relay's is:
    one HELP and TYPE line per family, under the name its samples carry (``…_total`` for a
    counter). A family is keyed by the name the parser gives it, so the supervisor's own
    counter merges into the workers' family instead of being a second one."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    parsed = [fam for text in texts for fam in text_string_to_metric_families(text)]
    for fam in [*parsed, *extra]:
        samples = [s for s in fam.samples if not s.name.endswith("_created")]
        if fam.samples and not samples:
            continue  # only a creation time per process (a histogram's): nothing to add up
        families.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type))
        merged = values.setdefault(fam.name, {})
        for s in samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if fam.name in _MAX_NOT_SUM:
                merged[key] = max(merged.get(key, s.value), s.value)
            else:
                merged[key] = merged.get(key, 0.0) + s.value
    up_fam = GaugeMetricFamily("kvcs_relay_workers_up",
                               "Relay workers that answered this scrape.", value=up)
    out: list[Metric] = [up_fam]
    for name, fam in families.items():
        for (sname, labels), value in values[name].items():
            fam.add_sample(sname, dict(labels), value)
        out.append(fam)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(out))
    return generate_latest(registry).decode()


class _Families(Collector):
    """Metric families already built, as a collector (to render them)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


__all__ = ["merge_admin_purge", "merge_admin_state", "merge_metrics"]
