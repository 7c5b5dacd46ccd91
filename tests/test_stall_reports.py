"""Stall-driven scaling (DESIGN §11): Loaders report their wait for data and consumption to the server
they read from (a "loader.report" DoAction on the data port), the server exports them per job with its
own throughput, deploy/prometheus/scaling.yaml records `shardstream_fleet_desired_servers` on a real
Prometheus, and `shardstream fleet recommend` prints the number. Real server processes throughout;
every wait is on a condition with a deadline, and the trainers' loops count batches, not time.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
import yaml

from shardstream.cli import main as cli_main
from shardstream.cli.fleet_command import parse_metrics, recommend
from shardstream.client import Loader
from shardstream.errors import InvalidArgumentError, ShardstreamError, UnauthenticatedError, from_flight_error
from shardstream.server.local_fleet import LocalServer
from shardstream.server.serving import job_reports as jr

from .support.servers import Servers, scrape, unused_port, wait_for

REPO = Path(__file__).resolve().parents[1]
SCALING = REPO / "deploy" / "prometheus" / "scaling.yaml"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
TOKEN = "stall-token"


def _loaders(server: LocalServer, job: str, ranks: int = 2, **options: Any) -> list[Loader]:
    return [
        Loader([server.target], "toy@1", batch_size=8, rank=r, world_size=ranks, job=job, epochs=None, cursor_store="memory://",
               report_interval_s=0.2, **options)
        for r in range(ranks)
    ]  # fmt: skip


def _read_until(loaders: list[Loader], done: Any, what: str, batches: int = 200_000) -> None:
    """Take batches from every loader in turn (a training loop with no compute: it mostly waits for
    data) until `done()`, checked every 20 batches; fails after `batches`."""
    iters = [iter(ld) for ld in loaders]
    for i in itertools.count():
        for it in iters:
            next(it)
        if i % 20 == 19 and done():
            return
        assert i < batches, f"{what}: not after {batches} batches"


def _job_series(server: LocalServer, job: str) -> tuple[float, float, float]:
    m = scrape(server)
    label = f'{{job_name="{job}"}}'
    return (
        m.get(f"shardstream_job_data_stall_ratio{label}", -1.0),
        m.get(f"shardstream_job_consumption_samples_per_second{label}", -1.0),
        m.get(f"shardstream_job_reporting_ranks{label}", 0.0),
    )


@pytest.fixture(scope="module")
def server(data_root: Path) -> Iterator[LocalServer]:
    with Servers(data_root) as servers:
        yield servers.start(metrics=True)


# --- 1. Loaders report; the server exports the job's stall and rate -------------------------------------
def test_two_ranks_report_and_the_server_exports_the_jobs_stall_and_rate(server: LocalServer) -> None:
    loaders = _loaders(server, "stall-a")
    try:
        _read_until(loaders, lambda: _job_series(server, "stall-a")[2] == 2, "both ranks' reports")
    finally:
        for ld in loaders:
            ld.close()
    stall, rate, ranks = _job_series(server, "stall-a")
    assert ranks == 2
    assert 0 < stall <= 1  # the loop does no work: it waits for data most of the time
    assert rate > 0
    m = scrape(server)
    assert m["shardstream_server_samples_per_second"] > 0
    ok = 'grpc_server_handled_total{grpc_code="OK",grpc_method="DoAction",grpc_service="arrow.flight.protocol.FlightService",grpc_type="server_stream"}'
    assert m[ok] >= 2  # the reports are data-plane calls, counted as any


def test_report_interval_0_sends_nothing(server: LocalServer) -> None:
    loaders = _loaders(server, "stall-off", ranks=1)
    ld = Loader([server.target], "toy@1", batch_size=8, job="stall-off", epochs=None, report_interval_s=0, cursor_store="memory://")
    loaders[0].close()
    try:
        for _, _ in zip(range(300), ld, strict=False):
            pass
    finally:
        ld.close()
    assert _job_series(server, "stall-off")[2] == 0


def test_a_bad_report_interval_is_one_line() -> None:
    for bad in (-1, "5", float("inf"), True):
        with pytest.raises(InvalidArgumentError, match="report_interval_s must be"):
            Loader(["127.0.0.1:1"], "toy@1", batch_size=8, report_interval_s=bad)


# --- 2. bad, oversized and unauthenticated reports are refused --------------------------------------
def _report(port: int, body: bytes, token: str | None = None) -> ShardstreamError | None:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    with flight.connect(f"grpc+tcp://127.0.0.1:{port}") as client:
        try:
            list(client.do_action(flight.Action(jr.REPORT_ACTION, body), flight.FlightCallOptions(headers=headers, timeout=30)))
        except (flight.FlightError, pa.ArrowException) as exc:
            return from_flight_error(exc)
    return None


GOOD = {"job": "j", "rank": 0, "window_s": 10.0, "wait_s": 1.0, "samples": 100}


@pytest.mark.parametrize(
    "body, says",
    [
        (b"not json", "JSON object"),
        (b"[1]", "JSON object"),
        (json.dumps({**GOOD, "job": "../x"}).encode(), "invalid job"),
        (json.dumps({**GOOD, "rank": -1}).encode(), "rank must be"),
        (json.dumps({**GOOD, "rank": True}).encode(), "rank must be"),
        (json.dumps({**GOOD, "wait_s": 11.0}).encode(), "wait_s must be"),
        (json.dumps({**GOOD, "window_s": 0}).encode(), "window_s must be"),
        (json.dumps({**GOOD, "samples": "many"}).encode(), "samples must be"),
        (json.dumps({**GOOD, "worker": -1}).encode(), "worker must be"),
        (json.dumps({**GOOD, "pad": "x" * 2000}).encode(), "over 1024"),
    ],
)
def test_a_bad_report_is_invalid_argument_naming_what(server: LocalServer, body: bytes, says: str) -> None:
    err = _report(server.data_port, body)
    assert isinstance(err, InvalidArgumentError), err
    assert says in str(err) and "\n" not in str(err), err


def test_reports_need_the_data_ports_credentials(data_root: Path, tmp_path: Path) -> None:
    from shardstream.server.policy.auth import token_sha256

    auth = tmp_path / "auth.yaml"
    auth.write_text(f'principals:\n  - name: trainer\n    token_sha256: "{token_sha256(TOKEN)}"\n    datasets: ["*"]\n')
    with Servers(data_root) as servers:
        s = servers.start(metrics=True, extra_args=("--auth", str(auth)))
        good = json.dumps({**GOOD, "job": "authed"}).encode()
        for token in (None, "wrong"):
            for body in (good, b"x" * 100_000):  # a caller without credentials: refused before its body counts
                assert isinstance(_report(s.data_port, body, token), UnauthenticatedError)
        assert _job_series(s, "authed")[2] == 0
        assert _report(s.data_port, good, TOKEN) is None
        assert _job_series(s, "authed")[2] == 1
        # a Loader with the token reports through its own connection
        ld = Loader([s.target], "toy@1", batch_size=8, job="authed-loader", epochs=None, report_interval_s=0.2, token=TOKEN,
                    cursor_store="memory://")
        try:
            _read_until([ld], lambda: _job_series(s, "authed-loader")[2] == 1, "the Loader's report with a token")
        finally:
            ld.close()


# --- 3. the bounds: expiry, jobs tracked --------------------------------------------------------------
def test_reports_expire_after_three_windows_and_jobs_are_bounded() -> None:
    now = [1000.0]
    reports = jr.JobReports(clock=lambda: now[0])

    def body(job: str, rank: int, wait: float = 1.0) -> bytes:
        return json.dumps({"job": job, "rank": rank, "window_s": 10.0, "wait_s": wait, "samples": 50}).encode()

    reports.report(body("e", 0, 1.0))
    reports.report(body("e", 1, 3.0))
    assert jr.STALL.labels("e")._value.get() == pytest.approx(0.2)  # mean of 0.1 and 0.3
    assert jr.CONSUMPTION.labels("e")._value.get() == pytest.approx(10.0)  # 2 x 50 / 10 s
    now[0] += 25
    reports.report(body("e", 1, 5.0))
    now[0] += 6  # rank 0's report is 31 s old: over 3 windows of 10 s
    reports.sweep()
    assert set(reports.jobs()["e"]) == {(1, 0)}  # (rank, DataLoader worker)
    assert jr.STALL.labels("e")._value.get() == pytest.approx(0.5)
    now[0] += 31
    reports.sweep()
    assert "e" not in reports.jobs()
    assert not any(s.labels.get("job_name") == "e" for m in jr.STALL.collect() for s in m.samples)
    # two DataLoader workers of one rank are two readers: their samples add up, the rank counts once
    reports.report(json.dumps({"job": "w", "rank": 0, "worker": 0, "window_s": 10.0, "wait_s": 0.0, "samples": 30}).encode())
    reports.report(json.dumps({"job": "w", "rank": 0, "worker": 1, "window_s": 10.0, "wait_s": 0.0, "samples": 50}).encode())
    assert jr.CONSUMPTION.labels("w")._value.get() == pytest.approx(8.0)
    assert jr.RANKS.labels("w")._value.get() == 1
    for i in range(jr.MAX_JOBS + 5):  # the least recently reported job goes for a new one
        reports.report(body(f"job-{i}", 0))
    assert len(reports.jobs()) == jr.MAX_JOBS
    assert "job-0" not in reports.jobs() and f"job-{jr.MAX_JOBS + 4}" in reports.jobs()


# --- 4. the recommendation ----------------------------------------------------------------------------
def test_recommend_is_consumption_over_throughput_plus_one_while_stalled() -> None:
    calm = {"throughput": 100.0, "jobs": {"a": (0.01, 150.0, 2)}}
    assert recommend([calm]).servers == 2
    stalled = {"throughput": 100.0, "jobs": {"a": (0.5, 150.0, 2)}}
    r = recommend([stalled, {"throughput": 100.0, "jobs": {}}])
    assert (r.servers, r.now, r.stall, r.ranks) == (3, 2, 0.5, 2)
    assert recommend([{"throughput": 0.0, "jobs": {}}]).servers == 1


def test_fleet_recommend_prints_the_number_and_why(server: LocalServer, capsys: pytest.CaptureFixture[str]) -> None:
    loaders = _loaders(server, "stall-cli")
    try:
        _read_until(loaders, lambda: _job_series(server, "stall-cli")[2] == 2, "both ranks' reports")
        expected = recommend([parse_metrics(_metrics_text(server))])
        assert cli_main(["fleet", "recommend", "--server", f"127.0.0.1:{server.metrics_port}"]) == 0
    finally:
        for ld in loaders:
            ld.close()
    out = capsys.readouterr().out
    assert out.startswith("recommended servers: ") and "(asked: 1)" in out, out
    assert "consumption" in out and "throughput" in out and "stall" in out, out
    assert "rank(s) of" in out
    assert expected.servers >= 1
    assert cli_main(["fleet", "recommend", "--server", f"127.0.0.1:{server.metrics_port}", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["now"] == 1 and answer["servers"] >= 1
    # a wrong port is one line
    assert cli_main(["fleet", "recommend", "--server", f"127.0.0.1:{server.port}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardstream: error: ") and err.count("\n") == 1, err


def _metrics_text(server: LocalServer) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()


# --- 5. the recording rule on a real Prometheus --------------------------------------------------------
def test_promtool_checks_the_scaling_rules() -> None:
    if PROMTOOL is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    done = subprocess.run([PROMTOOL, "check", "rules", str(SCALING)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    answer = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert answer["status"] == "success", answer
    return answer["data"]["result"]  # type: ignore[no-any-return]


def _value(base: str, promql: str) -> float | None:
    result = _query(base, promql)
    return float(result[0]["value"][1]) if result else None


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian package prometheus)")
def test_the_desired_servers_rule_on_a_real_prometheus(data_root: Path, tmp_path: Path) -> None:
    """One server, two ranks whose loops do no work (they wait for data: stalled): the fleet's
    desired size is ceil(consumption / capacity) + 1, recorded with its pieces."""
    with Servers(data_root) as servers:
        s = servers.start(metrics=True)
        cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(SCALING)],
            "scrape_configs": [
                {
                    "job_name": "shardstream",
                    "static_configs": [{"targets": [f"127.0.0.1:{s.metrics_port}"]}],
                    "relabel_configs": [{"source_labels": ["__address__"], "target_label": "pod"}],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        port = unused_port()
        base = f"http://127.0.0.1:{port}"
        with open(tmp_path / "prometheus.log", "wb") as log:
            prom = subprocess.Popen(
                [str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        loaders = _loaders(s, "stall-prom")
        try:
            wait_for(lambda: _ready(base) or prom.poll() is not None, "Prometheus to be ready", 30)
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()
            _read_until(
                loaders,
                lambda: _value(base, "shardstream_fleet_desired_servers") is not None
                and _value(base, 'shardstream_job_reporting_ranks{job_name="stall-prom"}') == 2,
                "the recorded shardstream_fleet_desired_servers",
            )
            # every piece at one evaluation time: the rule's arithmetic, checked on what Prometheus holds
            at = _query(base, "shardstream:fleet_desired_servers:instant")[0]["value"][0]

            def at_t(q: str) -> float:
                url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": at})
                return float(json.loads(urllib.request.urlopen(url, timeout=5).read())["data"]["result"][0]["value"][1])

            consumption = at_t("shardstream:fleet_consumption_samples_per_second")
            capacity = at_t("shardstream:server_capacity_samples_per_second:avg")
            stall = at_t("shardstream:fleet_data_stall:ratio")
            instant = at_t("shardstream:fleet_desired_servers:instant")
            assert consumption > 0 and capacity > 0
            assert stall > 0.05  # loops that do no work wait for data most of their time
            assert instant == max(1, math.ceil(consumption / capacity)) + 1
            assert at_t("shardstream_fleet_desired_servers") >= instant >= 2
            # one server: the fleet's stall is its gauge (the mean over the two ranks) — as the rule saw it at
            # its evaluation: a scrape stamped just before it may have landed after it, so the gauge's
            # samples of the last seconds bound the recorded value rather than equal it
            raw = 'shardstream_job_data_stall_ratio{job_name="stall-prom"}'
            lo, hi = at_t(f"min_over_time({raw}[10s])"), at_t(f"max_over_time({raw}[10s])")
            assert lo - 1e-9 <= stall <= hi + 1e-9, (lo, stall, hi)
        finally:
            for ld in loaders:
                ld.close()
            prom.terminate()
            prom.wait(30)


def _ready(base: str) -> bool:
    try:
        return urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200
    except OSError:
        return False


def test_a_two_worker_server_sums_its_workers_reports(data_root: Path) -> None:
    with Servers(data_root) as servers:
        s = servers.start(metrics=True, workers=2)
        ports = s.info()["data_ports"]  # each worker's own data port
        assert len(ports) == 2
        for port, rank in zip(ports, (0, 1), strict=True):  # one report to each worker
            body = json.dumps({"job": "two-workers", "rank": rank, "window_s": 10.0, "wait_s": 1.0 + 2 * rank, "samples": 100})
            sent: list[ShardstreamError | None] = []
            wait_for(lambda: sent.append(_report(port, body.encode())) or sent[-1] is None, f"worker data port {port}")  # noqa: B023
        stall, rate, ranks = _job_series(s, "two-workers")
        assert (ranks, rate) == (2, pytest.approx(20.0))  # summed over the workers
        assert stall == pytest.approx(0.3)  # the larger of the workers' means (0.1 and 0.3)


# --- 6. the chart's autoscaler on the desired size ------------------------------------------------------
def test_the_charts_autoscaler_scales_on_the_desired_servers(tmp_path: Path) -> None:
    """ci/stall-hpa-values.yaml: the HPA reads shardstream_fleet_desired_servers (an external metric of
    the Prometheus adapter, this release's job and namespace) as the replica count, not CPU, within
    min/max and with its scale-down window; the PrometheusRule renders scaling.yaml's rules beside
    rules.yaml's, selecting this release's servers (lint and strict schemas: tests/test_helm.py)."""
    from .support.chart import CHART, NAMESPACE, kube_versions, load_values, render, validate_object

    assert (CHART / "files" / "scaling.yaml").read_text() == SCALING.read_text(), "copy deploy/prometheus/scaling.yaml over"
    values = load_values(CHART / "ci" / "stall-hpa-values.yaml")
    values["prometheusRule"] = {**values.get("prometheusRule", {}), "runbookUrl": "https://runbooks.example/shardstream"}
    r = render(values)
    (hpa,) = r.of_kind("HorizontalPodAutoscaler")
    server = r.server["metadata"]["name"]
    assert hpa["spec"]["metrics"] == [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": "shardstream_fleet_desired_servers",
                    "selector": {"matchLabels": {"job": server, "namespace": NAMESPACE}},
                },
                "target": {"type": "AverageValue", "averageValue": "1"},  # replicas = the metric's value
            },
        }
    ]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 16)
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600
    validate_object(hpa, kube_versions()[-1])
    spec = r.one("PrometheusRule")["spec"]
    (scaling,) = [g for g in spec["groups"] if g["name"] == "shardstream.scaling"]
    assert [rule["record"] for rule in scaling["rules"] if "record" in rule][-1] == "shardstream_fleet_desired_servers"
    selector = f'job="{server}", namespace="{NAMESPACE}"'
    assert all(rule["expr"].count('job="') == rule["expr"].count(selector) for rule in scaling["rules"])
    assert sum(selector in rule["expr"] for rule in scaling["rules"]) == 4  # every server selector is the release's
    (too_small,) = [rule for rule in scaling["rules"] if rule.get("alert") == "ShardstreamFleetTooSmall"]
    assert too_small["annotations"]["runbook_url"] == "https://runbooks.example/shardstream#shardstreamfleettoosmall"
    if PROMTOOL is not None:
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
        done = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    # without the stall metric the chart's autoscaler is CPU's, and no scaling rules are rendered
    plain = render({"autoscaling": {"enabled": True}, "prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}})
    assert [m["type"] for m in plain.one("HorizontalPodAutoscaler")["spec"]["metrics"]] == ["Resource"]
    assert all(g["name"] != "shardstream.scaling" for g in plain.one("PrometheusRule")["spec"]["groups"])
