"""The Helm chart (helm/shardstream) rendered offline, its objects, and what a cluster would do with them.

Rendering and linting use helm-python-sdk (Helm's Go engine through its C ABI: no helm binary, no
cluster); objects Kubernetes knows are validated with kubernetes-validate's offline schemas. The
prometheus-operator kinds are CRDs it does not ship: they are checked against MONITORING_V1, a subset
of the operator's monitoring.coreos.com/v1 CRD schemas written here for the fields the chart uses
(additionalProperties false, so a misspelt field fails too).

`run_rendered` is the kubelet's part: the server container's command, args and env exactly as
rendered, with the in-container paths mapped to local directories, run as a real process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import helm_python
import jsonschema
import kubernetes_validate
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from packaging.version import Version

__all__ = [
    "CHART",
    "DOCKERFILE",
    "MONITORING_V1",
    "NAMESPACE",
    "RELEASE",
    "VALUES_FILES",
    "Rendered",
    "RenderedServer",
    "cpu_millis",
    "dockerfile_entrypoint",
    "flag",
    "kube_versions",
    "load_values",
    "memory_mib",
    "probe_grpc",
    "render",
    "run_rendered",
    "selects",
    "validate_object",
]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "shardstream"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE, NAMESPACE = "shardstream", "ml"


def load_values(path: Path) -> dict[str, Any]:
    """A values file parsed by Helm's own YAML reader (as `helm install -f` reads it)."""
    return helm_python.values_from_yaml(path.read_text())


@dataclass
class Rendered:
    """One release rendered: its Kubernetes objects and NOTES.txt."""

    objects: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
        return found[0]

    @property
    def server(self) -> dict[str, Any]:
        """The server Deployment (the one whose pods carry component=server)."""
        deps = [
            d
            for d in self.of_kind("Deployment")
            if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "server"
        ]
        assert len(deps) == 1, [d["metadata"]["name"] for d in self.of_kind("Deployment")]
        return deps[0]

    @property
    def container(self) -> dict[str, Any]:
        (c,) = [c for c in self.server["spec"]["template"]["spec"]["containers"] if c["name"] == "server"]
        return c


def render(values: dict[str, Any] | None = None, release: str = RELEASE) -> Rendered:
    """The chart rendered as `helm install RELEASE helm/shardstream -n ml` with these values."""
    with helm_python.Chart.load(CHART) as chart:
        files = chart.render(values, name=release, namespace=NAMESPACE, is_install=True)
    objects, notes = [], ""
    for name, text in sorted(files.items()):
        if name.endswith("NOTES.txt"):
            notes = text
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return Rendered(objects, notes)


def kube_versions() -> list[str]:
    """The two newest Kubernetes versions kubernetes-validate ships schemas for."""
    versions = sorted(set(kubernetes_validate.utils.all_versions()), key=Version)  # each is listed twice
    return versions[-2:]


def validate_object(obj: dict[str, Any], version: str) -> str:
    """Validate strictly (unknown fields fail); CRD kinds against MONITORING_V1. Returns what checked it."""
    if obj["apiVersion"] == "monitoring.coreos.com/v1":
        jsonschema.Draft7Validator(MONITORING_V1[obj["kind"]]).validate(obj)
        return "vendored monitoring.coreos.com/v1 subset"
    return "kubernetes " + kubernetes_validate.validate(obj, version, strict=True)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """A matchLabels selector (or a Service's selector) matches these labels."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def flag(args: list[str], name: str) -> str | None:
    """The value after `name` in an argv, None when absent."""
    return args[args.index(name) + 1] if name in args else None


def cpu_millis(quantity: str | int | float) -> int:
    """A Kubernetes CPU quantity in millicores ("1500m", "2", 2, "0.5")."""
    q = str(quantity)
    return int(q[:-1]) if q.endswith("m") else round(float(q) * 1000)


def memory_mib(quantity: str) -> float:
    """A Kubernetes memory quantity (Mi, Gi) in MiB."""
    m = re.fullmatch(r"([0-9.]+)(Mi|Gi)", quantity)
    assert m, f"unexpected memory quantity {quantity!r}"
    return float(m[1]) * (1024 if m[2] == "Gi" else 1)


def dockerfile_entrypoint() -> list[str]:
    """The image's ENTRYPOINT (exec form) from deploy/Dockerfile: what runs when a pod sets no command."""
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if ln.startswith("ENTRYPOINT")]
    assert len(lines) == 1, lines
    entrypoint: list[str] = json.loads(lines[0].split(None, 1)[1])
    return entrypoint


