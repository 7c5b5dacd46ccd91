"""deploy/prometheus and deploy/grafana checked offline: the rules parse and their unit tests pass
(promtool), every alert is tested firing and quiet and carries a summary, a severity and a runbook
link to a heading of deploy/RUNBOOK.md; the dashboards are what their generator writes, importable
(a datasource variable every panel uses) and their queries name only metrics the code exports.
Their expressions are evaluated against a real Prometheus in tests/test_prometheus.py."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PROM = REPO / "deploy" / "prometheus"
GRAFANA = REPO / "deploy" / "grafana"
RULE_FILES = ("rules.yaml", "scaling.yaml")  # each with its promtool unit tests beside it, NAME.test.yaml
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian package prometheus; .ci/run installs it)"
)


def rules() -> list[dict[str, Any]]:
    """Every rule of every rule file."""
    return [r for f in RULE_FILES for g in yaml.safe_load((PROM / f).read_text())["groups"] for r in g["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


@needs_promtool
@pytest.mark.parametrize("name", RULE_FILES)
def test_promtool_checks_the_rules(name: str) -> None:
    done = subprocess.run([PROMTOOL, "check", "rules", str(PROM / name)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
@pytest.mark.parametrize("name", RULE_FILES)
def test_promtool_unit_tests_of_the_rules_pass(name: str) -> None:
    tests = name.replace(".yaml", ".test.yaml")
    done = subprocess.run([PROMTOOL, "test", "rules", tests], capture_output=True, text=True, cwd=PROM)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    suites = [yaml.safe_load((PROM / f.replace(".yaml", ".test.yaml")).read_text()) for f in RULE_FILES]
    fires: set[str] = set()
    quiet: set[str] = set()
    for t in (t for suite in suites for t in suite["tests"]):
        for a in t.get("alert_rule_test", []):
            (fires if a["exp_alerts"] else quiet).add(a["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names == fires == quiet
    # the ones the fleet needs: stall, data loss, errors, cache, cache room, crash loop, admission, down
    assert {
        "ShardstreamDataStall",
        "ShardstreamDataLoss",
        "ShardstreamErrorRatioHigh",
        "ShardstreamCacheHitRatioCollapse",
        "ShardstreamCacheRoomWait",
        "ShardstreamWorkerCrashLoop",
        "ShardstreamStreamsAtAdmissionCap",
        "ShardstreamServersDown",
        "ShardstreamFleetTooSmall",
    } <= names


def test_every_alert_has_a_summary_a_severity_and_a_runbook_heading() -> None:
    heads = re.findall(r"^#+ (.+)$", (REPO / "deploy" / "RUNBOOK.md").read_text(), flags=re.M)
    anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}
    for a in alerts():
        assert a["annotations"]["summary"] and a["labels"]["severity"] in ("critical", "warning", "info"), a[
            "alert"
        ]
        page, _, anchor = a["annotations"]["runbook_url"].partition("#")
        assert page == "deploy/RUNBOOK.md" and anchor in anchors, (a["alert"], anchor)


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("dashboards", GRAFANA / "dashboards.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dashboards_are_what_their_generator_writes() -> None:
    rendered = generator().render()
    assert sorted(rendered) == ["fleet.json", "training.json"]
    for name, text in rendered.items():
        assert (GRAFANA / name).read_text() == text, (
            f"{name} is stale: run python deploy/grafana/dashboards.py"
        )


@pytest.mark.parametrize("name", ["fleet.json", "training.json"])
def test_the_dashboards_are_importable(name: str) -> None:
    d = json.loads((GRAFANA / name).read_text())
    assert d["uid"].startswith("shardstream-") and d["schemaVersion"] >= 36 and "id" not in d
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    assert (set(variables) >= {"datasource", "job", "pod", "dataset"}) or (
        set(variables) >= {"datasource", "job_name", "rank"}
    )
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"]), p[
            "title"
        ]
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]


def test_queries_name_only_metrics_the_code_exports() -> None:
    """Every metric a panel or rule reads is created in the code (or by prometheus-client or Prometheus)."""
    exported: set[str] = {"up"}
    for path in [*(REPO / "server").rglob("*.py"), *(REPO / "client").rglob("*.py")]:
        exported |= set(re.findall(r'"((?:shardstream|grpc_server)_[a-z_]+)"', path.read_text()))
    exported |= {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"}
    texts = [*((PROM / f).read_text() for f in RULE_FILES), *(p.read_text() for p in GRAFANA.glob("*.json"))]
    used = {
        m for t in texts for m in re.findall(r"(?<![:\w])((?:shardstream|grpc_server|process)_[a-z_]+)\b", t)
    }
    recorded = {r["record"] for r in rules() if "record" in r}
    suffixes = ("_bucket", "_sum", "_count")
    missing = {
        m
        for m in used - recorded
        if m not in exported and not any(m.endswith(s) and m[: -len(s)] in exported for s in suffixes)
    }
    assert missing == set() and {"shardstream_build_info", "grpc_server_handled_total"} <= exported


# The services of the RPC metrics: the control plane's, and the data plane's (Read streams are Arrow
# Flight DoGet calls, grpc_type="server_stream").
CONTROL_PLANE, DATA_PLANE = "shardstream.v1.ShardStream", "arrow.flight.protocol.FlightService"


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every rule and every dashboard target."""
    out = [(r.get("record") or r["alert"], str(r["expr"])) for r in rules()]
    for path in sorted(GRAFANA.glob("*.json")):
        d = json.loads(path.read_text())
        out += [(f"{path.name} / {p['title']}", tg["expr"]) for p in d["panels"] for tg in p.get("targets", [])]
    return out


