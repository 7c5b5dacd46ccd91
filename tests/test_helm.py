"""helm/shardstream checked the way a cluster would check it, without a cluster.

Every values file (the defaults and helm/shardstream/ci/*-values.yaml) is rendered and linted with
Helm's own engine (helm-python-sdk), every rendered object is validated strictly against the
Kubernetes schemas of the two newest versions kubernetes-validate ships (the prometheus-operator CRDs
against a vendored subset: tests/support/chart.py), and the invariants operators rely on are asserted.
Then the server container is run as rendered and probed as the kubelet would.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import numpy as np
import pytest
import yaml
from grpc_health.v1 import health_pb2

from shardstream.cli import build_parser
from shardstream.client import Loader
from shardstream.client.checkpoint import Checkpointer

from .support.chart import (
    CHART,
    NAMESPACE,
    VALUES_FILES,
    Rendered,
    cpu_millis,
    flag,
    kube_versions,
    load_values,
    memory_mib,
    probe_grpc,
    render,
    run_rendered,
    selects,
    validate_object,
)
from .support.data import N_ROWS, write_dataset
from .support.servers import unused_port_outside, unused_port_range, wait_for

CASES = {"default": None, **{p.name.removesuffix("-values.yaml"): p for p in VALUES_FILES}}
SERVING = health_pb2.HealthCheckResponse.SERVING


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def values_of(case: str) -> dict[str, Any] | None:
    path = CASES[case]
    return load_values(path) if path else None


@pytest.fixture(scope="module")
def rendered() -> dict[str, Rendered]:
    return {case: render(values_of(case)) for case in CASES}


def merged(case: str) -> dict[str, Any]:
    with helm_python.Chart.load(CHART) as chart:
        return chart.merge_values(values_of(case))


def test_the_scenarios_named_by_the_chart_are_all_there() -> None:
    assert {"minimal", "s3-secret", "disk-cache-hpa", "monitoring", "tls", "checkpoints"} <= set(CASES)


# --- lint and schemas --------------------------------------------------------------------------


@pytest.mark.parametrize("version", kube_versions())
@pytest.mark.parametrize("case", CASES)
def test_lint_is_clean(case: str, version: str) -> None:
    report = helm_python.lint(CHART, values_of(case), strict=True, namespace=NAMESPACE, kube_version=f"v{version}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 = info (e.g. "icon is recommended")
    assert report["total_charts_linted"] == 1
    assert problems == [] and report["errors"] == []


def test_two_kubernetes_versions_are_checked() -> None:
    versions = kube_versions()
    assert len(versions) == 2 and versions[0] != versions[1], versions


@pytest.mark.parametrize("version", kube_versions())
@pytest.mark.parametrize("case", CASES)
def test_every_rendered_object_validates_strictly(rendered: dict[str, Rendered], case: str, version: str) -> None:
    checked = {f"{o['kind']}/{o['metadata']['name']}": validate_object(o, version) for o in rendered[case].objects}
    crds = {k for k, how in checked.items() if not how.startswith("kubernetes")}
    assert crds == {k for k in checked if k.split("/")[0] in ("ServiceMonitor", "PrometheusRule")}


def test_the_validators_refuse_a_misspelt_field(rendered: dict[str, Rendered]) -> None:
    """The checks above can fail: one unknown field in a container, one in a ServiceMonitor."""
    dep = copy.deepcopy(rendered["default"].server)
    dep["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["prot"] = 7070
    with pytest.raises(kubernetes_validate.ValidationError, match="'prot' was unexpected"):
        validate_object(dep, kube_versions()[-1])
    sm = copy.deepcopy(rendered["monitoring"].one("ServiceMonitor"))
    sm["spec"]["endpoints"][0]["intervall"] = "5s"
    with pytest.raises(jsonschema.ValidationError, match="'intervall' was unexpected"):
        validate_object(sm, kube_versions()[-1])


# --- values.yaml, its schema and its documentation ---------------------------------------------

FREE_FORM = {"registry.volume", "resources", "autoscaling.behavior", "redis.resources"}  # Kubernetes types


def leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in FREE_FORM:
            out += leaves(value, path + ".")
        else:
            out.append(path)
    return out


def schema_paths(schema: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        if sub.get("additionalProperties") is False and path not in FREE_FORM:
            out += schema_paths(sub, path + ".")
        else:
            out.append(path)
    return out


def test_every_value_is_documented_and_in_the_schema() -> None:
    text = (CHART / "values.yaml").read_text()
    assert text.startswith("# yaml-language-server: $schema=values.schema.json")
    values = yaml.safe_load(text)
    documented = set(re.findall(r"^\s*## @param (\S+) \S", text, flags=re.M))
    keys = leaves(values)
    assert [k for k in keys if k not in documented] == [], "values without a `## @param` line"
    assert sorted(documented - set(keys)) == [], "`## @param` lines naming no value"
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert sorted(schema_paths(schema)) == sorted(keys)


def test_every_schema_object_refuses_unknown_keys_and_describes_its_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or 'the root'} accepts unknown keys"
            for key, sub in node["properties"].items():
                assert sub.get("description"), f"{path}{key} has no description"
                walk(sub, f"{path}{key}.")

    walk(schema, "")


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c]])
def test_every_values_file_meets_the_schema(case: str) -> None:
    with helm_python.Chart.load(CHART) as chart:
        chart.validate_schema(values_of(case))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": "two"}, r"at '/replicaCount': got string, want integer"),
        ({"replicas": 2}, r"additional properties 'replicas' not allowed"),
        ({"server": {"prot": 7070}}, r"at '/server': additional properties 'prot' not allowed"),
        ({"server": {"port": 70700}}, r"at '/server/port'.*maximum"),
        ({"server": {"dataPort": 70700}}, r"at '/server/dataPort'.*maximum"),
        ({"server": {"dataPort": "7071"}}, r"at '/server/dataPort': got string, want integer"),
        ({"probes": {"mode": "tcp"}}, r"at '/probes/mode'.*'grpc', 'http'"),
        ({"registry": {"root": "datasets"}}, r"at '/registry/root'.*does not match"),
        ({"resources": {"limits": {"memory": "4GB"}}}, r"at '/resources/limits/memory'"),
        ({"diskCache": {"type": "nfs"}}, r"at '/diskCache/type'"),
        ({"serviceMonitor": {"enabled": "yes"}}, r"at '/serviceMonitor/enabled': got string, want boolean"),
        ({"server": {"extraArgs": ["--max-streams", 64]}}, r"at '/server/extraArgs/1': got number, want string"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_bad_values_are_refused_with_the_key_named(values: dict[str, Any], message: str) -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmValuesError, match=message):
        chart.render(values, name="shardstream", namespace=NAMESPACE)
    report = helm_python.lint(CHART, values, strict=True)  # what `helm lint -f` says about the same file
    assert any(re.search(message, e) for e in report["errors"]), report["errors"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"server": {"terminationGracePeriodSeconds": 12}}, r"must exceed .*preStopSleepSeconds \+ server.drainSeconds \(15\)"),
        (
            {"registry": {"volume": {"emptyDir": {}, "nfs": {"server": "n", "path": "/r"}}}},
            r"registry.volume names 2 volume sources \(emptyDir, nfs\): a volume has exactly one",
        ),
        ({"tls": {"enabled": True}}, r"tls.enabled needs tls.existingSecret"),
        ({"tls": {"enabled": True, "existingSecret": "t"}}, r"tls.enabled needs probes.mode=http"),
        ({"tls": {"clientCA": True}}, r"tls.clientCA needs tls.enabled"),
        ({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}}, r"minReplicas \(5\) exceeds"),
        ({"server": {"metricsPort": 7070}}, r"server.port and server.metricsPort are both 7070"),
        ({"server": {"metricsPort": 7072}}, r"server.metricsPort \(7072\) is inside the data ports 7071..7072"),
        ({"server": {"dataPort": 7068, "workers": 4}}, r"server.port \(7070\) is inside the data ports 7068..7071"),
        ({"server": {"dataPort": 65535}}, r"the data ports run past 65535 \(server.dataPort 65535 \+ 2 workers\)"),
        (
            {"resources": {"limits": None}, "networkPolicy": {"enabled": True}},
            r"networkPolicy.enabled needs a known worker count",
        ),
        ({"server": {"pinWorkers": True}, "resources": {"limits": {"cpu": "1500m"}}}, r'server.pinWorkers needs a whole number of cores in resources.limits.cpu \(got "1500m"\)'),
        ({"server": {"pinWorkers": True}, "resources": {"limits": None}}, r'server.pinWorkers needs a whole number of cores .*\(got ""\)'),
        (
            {"checkpoints": {"enabled": True}},
            r"checkpoints.root \(/var/lib/shardstream/checkpoints\) is a local path and checkpoints.volume is empty",
        ),
        (
            {"checkpoints": {"enabled": True, "volume": {"emptyDir": {}, "nfs": {"server": "n", "path": "/c"}}}},
            r"checkpoints.volume names 2 volume sources \(emptyDir, nfs\)",
        ),
        (
            {"checkpoints": {"enabled": True, "root": "s3://ckpt/x", "inflightMib": 32}},
            r"checkpoints.inflightMib \(32\) must hold one chunk: at least checkpoints.maxChunkMib \(64\)",
        ),
        (
            {"checkpoints": {"enabled": True, "root": "/datasets/", "volume": {"emptyDir": {}}}, "registry": {"root": "/datasets"}},
            r"checkpoints.root \(/datasets/\) is also registry.root",
        ),
        (
            {"checkpoints": {"enabled": True, "root": "s3://ckpt/x"}, "server": {"cacheMib": 2048}},
            r"below server.cacheMib \(2048\) \+ .* \+ 2 workers x \(server.workerMemoryMib 512 \+ checkpoints.inflightMib 256\) = 3584 MiB"
            r".* or lower the cache, the buffer or the workers \(or checkpoints.inflightMib\)",
        ),
    ],
    ids=lambda v: str(v)[:40],
)
def test_contradicting_values_fail_the_render_with_what_to_change(values: dict[str, Any], message: str) -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmRenderError, match=message):
        chart.render(values, name="shardstream", namespace=NAMESPACE)


# --- invariants ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_probes_are_on_the_ports_the_server_listens_on(rendered: dict[str, Rendered], case: str) -> None:
    c = rendered[case].container
    args, ports = c["args"], {p["name"]: p["containerPort"] for p in c["ports"]}
    assert int(flag(args, "--port")) == ports["grpc"]
    assert int(flag(args, "--metrics-port")) == ports["metrics"]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c[kind]
        if "grpc" in probe:
            assert probe["grpc"]["port"] == ports["grpc"], kind
        else:  # http mode (TLS): the metrics port's health
            assert merged(case)["probes"]["mode"] == "http"
            assert probe["httpGet"]["port"] == "metrics" and probe["httpGet"]["path"] in ("/healthz", "/readyz")
    if "grpc" in c["readinessProbe"]:
        assert c["readinessProbe"]["grpc"]["service"] == "shardstream.v1.ShardStream"


def data_ports(r: Rendered) -> dict[str, int]:
    """The server container's data ports by name ("data", "data-1", ...)."""
    return {p["name"]: p["containerPort"] for p in r.container["ports"] if p["name"].startswith("data")}


