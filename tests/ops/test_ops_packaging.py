"""Packaging: the Helm chart rendered by a real Helm engine (helm-python-sdk binds Helm's Go
SDK) and every manifest validated against the Kubernetes schemas (kubernetes-validate); the
Dockerfile's paths, command, ports and settings exist in the repository."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from relay.config import KEY_BY_NAME, KEYS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kvcs-relay"
K8S_VERSION = "1.37.0"

FULL: dict[str, Any] = {
    "upstream": ["moqt://root-kvcs-relay.kvcs.svc.cluster.local:4433/"],
    "upstreamCASecret": "root-ca",
    "service": {"type": "LoadBalancer", "loadBalancerIP": "203.0.113.7"},
    "tls": {"cert": "-----BEGIN CERTIFICATE-----", "key": "-----BEGIN PRIVATE KEY-----"},
    "auth": {"tokens": [{"token": "s3cret", "prefixes": ["kvcs-1"],
                         "roles": ["publish", "subscribe"]}]},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "nodeSelector": {"kvcs": "relay"},
}


def _render(values: dict[str, Any], name: str = "edge") -> list[dict[str, Any]]:
    rendered = helm.Chart.load(CHART).render(values, name=name, namespace="kvcs",
                                             is_install=True)
    docs = []
    for text in rendered.values():
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def test_chart_lints_clean() -> None:
    report = helm.lint(CHART, strict=True)
    assert report["errors"] == []
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


@pytest.mark.parametrize("values", [{}, FULL], ids=["defaults", "everything"])
def test_every_manifest_is_valid_kubernetes(values: dict[str, Any]) -> None:
    docs = _render(values)
    kinds = sorted(d["kind"] for d in docs)
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked below, the core schemas do not know it
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    if values:
        assert kinds == ["ConfigMap", "Secret", "Secret", "Service", "Service",
                         "ServiceMonitor", "StatefulSet"]
        sm = next(d for d in docs if d["kind"] == "ServiceMonitor")
        assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    else:
        assert kinds == ["ConfigMap", "Service", "Service", "StatefulSet"]


def test_statefulset_service_probes_and_relay_config() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _render(FULL, name="edge")}
    sts = docs["StatefulSet", "edge-kvcs-relay"]
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/var/lib/kvcs", "/etc/kvcs/tls",
                                                         "/etc/kvcs/tokens"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    svc = docs["Service", "edge-kvcs-relay"]
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"][0]["protocol"] == "UDP"
    tokens = docs["Secret", "edge-kvcs-relay-tokens"]["stringData"]["tokens.toml"]
    assert tomllib.loads(tokens)["auth"]["tokens"][0]["token"] == "s3cret"
    # the ConfigMap is a relay configuration file: every key known, no secret in it
    cm = docs["ConfigMap", "edge-kvcs-relay"]["data"]["relay.toml"]
    conf = tomllib.loads(cm)
    assert set(conf) <= set(KEY_BY_NAME)
    assert "s3cret" not in cm
    assert conf["upstream"] == FULL["upstream"]
    for name, raw in conf.items():
        KEY_BY_NAME[name].parse(raw)  # each value parses as the relay will parse it
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > conf["drain_timeout"]
    assert conf["quic_backend"] == "qh3"  # the chart's default, as the image


def _dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_refers_to_what_the_repository_has() -> None:
    instr = _dockerfile()
    ops = [op for op, _ in instr]
    assert ops.count("FROM") == 2  # multi-stage
    assert all("slim" in rest for op, rest in instr if op == "FROM")
    for op, rest in instr:
        if op == "COPY" and not rest.startswith("--from"):
            for src in shlex.split(rest)[:-1]:
                assert (ROOT / src).exists(), src
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entry = next(rest for op, rest in instr if op == "ENTRYPOINT")
    argv = json.loads(entry)
    assert argv[0] in scripts and argv[1] == "relay"
    user = next(rest for op, rest in instr if op == "USER")
    assert user not in ("root", "0")
    exposed = next(rest for op, rest in instr if op == "EXPOSE").split()
    defaults = {k.name: k.text_default for k in KEYS}
    assert f"{defaults['listen'].rsplit(':', 1)[1]}/udp" in exposed
    assert f"{defaults['metrics_listen'].rsplit(':', 1)[1]}/tcp" in exposed
    env = next(rest for op, rest in instr if op == "ENV")
    for var, value in re.findall(r"(KVCS_RELAY_\w+)=(\S+)", env):
        key = KEY_BY_NAME[var.removeprefix("KVCS_RELAY_").lower()]
        key.parse(value)
    volume = next(rest for op, rest in instr if op == "VOLUME")
    assert "/var/lib/kvcs" in volume and "KVCS_RELAY_DATA_DIR=/var/lib/kvcs" in env
    health = next(rest for op, rest in instr if op == "HEALTHCHECK")
    assert "/healthz" in health and "/healthz" in (ROOT / "relay" / "metrics.py").read_text()
    # production runs on qh3: the image installs the fast extra and selects it
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any("'.[fast]'" in rest for op, rest in instr if op == "RUN") and "fast" in extras
    assert "KVCS_RELAY_QUIC_BACKEND=qh3" in env


ROOT_URL = "moqt://root-kvcs-relay-0.root-kvcs-relay-headless.kvcs.svc.cluster.local:4433/"


def _tree() -> tuple[dict[tuple[str, str], Any], dict[tuple[str, str], Any]]:
    """A two-tier tree as the values file documents it: a root release of 3 replicas with a
    certificate, an edge release of 4 replicas under it, with the token it announces with."""
    root = _render({"replicaCount": 3, "tls": FULL["tls"]}, name="root")
    edge = _render({"replicaCount": 4, "upstream": ["moqt://root-kvcs-relay.kvcs.svc:4433/"],
                    "upstreamToken": "edge-s3cret", "upstreamPush": True}, name="edge")
    for d in root + edge:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    return ({(d["kind"], d["metadata"]["name"]): d for d in root},
            {(d["kind"], d["metadata"]["name"]): d for d in edge})


def _conf(docs: dict[tuple[str, str], Any], name: str) -> dict[str, Any]:
    text = docs["ConfigMap", name]["data"]["relay.toml"]
    conf = tomllib.loads(text)
    assert set(conf) <= set(KEY_BY_NAME)
    for key, raw in conf.items():
        KEY_BY_NAME[key].parse(raw)
    return conf


def test_a_two_tier_tree_renders_with_its_upstream_token_and_announcing() -> None:
    _root, edge = _tree()
    conf = _conf(edge, "edge-kvcs-relay")
    assert conf["upstream"] == ["moqt://root-kvcs-relay.kvcs.svc:4433/"]
    assert conf["upstream_push"] is True and conf["upstream_announce_fields"] == 1
    # the token is a Secret mounted where the configuration points, never in the ConfigMap
    assert "edge-s3cret" not in edge["ConfigMap", "edge-kvcs-relay"]["data"]["relay.toml"]
    secret = edge["Secret", "edge-kvcs-relay-upstream-token"]["stringData"]["upstream.token"]
    assert secret == "edge-s3cret"
    sts = edge["StatefulSet", "edge-kvcs-relay"]
    assert sts["spec"]["replicas"] == 4
    c = sts["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert Path(conf["upstream_token"]).parent == Path(mounts["upstream-token"])
    assert "command" not in c  # an edge tier's replicas all dial the root's Service


def test_a_root_tier_of_several_replicas_links_them_as_peers() -> None:
    root, _edge = _tree()
    conf = _conf(root, "root-kvcs-relay")
    # one list for every replica, its own URL in it (the relay skips it): no single point
    assert conf["upstream"] == [] and conf["peer"] == [ROOT_URL.replace("-0.", f"-{i}.")
                                                      for i in range(3)]
    assert conf["peer_ca"] == "/etc/kvcs/tls/tls.crt" and conf["peer_insecure"] is False
    assert "upstream_ca" not in conf and "peer_token" not in conf  # no tokens: open
    c = root["StatefulSet", "root-kvcs-relay"]["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in c and c["args"] == ["--config", "/etc/kvcs/relay.toml"]
    # unverifiable, several workers, or tokens without the tier's peer token: refused at
    # render time with what to do
    for values, needle in (({}, "tls"), ({"tls": FULL["tls"], "relay": {"workers": 2}},
                                         "one worker per pod"),
                           ({"tls": FULL["tls"], "auth": FULL["auth"]}, "peerToken")):
        with pytest.raises(Exception, match=needle):
            _render({"replicaCount": 2, **values}, name="root")
    assert "peer" not in _conf({(d["kind"], d["metadata"]["name"]): d for d in _render(
        {"replicaCount": 2, "rootReplicas": {"link": False}}, name="root")}, "root-kvcs-relay")


def test_a_root_tier_with_tokens_shares_its_peer_token_through_a_secret() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _render(
        {"replicaCount": 3, "upstreamCASecret": "root-ca", "auth": FULL["auth"],
         "rootReplicas": {"peerToken": "tier-s3cret"}}, name="root")}
    for d in docs.values():
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    conf = _conf(docs, "root-kvcs-relay")
    assert conf["peer_ca"] == "/etc/kvcs/upstream-ca/ca.crt"
    assert "tier-s3cret" not in docs["ConfigMap", "root-kvcs-relay"]["data"]["relay.toml"]
    secret = docs["Secret", "root-kvcs-relay-peer-token"]["stringData"]["peer.token"]
    assert secret == "tier-s3cret"
    c = docs["StatefulSet", "root-kvcs-relay"]["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert Path(conf["peer_token"]).parent == Path(mounts["peer-token"])
    # an edge tier listing every root replica spreads its pods over them
    edge = {(d["kind"], d["metadata"]["name"]): d for d in _render(
        {"upstream": conf["peer"], "upstreamSpread": True})}
    assert _conf(edge, "edge-kvcs-relay")["upstream_spread"] is True
