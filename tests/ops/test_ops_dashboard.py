"""The Grafana dashboard of the Helm chart: off by default, a ConfigMap with the sidecar's
label when on, and every panel's query names only metrics of docs/metrics.md."""

from __future__ import annotations

import json
import re

import kubernetes_validate
from test_ops_metrics import _documented
from test_ops_packaging import CHART, K8S_VERSION, _render

DASHBOARD = CHART / "dashboards" / "kvcs-relay.json"
# series a family exposes besides its own name (histograms, gauge histograms)
SUFFIXES = ("_bucket", "_count", "_sum", "_gcount", "_gsum")


def _family(series: str, documented: set[str]) -> str | None:
    if series in documented:
        return series
    for suffix in SUFFIXES:
        if series.endswith(suffix) and series[: -len(suffix)] in documented:
            return series[: -len(suffix)]
    return None


def test_every_panel_queries_only_documented_metrics() -> None:
    documented = set(_documented())
    dash = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            names = re.findall(r"\bkvcs_relay_\w+", t["expr"])
            assert names, (panel["title"], t["expr"])
            for name in names:
                fam = _family(name, documented)
                assert fam is not None, f"{panel['title']}: {name} is not in docs/metrics.md"
                used.add(fam)
    for v in dash["templating"]["list"]:
        for name in re.findall(r"\bkvcs_relay_\w+", json.dumps(v.get("query", ""))):
            assert _family(name, documented), name
    # what the issue asks the dashboard to show
    for fam in ("kvcs_relay_received_bytes_total", "kvcs_relay_sent_bytes_total",
                "kvcs_relay_objects_sent_total", "kvcs_relay_cache_hits_total",
                "kvcs_relay_evictions_total", "kvcs_relay_subscriber_backlog_bytes",
                "kvcs_relay_fills_active", "kvcs_relay_fetches_active",
                "kvcs_relay_upstream_connected", "kvcs_relay_authorization_failures_total",
                "kvcs_relay_sessions_open"):
        assert fam in used, fam
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_configmap_is_off_by_default_and_labelled_for_the_sidecar() -> None:
    assert not any(d["metadata"]["name"].endswith("-dashboard") for d in _render({}))
    docs = _render({"grafanaDashboard": {"enabled": True,
                                         "annotations": {"grafana_folder": "kvcs"}}})
    cm = next(d for d in docs if d["metadata"]["name"] == "edge-kvcs-relay-dashboard")
    kubernetes_validate.validate(cm, K8S_VERSION, strict=True)
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "kvcs"}
    assert json.loads(cm["data"]["kvcs-relay.json"]) == json.loads(DASHBOARD.read_text())
