"""The Helm chart's operator pieces: the Grafana dashboard (off by default, a ConfigMap with
the sidecar's label when on, every panel's query naming only metrics of docs/metrics.md),
and the quotas, max_sessions and admin token as the relay reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
from test_ops_metrics import _documented
from test_ops_packaging import CHART, K8S_VERSION, _render

from relay.config import load

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


def test_chart_carries_quotas_max_sessions_and_the_admin_token(tmp_path: Path) -> None:
    scope = "ab" * 32
    docs = _render({"relay": {"maxSessions": 500},
                    "quotas": {"memoryBytes": 1 << 28, "scopes": {scope: {"lmdbBytes": 1 << 34}}},
                    "admin": {"token": "admin-token-0123456789abcdef"}})
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    cm = by["ConfigMap", "edge-kvcs-relay"]["data"]["relay.toml"]
    assert "admin-token" not in cm
    token = by["Secret", "edge-kvcs-relay-admin"]["stringData"]["admin.token"]
    (tmp_path / "admin.token").write_text(token)
    conf = (tmp_path / "relay.toml")
    conf.write_text(cm.replace("/etc/kvcs/admin/admin.token", str(tmp_path / "admin.token")))
    s = load({}, {}, conf)  # the relay reads the rendered file as it is
    assert s.max_sessions == 500 and s.admin_token == token
    q = s.relay_config().scope_quotas
    assert q.limit(bytes.fromhex(scope), "lmdb") == 1 << 34
    assert q.limit(b"other", "memory") == 1 << 28
    pod = by["StatefulSet", "edge-kvcs-relay"]["spec"]["template"]["spec"]
    assert {"mountPath": "/etc/kvcs/admin", "name": "admin", "readOnly": True} in \
        pod["containers"][0]["volumeMounts"]