@pytest.mark.parametrize("case", CASES)
def test_every_workers_data_port_is_declared_served_and_opened(rendered: dict[str, Rendered], case: str) -> None:
    """Worker i's Flight data plane listens on --data-port + i: the container declares each of them,
    both Services carry them (the ClusterIP one routes tools' streams; the headless one lists them),
    and the NetworkPolicy opens the whole range to the peers the gRPC port is open to."""
    r, values = rendered[case], merged(case)["server"]
    c = r.container
    first, workers = int(flag(c["args"], "--data-port")), int(flag(c["args"], "--workers"))
    assert first == values["dataPort"]
    expected = {("data" if i == 0 else f"data-{i}"): first + i for i in range(workers)}
    assert data_ports(r) == expected
    numbers = [p["containerPort"] for p in c["ports"]]
    assert len(numbers) == len(set(numbers)), numbers
    assert int(flag(c["args"], "--port")) not in expected.values()
    assert int(flag(c["args"], "--metrics-port")) not in expected.values()
    for svc in r.of_kind("Service"):
        if svc["metadata"]["labels"]["app.kubernetes.io/component"] not in ("server", "server-headless"):
            continue  # Redis
        ports = {p["name"]: p for p in svc["spec"]["ports"]}
        assert {n: ports[n]["port"] for n in expected} == expected, svc["metadata"]["name"]
        assert all(ports[n]["targetPort"] == n for n in expected)
        assert svc["spec"]["ports"][0]["name"] == "grpc", "clients' endpoint: the control port comes first"
    for np_ in r.of_kind("NetworkPolicy"):
        if np_["metadata"]["labels"]["app.kubernetes.io/component"] != "server":
            continue
        (client_rule,) = [rule for rule in np_["spec"]["ingress"] if {"port": "grpc", "protocol": "TCP"} in rule["ports"]]
        (data,) = [p for p in client_rule["ports"] if p["port"] != "grpc"]
        assert (data["port"], data.get("endPort", data["port"])) == (first, first + workers - 1)
        assert client_rule.get("from") == (merged(case)["networkPolicy"]["clients"] or None)