def matches(op: str, value: str, label: str) -> bool:
    """Whether a PromQL label matcher (`=`, `!=`, `=~`, `!~`) accepts `label`."""
    hit = label == value if op in ("=", "!=") else re.fullmatch(value, label) is not None
    return hit if op in ("=", "=~") else not hit


def test_every_rpc_selector_covers_the_flight_data_plane() -> None:
    """A grpc_server_* selector that picks shardstream's service also picks the data plane's DoGet
    (its Read streams): only a selector limited to unary calls (the control-plane latency panel)
    may name the control plane alone. The removed grpcio Read is named nowhere."""
    checked = 0
    for where, expr in expressions():
        assert 'grpc_method="Read"' not in expr, (where, expr)
        for selector in re.findall(r"grpc_server_\w+\{([^}]*)\}", expr):
            found = re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', selector)
            services = [(op, v) for k, op, v in found if k == "grpc_service"]
            if not services:
                continue
            checked += 1
            assert all(matches(op, v, CONTROL_PLANE) for op, v in services), (where, selector)
            unary = ("grpc_type", "=", "unary") in found
            assert unary or all(matches(op, v, DATA_PLANE) for op, v in services), (where, selector)
    assert checked >= 3  # the error ratio (two selectors) and the dashboards' RPC panels


def test_the_error_ratio_counts_data_plane_errors() -> None:
    """The unit tests feed the error ratio DoGet series (not the removed Read's)."""
    text = (PROM / "rules.test.yaml").read_text()
    assert f'grpc_service="{DATA_PLANE}", grpc_method="DoGet"' in text
    assert 'grpc_method="Read"' not in text


def test_ci_installs_prometheus_and_promtool() -> None:
    script = (REPO / ".ci" / "run").read_text()
    assert "promtool" in script and "prometheus" in script


def test_the_dataset_label_is_a_name_from_a_bounded_set() -> None:
    from shardstream.server.policy import dataset_label as dl

    assert dl.dataset_name("web@3") == "web" and dl.dataset_name("web") == "web"
    assert dl.dataset_name("", ["web@3", "code@1"]) == "code+web"  # a mixture: its sources' names
    assert dl.dataset_name("web@3:0.7,code@1:0.3") == "code+web" and dl.dataset_name("../etc") == ""
    saved = set(dl._admitted)
    dl._admitted.clear()
    try:
        assert dl.dataset_label("typo", admit=False) == dl.OTHER  # not planned: never takes a place
        names = [f"ds{i}" for i in range(dl.MAX_DATASET_LABELS + 10)]
        labels = [dl.dataset_label(n, admit=True) for n in names]
        assert labels[: dl.MAX_DATASET_LABELS] == names[: dl.MAX_DATASET_LABELS]
        assert set(labels[dl.MAX_DATASET_LABELS :]) == {dl.OTHER}  # the rest are folded
        assert dl.dataset_label("ds0", admit=False) == "ds0"  # admitted once, named from then on
    finally:
        dl._admitted.clear()
        dl._admitted.update(saved)


def test_client_metrics_go_to_a_trainers_own_registry_with_job_and_rank() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from shardstream.client import metrics

    registry = CollectorRegistry()
    metrics.register(registry)
    metrics.for_rank("run-9", 3).batches.inc()
    text = generate_latest(registry).decode()
    assert 'shardstream_client_batches_total{job_name="run-9",rank="3"} 1.0' in text
    assert 'shardstream_client_failovers_total{job_name="run-9",rank="3"} 0.0' in text  # exported at 0


def test_first_batch_latency_is_one_observation_per_loop_started(endpoints: list[str]) -> None:
    """shardstream_client_first_batch_seconds: iter() (a resume included) to the first batch, once
    per loop; a loop that ends before its first batch observes nothing."""
    from prometheus_client import REGISTRY

    from shardstream.client import Loader

    labels = {"job_name": "first-batch", "rank": "0"}

    def observed() -> tuple[float, float]:
        get = REGISTRY.get_sample_value
        return (
            get("shardstream_client_first_batch_seconds_count", labels) or 0.0,
            get("shardstream_client_first_batch_seconds_sum", labels) or 0.0,
        )

    before = observed()
    with Loader(endpoints, "toy@1", batch_size=100, job="first-batch") as ld:
        assert sum(1 for _ in ld) == 11  # every batch of the epoch: one first batch
        state = ld.state_dict()
    with Loader(endpoints, "toy@1", batch_size=100, job="first-batch", epochs=2) as ld:
        ld.load_state_dict(state)  # a resume: its first batch counts once more
        it = iter(ld)
        next(it)
        next(it)
        it.close()
    count, seconds = observed()
    assert count - before[0] == 2 and seconds > before[1]