def probe_grpc(port: int, probe: dict[str, Any]) -> int:
    """One gRPC probe as the kubelet sends it: Health/Check for probe.grpc.service (default "") on
    the pod's address with the probe's timeout. Returns the status (SERVING = success)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=probe.get("timeoutSeconds", 1))
        except grpc.RpcError:
            return health_pb2.HealthCheckResponse.UNKNOWN
        return reply.status


@dataclass
class RenderedServer:
    """The rendered server container running here."""

    proc: subprocess.Popen[bytes]
    argv: list[str]
    env: dict[str, str]
    mounts: dict[str, Path]  # mountPath in the pod -> the local directory standing in for it
    log: Path

    def metrics(self, port: int) -> dict[str, float]:
        """/metrics on the metrics port as {'name{labels}': value}, and {'name': sum} of labelled ones."""
        out: dict[str, float] = {}
        sums: dict[str, float] = {}
        for line in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
                if "{" in key:
                    sums[key.partition("{")[0]] = sums.get(key.partition("{")[0], 0.0) + float(value)
        return {**sums, **out}


@contextmanager
def run_rendered(rendered: Rendered, volumes: dict[str, Path], workdir: Path) -> Iterator[RenderedServer]:
    """Run the server container's command (or the image's ENTRYPOINT), args and env as rendered.

    Substitutions, each for something only a pod has: every volumeMount's path becomes a local
    directory (`volumes[name]`, else a fresh one under `workdir`); the image's `shardstream` becomes
    this environment's; the pod-IP bind 0.0.0.0 becomes loopback. Own process group, killed at exit.
    """
    c = rendered.container
    mounts = {}
    for m in c.get("volumeMounts", []):
        local = volumes.get(m["name"]) or workdir / "volumes" / m["name"]
        local.mkdir(parents=True, exist_ok=True)
        mounts[m["mountPath"]] = local

    def local(arg: str) -> str:
        for path, there in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if arg == path or arg.startswith(path + "/"):
                return str(there) + arg[len(path) :]
        return "127.0.0.1" if arg == "0.0.0.0" else arg

    argv = [local(a) for a in [*(c.get("command") or dockerfile_entrypoint()), *c.get("args", [])]]
    assert argv[0] == "shardstream", f"the container runs {argv[0]!r}, not the image's shardstream"
    argv[0] = str(Path(sys.executable).with_name("shardstream"))
    unresolved = [e["name"] for e in c.get("env", []) if "value" not in e]
    assert not unresolved, f"env from Secrets/fields cannot be resolved without a cluster: {unresolved}"
    env = {**os.environ, **{e["name"]: local(e["value"]) for e in c.get("env", [])}}
    log = workdir / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield RenderedServer(proc, argv, env, mounts, log)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _strict(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": props, "required": required or []}


_STR = {"type": "string"}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = _strict({"name": _STR, "namespace": _STR, "labels": _LABELS, "annotations": _LABELS}, ["name"])
_DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_RULE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "alert": _STR,
        "record": _STR,
        "expr": {"type": "string", "minLength": 1},
        "for": _DURATION,
        "keep_firing_for": _DURATION,
        "labels": _LABELS,
        "annotations": _LABELS,
    },
    "required": ["expr"],
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
}

MONITORING_V1: dict[str, dict[str, Any]] = {
    # Subsets of prometheus-operator's CRDs (monitoring.coreos.com/v1) for the fields the chart sets.
    "ServiceMonitor": _strict(
        {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "ServiceMonitor"},
            "metadata": _METADATA,
            "spec": _strict(
                {
                    "selector": _strict({"matchLabels": _LABELS}, ["matchLabels"]),
                    "namespaceSelector": _strict({"matchNames": {"type": "array", "items": _STR, "minItems": 1}}),
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": _strict(
                            {
                                "port": _STR,
                                "path": {"type": "string", "pattern": "^/"},
                                "scheme": {"enum": ["http", "https"]},
                                "interval": _DURATION,
                            },
                            ["port"],
                        ),
                    },
                },
                ["selector", "endpoints"],
            ),
        },
        ["apiVersion", "kind", "metadata", "spec"],
    ),
    "PrometheusRule": _strict(
        {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": _METADATA,
            "spec": _strict(
                {
                    "groups": {
                        "type": "array",
                        "minItems": 1,
                        "items": _strict(
                            {"name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                             "rules": {"type": "array", "minItems": 1, "items": _RULE}},
                            ["name", "rules"],
                        ),
                    }
                },
                ["groups"],
            ),
        },
        ["apiVersion", "kind", "metadata", "spec"],
    ),
}