def test_a_pod_without_a_cpu_limit_declares_the_first_data_port() -> None:
    """No CPU limit: the server picks its worker count, so only dataPort is known to the chart."""
    r = render({"resources": {"requests": {"cpu": "1"}, "limits": None}})
    assert flag(r.container["args"], "--workers") is None and data_ports(r) == {"data": 7071}
    assert "7071 + the worker's slot" in r.notes


def test_the_charts_data_port_is_the_servers_default() -> None:
    """server.dataPort (7071) is what `serve --port 7070` picks without --data-port (port + 1)."""
    values = load_values(CHART / "values.yaml")["server"]
    assert serve_config(["serve", "--port", str(values["port"])]).data_port == values["dataPort"]
    assert serve_config(render(None).container["args"]).data_port == values["dataPort"]
    r = render({"server": {"dataPort": 8000, "workers": 3}})
    assert serve_config(r.container["args"]).data_port == 8000
    assert data_ports(r) == {"data": 8000, "data-1": 8001, "data-2": 8002}
    assert "8000..8002 (one per worker)" in r.notes


def test_the_helm_test_pod_checks_both_planes() -> None:
    pod = render({"tests": {"enabled": True}}).one("Pod")
    script = pod["spec"]["containers"][0]["command"][-1]
    assert 'host = "shardstream"' in script and f'{{host}}:{7070}' in script and f"grpc+tcp://{{host}}:{7071}" in script


@pytest.mark.parametrize("case", CASES)
def test_pods_run_unprivileged(rendered: dict[str, Rendered], case: str) -> None:
    for dep in rendered[case].of_kind("Deployment"):
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged")


@pytest.mark.parametrize("case", CASES)
def test_the_grace_period_outlasts_the_drain(rendered: dict[str, Rendered], case: str) -> None:
    pod = rendered[case].server["spec"]["template"]["spec"]
    c = rendered[case].container
    drain = float(flag(c["args"], "--grace"))
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain
    # a liveness probe that fails during the drain must not restart the container before it ends
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > drain


@pytest.mark.parametrize("case", CASES)
def test_workers_and_cache_follow_the_resources(rendered: dict[str, Rendered], case: str) -> None:
    c, values = rendered[case].container, merged(case)["server"]
    limits = c.get("resources", {}).get("limits", {})
    workers, cache = flag(c["args"], "--workers"), flag(c["args"], "--cache-mib")
    if values["workers"]:
        assert workers == str(values["workers"])
    else:  # the rule server/serving/supervisor.py applies to a cgroup quota: ceil(limit)
        assert workers == str(math.ceil(cpu_millis(limits["cpu"]) / 1000))
    if values["cacheMib"]:
        assert cache == str(values["cacheMib"])
    else:  # the memory rule: what the limit leaves after 2 x the stream buffer and the workers
        beside = 2 * values["limits"]["streamBufferMib"] + int(workers) * worker_mib(case)
        assert cache == str(int(memory_mib(limits["memory"])) - beside)
    assert int(cache) < memory_mib(limits["memory"]), "the cache must leave memory for the processes"


def worker_mib(case: str) -> int:
    """The memory rule's MiB a worker: workerMemoryMib, and the chunks of a checkpoint save it may
    hold (--checkpoint-inflight-mib) when the pod serves checkpoints."""
    c, values = render(values_of(case)).container, merged(case)
    inflight = flag(c["args"], "--checkpoint-inflight-mib")
    assert (inflight is not None) == values["checkpoints"]["enabled"]
    return values["server"]["workerMemoryMib"] + int(inflight or 0)


@pytest.mark.parametrize("case", CASES)
def test_the_memory_limit_covers_cache_buffer_and_workers(rendered: dict[str, Rendered], case: str) -> None:
    """deploy/RUNBOOK.md "Memory limit": cache + 2 x stream buffer + workers x workerMemoryMib fits in
    resources.limits.memory, as rendered (the flags the server gets), and the notes print the sum."""
    c = rendered[case].container
    cache, buffer = int(flag(c["args"], "--cache-mib")), int(flag(c["args"], "--stream-buffer-mib"))
    need = cache + 2 * buffer + int(flag(c["args"], "--workers")) * worker_mib(case)
    limit = int(memory_mib(c["resources"]["limits"]["memory"]))
    assert cache >= 256 and need <= limit, (cache, buffer, need, limit)
    assert f"= {need} of the {limit} MiB limit" in rendered[case].notes


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"server": {"cacheMib": 2048}},
            r"resources.limits.memory \(4096 MiB\) is below server.cacheMib \(2048\) \+ 2 x server.limits.streamBufferMib"
            r" \(1024\) \+ 2 workers x server.workerMemoryMib \(512\) = 3072 MiB: .* at least 5120Mi",
        ),
        (
            {"resources": {"limits": {"cpu": "4", "memory": "4Gi"}}},
            r"resources.limits.memory \(4096 MiB\) leaves 0 MiB for the cache after .* = 4096 MiB: raise the limit to at least 4352Mi",
        ),
        (
            {"resources": {"limits": {"cpu": None, "memory": "8Gi"}}},
            r"resources.limits.memory needs a known worker count",
        ),
    ],
    ids=["explicit-cache", "derived-cache", "unknown-workers"],
)
def test_a_memory_limit_too_small_for_the_rule_fails_the_render(values: dict[str, Any], message: str) -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmRenderError, match=message):
        chart.render(values, name="shardstream", namespace=NAMESPACE)
    # the same limit with a smaller buffer fits: the check is the rule, not a fixed minimum
    server = {**values.get("server", {}), "workers": 1, "limits": {"streamBufferMib": 256}}
    assert render({**values, "server": server}).container


def test_workers_follow_millicores_and_fractions() -> None:
    for cpu, workers in [("1500m", "2"), ("0.5", "1"), (3, "3"), ("250m", "1"), ("8", "8")]:
        c = render({"resources": {"limits": {"cpu": cpu, "memory": "16Gi"}}}).container
        assert flag(c["args"], "--workers") == workers, cpu
    c = render({"resources": {"requests": {"cpu": "1"}, "limits": None}}).container
    assert flag(c["args"], "--workers") is None and flag(c["args"], "--cache-mib") is None


@pytest.mark.parametrize("case", CASES)
def test_selectors_match_their_pods_only(rendered: dict[str, Rendered], case: str) -> None:
    r = rendered[case]
    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in r.of_kind("Deployment")}
    server = r.server["metadata"]["name"]
    for d in r.of_kind("Deployment"):
        assert selects(d["spec"]["selector"]["matchLabels"], pods[d["metadata"]["name"]])
    for svc in r.of_kind("Service"):
        matched = [name for name, labels in pods.items() if selects(svc["spec"]["selector"], labels)]
        assert len(matched) == 1, (svc["metadata"]["name"], matched)
        (dep,) = [d for d in r.of_kind("Deployment") if d["metadata"]["name"] == matched[0]]
        named = {p["name"] for c in dep["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= named
    headless = [s for s in r.of_kind("Service") if s["spec"].get("clusterIP") == "None"]
    assert [s["metadata"]["name"] for s in headless] == [f"{server}-headless"]
    for pdb in r.of_kind("PodDisruptionBudget"):
        assert [n for n, labels in pods.items() if selects(pdb["spec"]["selector"]["matchLabels"], labels)] == [server]
    for tsc in r.server["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
        assert selects(tsc["labelSelector"]["matchLabels"], pods[server])
    for np_ in r.of_kind("NetworkPolicy"):
        assert len([n for n, labels in pods.items() if selects(np_["spec"]["podSelector"]["matchLabels"], labels)]) == 1
    for hpa in r.of_kind("HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": server}
        assert "replicas" not in r.server["spec"], "the HPA owns the replica count"
    for sm in r.of_kind("ServiceMonitor"):
        scraped = [s for s in r.of_kind("Service") if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert [s["metadata"]["name"] for s in scraped] == [server], "each pod scraped once, through one Service"
        ports = {p["name"]: p for p in scraped[0]["spec"]["ports"]}
        assert all(e["port"] in ports for e in sm["spec"]["endpoints"])
        assert ports["metrics"]["port"] == int(flag(r.container["args"], "--metrics-port"))


@pytest.mark.parametrize("case", CASES)
def test_mounts_paths_and_secrets_line_up(rendered: dict[str, Rendered], case: str) -> None:
    pod, c, values = rendered[case].server["spec"]["template"]["spec"], rendered[case].container, merged(case)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert {m["name"] for m in c["volumeMounts"]} <= set(volumes)
    assert all(len(set(v) - {"name"}) == 1 for v in volumes.values()), "a volume has exactly one source"
    assert "/tmp" in mounts, "the root filesystem is read-only: /tmp is an emptyDir"
    root = flag(c["args"], "--root")
    assert root == values["registry"]["root"]
    if not root.startswith("s3://"):
        assert mounts[root]["readOnly"] is True
    checkpoints = flag(c["args"], "--checkpoint-root")
    assert (checkpoints is not None) == values["checkpoints"]["enabled"]
    if checkpoints is not None and not checkpoints.startswith("s3://"):  # written, on the shared volume
        assert not mounts[checkpoints].get("readOnly") and mounts[checkpoints]["name"] == "checkpoints"
        assert volumes["checkpoints"] == {"name": "checkpoints", **values["checkpoints"]["volume"]}
    for name in ("--cache-dir", "--tls-cert", "--tls-key", "--tls-client-ca", "--auth"):
        path = flag(c["args"], name)
        if path is not None:
            assert any(path == p or path.startswith(p + "/") for p in mounts), f"{name} {path} is on no volume"
    if values["diskCache"]["enabled"] and values["diskCache"]["type"] == "emptyDir":
        limit = volumes["disk-cache"]["emptyDir"]["sizeLimit"]
        assert memory_mib(limit) > int(flag(c["args"], "--cache-dir-mib")), "the tier's bound must fit its volume"
    env = {e["name"]: e for e in c["env"]}
    if values["s3"]["existingSecret"]:
        for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[var]["valueFrom"]["secretKeyRef"]["name"] == values["s3"]["existingSecret"]
    for v in volumes.values():
        if "secret" in v:
            assert v["secret"]["secretName"] in (values["tls"]["existingSecret"], values["auth"]["existingSecret"])


@pytest.mark.parametrize("case", CASES)
def test_objects_carry_the_release_labels_and_short_names(rendered: dict[str, Rendered], case: str) -> None:
    for o in rendered[case].objects:
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "shardstream" and labels["app.kubernetes.io/name"] == "shardstream"
        assert len(o["metadata"]["name"]) <= 63


def test_long_release_names_keep_object_names_within_63_characters() -> None:
    values = {"redis": {"enabled": True}, "networkPolicy": {"enabled": True}, "tests": {"enabled": True}}
    names = {(o["kind"], o["metadata"]["name"]) for o in render(values, release="r" * 53).objects}
    assert len(names) == 10 and all(len(n) <= 63 for _, n in names), sorted(names)
    assert len({n for k, n in names if k == "Service"}) == 3, "the Services' names stay distinct"


@pytest.mark.parametrize("case", CASES)
def test_notes_print_the_client_endpoint_of_the_headless_service(rendered: dict[str, Rendered], case: str) -> None:
    r = rendered[case]
    (headless,) = [s for s in r.of_kind("Service") if s["spec"].get("clusterIP") == "None"]
    port = headless["spec"]["ports"][0]["port"]
    assert f"dns:///{headless['metadata']['name']}.{NAMESPACE}.svc:{port}" in r.notes


def test_the_default_install_needs_nothing_the_chart_does_not_create(rendered: dict[str, Rendered]) -> None:
    """`helm install` with no values schedules on a plain cluster: the only volumes are emptyDirs (no
    claim, Secret or host path someone must make first), and the notes say the registry is empty and
    what to set instead."""
    r = rendered["default"]
    for dep in r.of_kind("Deployment"):
        for volume in dep["spec"]["template"]["spec"]["volumes"]:
            assert set(volume) == {"name", "emptyDir"}, volume
    assert r.container["resources"]["requests"]["memory"] == r.container["resources"]["limits"]["memory"]
    assert "the registry is an empty emptyDir" in r.notes
    assert "--set registry.root=s3://BUCKET/PREFIX --set s3.existingSecret=SECRET" in r.notes
    assert "ReadOnlyMany or ReadWriteMany" in r.notes
    unset = render({"registry": {"volume": None}})  # `--set registry.volume=null`: the same demo volume
    assert {"name": "registry", "emptyDir": {}} in unset.server["spec"]["template"]["spec"]["volumes"]
    assert "the registry is an empty emptyDir" in unset.notes


@pytest.mark.parametrize(("replicas", "access_mode_named"), [(1, False), (3, True)])
def test_notes_name_the_claims_access_mode_when_replicas_share_it(replicas: int, access_mode_named: bool) -> None:
    volume = {"persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}}
    r = render({"replicaCount": replicas, "registry": {"volume": volume}})
    (registry,) = [v for v in r.server["spec"]["template"]["spec"]["volumes"] if v["name"] == "registry"]
    assert registry == {"name": "registry", **volume}, "the claim alone: no default merged in"
    assert "The registry is the PersistentVolumeClaim datasets, which must exist in ml" in r.notes
    assert ("ReadOnlyMany or ReadWriteMany" in r.notes) is access_mode_named
    assert "empty emptyDir" not in r.notes
    s3 = render({"registry": {"root": "s3://bucket/registry"}})
    assert "emptyDir" not in s3.notes and "PersistentVolumeClaim" not in s3.notes


def test_the_default_endpoint_is_the_one_the_readme_gives(rendered: dict[str, Rendered]) -> None:
    assert "dns:///shardstream-headless.ml.svc:7070" in rendered["default"].notes
    readme = (CHART.parents[1] / "README.md").read_text()
    assert "helm install shardstream helm/shardstream" in readme
    assert "dns:///shardstream-headless.NS.svc:7070" in readme


def test_extra_args_and_env_come_after_the_charts_own() -> None:
    values = {"server": {"extraArgs": ["--max-streams", "64"], "extraEnv": [{"name": "A", "value": "1"}]}}
    c = render(values).container
    assert c["args"][-2:] == ["--max-streams", "64"] and c["args"][0] == "serve"
    assert c["env"][-1] == {"name": "A", "value": "1"}


@pytest.mark.parametrize("case", CASES)
def test_every_rendered_flag_is_one_serve_accepts(rendered: dict[str, Rendered], case: str) -> None:
    args = rendered[case].container["args"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(args)  # flags and the types of their values
            return
        except SystemExit:
            pass
    pytest.fail(f"`shardstream {' '.join(args)}` is refused: {err.getvalue()}")


LIMITS = (
    "max_batch_size",
    "max_message_bytes",
    "max_sample_bytes",
    "max_streams",
    "max_streams_per_peer",
    "stream_buffer_bytes",
    "write_timeout_s",
    "keepalive_time_s",
    "keepalive_timeout_s",
    "max_connection_idle_s",
)


def serve_config(argv: list[str]) -> Any:
    """The ServerConfig `shardstream ARGV` (a serve command line) asks for."""
    from shardstream.cli.common import apply_global_options
    from shardstream.cli.serve import config_from_args

    parser = build_parser()
    args = parser.parse_args(argv)
    apply_global_options(parser, args)
    return config_from_args(args)


def test_the_charts_limits_default_to_the_servers_and_reach_its_flags() -> None:
    chart, server = serve_config(render(None).container["args"]), serve_config(["serve"])
    assert {k: getattr(chart, k) for k in LIMITS} == {k: getattr(server, k) for k in LIMITS}
    assert not chart.reflection
    values = {"server": {"reflection": True, "limits": {"maxStreams": 2_000_000, "writeTimeoutSeconds": 12.5}}}
    changed = serve_config(render(values).container["args"])
    assert (changed.max_streams, changed.write_timeout_s, changed.reflection) == (2_000_000, 12.5, True)


def test_the_charts_checkpoint_limits_default_to_the_servers_and_reach_its_flags() -> None:
    assert serve_config(render(None).container["args"]).checkpoint_root is None  # off unless enabled
    on = {"checkpoints": {"enabled": True, "root": "s3://ckpt/jobs"}}
    chart, server = serve_config(render(on).container["args"]), serve_config(["serve", "--checkpoint-root", "s3://ckpt/jobs"])
    # the chart's inflight bound is half the server's: the default pod's memory rule leaves a cache
    assert chart.checkpoint_root == "s3://ckpt/jobs"
    half = replace(server.checkpoint_limits, inflight_job_bytes=256 << 20, inflight_principal_bytes=512 << 20)
    assert chart.checkpoint_limits == half
    on["checkpoints"] |= {"maxChunkMib": 16, "maxRecordMib": 8, "inflightMib": 128, "jobQuotaGib": 1.5}
    limits = serve_config(render(on).container["args"]).checkpoint_limits
    assert (limits.max_chunk_bytes, limits.max_record_bytes, limits.inflight_job_bytes, limits.job_quota_bytes) == (
        16 << 20, 8 << 20, 128 << 20, 3 << 29,
    )


# --- run what the chart renders -------------------------------------------------------------------


@pytest.mark.parametrize("case", ["default", "minimal", "monitoring"])
def test_the_rendered_server_serves_an_epoch_as_the_kubelet_sees_it(case: str, tmp_path: Path) -> None:
    """The Deployment's container as rendered (ports moved to free ones through the chart's own
    values: control, metrics, and one data port per worker), on a local registry: the kubelet's
    probes pass, a Loader reads an epoch exactly once through the NOTES endpoint (its streams over
    the workers' Flight data ports), the `helm test` pod's script passes against it, /metrics counts
    the epoch, and SIGTERM drains within the grace period."""
    values = values_of(case) or {}
    workers = int(flag(render(values).container["args"], "--workers"))
    data_port = unused_port_range(workers)  # worker i's Flight data plane on data_port + i
    port, metrics_port = unused_port_outside(data_port, workers), unused_port_outside(data_port, workers)
    values["server"] = {**values.get("server", {}), "port": port, "metricsPort": metrics_port, "dataPort": data_port}
    values["tests"] = {"enabled": True}
    r = render(values)
    registry = tmp_path / "registry"
    write_dataset(registry, "toy", N_ROWS)
    c = r.container
    with run_rendered(r, {"registry": registry}, tmp_path) as server:
        startup = c["startupProbe"]
        budget_s = startup["periodSeconds"] * startup["failureThreshold"]  # what the kubelet allows
        wait_for(lambda: probe_grpc(startup["grpc"]["port"], startup) == SERVING, "the startup probe", budget_s)
        for kind in ("readinessProbe", "livenessProbe"):
            assert probe_grpc(c[kind]["grpc"]["port"], c[kind]) == SERVING, kind
        # The probes pass once one worker serves (the workers share the control port); `helm test`
        # runs after the rollout, when every worker listens on its data port.
        wait_for(lambda: all(listening(data_port + i) for i in range(workers)), "every worker's data port", budget_s)
        endpoint = re.search(r"endpoint: (dns:///\S+)", r.notes)[1]  # type: ignore[index]
        endpoint = re.sub(r"///[^:]+", "///127.0.0.1", endpoint)  # the Service's DNS name is loopback here
        seen = []
        for rank in range(2):
            with Loader(endpoint, "toy@1", batch_size=16, rank=rank, world_size=2, seed=3, epochs=1) as ld:
                seen += [int(i) for b in ld for i in np.asarray(b["id"])]
        assert sorted(seen) == list(range(N_ROWS))
        # `helm test`'s pod: health on the control port, the Flight data plane on the first data port
        script = r.one("Pod")["spec"]["containers"][0]["command"][-1]
        fullname = r.server["metadata"]["name"]
        script = script.replace(f'host = "{fullname}"', 'host = "127.0.0.1"')
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "SERVING" in done.stdout, done.stdout + done.stderr
        assert "data plane answered" in done.stdout, done.stdout
        # counted once each write completes, which may be just after the client has the rows
        rows = lambda: server.metrics(metrics_port)["shardstream_rows_sent_total"]  # noqa: E731
        wait_for(lambda: rows() >= N_ROWS, "/metrics to count the epoch's rows", 30)
        assert rows() == N_ROWS
        if flag(server.argv, "--cache-dir"):
            assert any(Path(flag(server.argv, "--cache-dir")).rglob("*")), "the disk tier wrote nothing"
        # the kubelet's SIGTERM goes to the container's main process (the supervisor), not the group
        server.proc.send_signal(signal.SIGTERM)
        grace_s = r.server["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        try:
            code = server.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {grace_s} s after SIGTERM: the kubelet would SIGKILL it; {server.log.read_text()}")
        assert code == 0, server.log.read_text()


def test_the_rendered_server_keeps_checkpoints_on_the_shared_volume(tmp_path: Path) -> None:
    """The checkpoints case's container as rendered: a Checkpointer through the NOTES endpoint saves
    and loads a state, and what it saved lies on the claim's volume (where every replica finds it),
    not in the pod."""
    values = values_of("checkpoints") or {}
    workers = int(flag(render(values).container["args"], "--workers"))
    data_port = unused_port_range(workers)
    port, metrics_port = unused_port_outside(data_port, workers), unused_port_outside(data_port, workers)
    values["server"] = {**values.get("server", {}), "port": port, "metricsPort": metrics_port, "dataPort": data_port}
    r = render(values)
    claim = tmp_path / "claim"
    c = r.container
    assert "--pin-workers" in c["args"]  # the case's Guaranteed pod: a core per worker (2 here)
    with run_rendered(r, {"checkpoints": claim}, tmp_path) as server:
        startup = c["startupProbe"]
        budget_s = startup["periodSeconds"] * startup["failureThreshold"]
        wait_for(lambda: probe_grpc(port, startup) == SERVING, "the startup probe", budget_s)
        wait_for(lambda: all(listening(data_port + i) for i in range(workers)), "every worker's data port", budget_s)
        endpoint = re.search(r'Checkpointer\("(dns:///\S+)"', r.notes)[1]  # type: ignore[index]
        endpoint = re.sub(r"///[^:]+", "///127.0.0.1", endpoint)
        state = {"w": np.arange(300_000, dtype=np.float32), "step": 7}
        with Checkpointer(endpoint, job="helm-run", chunk_bytes=64 << 10, rank=0, world_size=1) as ck:
            ck.save(7, state, blocking=True)
            loaded = ck.load(7, verify=True)
            assert np.array_equal(loaded["w"], state["w"]) and loaded["step"] == 7 and ck.steps() == [7]
        stored = [p for p in claim.rglob("*") if p.is_file()]
        assert sum(p.stat().st_size for p in stored) >= state["w"].nbytes, server.log.read_text()
        assert not any((tmp_path / "volumes").rglob("*helm-run*")), "a checkpoint landed outside the claim"


# --- the PrometheusRule's alerts ---------------------------------------------------------------


def rules_of(r: Rendered) -> list[dict[str, Any]]:
    return [rule for group in r.one("PrometheusRule")["spec"]["groups"] for rule in group["rules"]]


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#+ (.+)$", markdown, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_alerts_link_runbook_sections_that_exist(rendered: dict[str, Rendered]) -> None:
    runbook = anchors((CHART.parents[1] / "deploy" / "RUNBOOK.md").read_text())
    groups = rendered["monitoring"].one("PrometheusRule")["spec"]["groups"]
    for group in groups:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue  # a recording rule
            url = rule["annotations"].get("runbook_url")
            if not group["name"].endswith(".extra"):  # the chart's own: summary, runbook and severity
                assert url and rule["annotations"]["summary"] and rule["labels"]["severity"], rule["alert"]
            if url:
                assert url.partition("#")[2] in runbook, (rule["alert"], url)


PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian package prometheus; .ci/run installs it)"
)


@needs_promtool
def test_the_alert_rules_parse(rendered: dict[str, Rendered], tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rendered["monitoring"].one("PrometheusRule")["spec"]))
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_charts_rules_are_the_ones_of_deploy_prometheus(rendered: dict[str, Rendered]) -> None:
    """One set of rules: the chart's copy is byte-identical to deploy/prometheus/rules.yaml, and the
    PrometheusRule renders it with the release's job and namespace on the server selectors and the
    runbook base, plus extraRules in a group of their own."""
    source = (CHART.parents[1] / "deploy" / "prometheus" / "rules.yaml").read_text()
    assert (CHART / "files" / "rules.yaml").read_text() == source, (
        "helm/shardstream/files/rules.yaml differs from deploy/prometheus/rules.yaml: copy it over"
    )
    for case in ("monitoring", "default"):
        values = merged(case)
        if not values["prometheusRule"]["enabled"]:
            assert rendered[case].of_kind("PrometheusRule") == []
            continue
        expected = yaml.safe_load(
            source.replace('job="shardstream"', 'job="shardstream", namespace="ml"').replace(
                "deploy/RUNBOOK.md#", values["prometheusRule"]["runbookUrl"] + "#"
            )
        )["groups"]
        if values["prometheusRule"]["extraRules"]:
            expected.append({"name": "shardstream.extra", "rules": values["prometheusRule"]["extraRules"]})
        assert rendered[case].one("PrometheusRule")["spec"]["groups"] == expected


@needs_promtool
def test_the_rendered_alerts_fire_on_their_faults_and_stay_quiet_otherwise(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    """deploy/prometheus/rules.test.yaml (every alert firing and quiet) against the rendered rules,
    its series labelled as the ServiceMonitor's scrapes label them (namespace too)."""
    spec = rendered["monitoring"].one("PrometheusRule")["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    suite = yaml.safe_load((CHART.parents[1] / "deploy" / "prometheus" / "rules.test.yaml").read_text())

    def namespaced(series: str) -> str:
        return series.replace("{", '{namespace="ml", ', 1)

    for t in suite["tests"]:
        for s in t["input_series"]:
            s["series"] = namespaced(s["series"])
        for a in t.get("alert_rule_test", []):
            for e in a["exp_alerts"]:
                if a["alertname"] != "ShardstreamServersDown":  # absent() keeps no label
                    e["exp_labels"]["namespace"] = "ml"
        for q in t.get("promql_expr_test", []):
            for sample in q["exp_samples"]:
                sample["labels"] = namespaced(sample["labels"])
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(suite))
    done = subprocess.run([PROMTOOL, "test", "rules", "tests.yaml"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
