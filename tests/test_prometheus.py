"""The dashboards and rules of deploy/, proven against a real Prometheus scraping a real fleet.

Two servers (one a supervisor of `--workers auto`, one single process; both with one
`--checkpoint-root`) and a trainer process (a balanced Loader with a job, a transform and cursor commits, and a
Checkpointer saving every 50 steps and loading once, exposing its client metrics with
`start_metrics_server`) are scraped every second by the Debian `prometheus` binary, configured from
deploy/prometheus/prometheus.yml (targets and intervals replaced) with deploy/prometheus/rules.yaml.
Every panel expression of deploy/grafana/*.json and every recording rule must return data through
Prometheus' HTTP API (the test names those that do not, and prints the panels it checked); every
dashboard variable must have values, and every panel applies the dashboard's filters (pod and job on
the servers' series, dataset where the series has one, the job on the trainers'). The panels of pods
against their limits read the kubelet's cAdvisor series: no kubelet runs here, so KubeletStandIn serves
them for the two server pods (the chart's default limits, the working set and CPU of the servers' real
processes, CFS periods none of which were throttled). Then one server is killed and the fleet's panels say so. The
chart's ServiceMonitor scrapes the same port and path these servers serve. The Read streams are the
data plane's Arrow Flight DoGets: the rules' service matcher is checked to count them.

Beside it, what one server's metrics port serves: process metrics per worker and no `*_created`
series, build info, and /healthz and /readyz through a drain.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
import yaml

from shardstream.client.transport.channel import Connection
from shardstream.errors import ShardstreamError
from shardstream.server.local_fleet import LocalServer
from shardstream.v1 import shardstream_pb2 as pb

from .support import media
from .support.chart import CHART, cpu_millis, flag, load_values, memory_mib, render
from .support.data import N_ROWS, write_dataset
from .support.servers import Servers, unused_port, wait_for

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus is not installed (Debian package prometheus; .ci/run installs it)"
)
# What Grafana substitutes: every variable at "All", the rate interval a few scrapes long.
VARIABLES = {
    "$__rate_interval": "10s",
    "$job_name": ".*",
    "$dataset": ".*",
    "$job": ".*",
    "$pod": ".*",
    "$rank": ".*",
}

TRAINER = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    import numpy as np
    from shardstream.client import Loader, metrics
    from shardstream.client.checkpoint import Checkpointer

    endpoints, store, out = sys.argv[1].split(","), sys.argv[2], Path(sys.argv[3])
    port = metrics.start_metrics_server(0)
    (out / "port").write_text(str(port))
    step = threading.Event()  # never set: its wait() is the training step's compute time
    transforms = [{"op": "text.tokenize", "column": "text", "tokenizer": "bytes"}]
    frozen = np.arange(8192, dtype=np.float32)  # unchanged between saves: deduplicated
    with Loader(endpoints, "toy@1", batch_size=50, job="obs", cursor_store=store, epochs=None,
                transforms=transforms, balance={"cost": "id"}, report_interval_s=1) as loader, Checkpointer(endpoints, job="obs", chunk_bytes=4096) as ck:
        for i, batch in enumerate(loader):
            step.wait(0.01)
            if i % 10 == 9:
                loader.commit(i + 1)
            if i % 50 == 49:  # a checkpoint every 50 steps, uploaded while training goes on
                handle = ck.save(i + 1, {"frozen": frozen, "moving": np.full(1024, i, np.float32)}, loader=loader)
                if i == 49:
                    handle.result(timeout=60)
                    ck.load("latest")  # read back once (a rollout worker's load), so loaded bytes move
            if (out / "stop").exists():
                break
    """
)


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def label_values(base: str, label: str, match: str) -> list[str]:
    url = f"{base}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": match})
    return list(json.loads(urllib.request.urlopen(url, timeout=10).read())["data"])


def panels(dashboard: Path) -> Iterator[tuple[str, str]]:
    """(dashboard title / panel title, PromQL with the variables substituted) of every target."""
    d = json.loads(dashboard.read_text())
    for p in d["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, (p["title"], expr)
            yield f"{d['title']} / {p['title']} [{t['refId']}]", expr


def variables(dashboard: Path) -> Iterator[tuple[str, str, str]]:
    """(variable, label, series selector) of every label_values() variable."""
    d = json.loads(dashboard.read_text())
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["definition"])
            assert m, v["definition"]
            selector = m[1]
            for var, value in VARIABLES.items():
                selector = selector.replace(var, value)
            yield v["name"], m[2], selector


def recording_rules() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yaml").read_text())
    return [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]


def prometheus_config(servers: list[LocalServer], trainer_port: int, kubelet_port: int) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with these targets, a 1 s scrape and evaluation, the rules,
    and the kubelet stand-in scraped as kube-prometheus-stack scrapes cAdvisor (its labels kept)."""
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    cfg["rule_files"] = [str(DEPLOY / "prometheus" / "rules.yaml")]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    jobs["shardstream"]["static_configs"] = [{"targets": [f"127.0.0.1:{s.metrics_port}" for s in servers]}]
    jobs["trainer"]["static_configs"] = [{"targets": [f"127.0.0.1:{trainer_port}"]}]
    cfg["scrape_configs"].append(
        {
            "job_name": "kubelet",
            "honor_labels": True,
            "metrics_path": "/metrics/cadvisor",
            "static_configs": [{"targets": [f"127.0.0.1:{kubelet_port}"]}],
        }
    )
    return cfg


class KubeletStandIn:
    """STAND-IN for the kubelet's /metrics/cadvisor (no kubelet here): for each server, named as the
    servers' `pod` label names it, the series of its `server` container that the Fleet dashboard
    reads. The limits are the chart's defaults (resources.limits: cpu 2, memory 4Gi); the working set
    is the RSS of the server's real processes (supervisor and workers, read with psutil); CFS periods
    count 100 ms of wall time each, none throttled."""

    PERIOD_US = 100_000

    def __init__(self, servers: list[LocalServer]) -> None:
        limits = render().container["resources"]["limits"]
        self.cpu_cores = cpu_millis(limits["cpu"]) / 1000
        self.memory_bytes = int(memory_mib(limits["memory"])) << 20
        self.servers = servers
        self.started = time.monotonic()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> KubeletStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

    def exposition(self) -> str:
        periods = int((time.monotonic() - self.started) * 1e6 / self.PERIOD_US)
        lines = []
        for s in self.servers:
            labels = f'namespace="ml",pod="127.0.0.1:{s.metrics_port}",container="server"'
            try:
                root = psutil.Process(s.pid)
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            except psutil.NoSuchProcess:
                continue  # a killed pod has no container series
            lines += [
                f"container_spec_cpu_quota{{{labels}}} {int(self.cpu_cores * self.PERIOD_US)}",
                f"container_spec_cpu_period{{{labels}}} {self.PERIOD_US}",
                f"container_spec_memory_limit_bytes{{{labels}}} {self.memory_bytes}",
                f"container_memory_working_set_bytes{{{labels}}} {rss}",
                f"container_cpu_cfs_periods_total{{{labels}}} {periods}",
                f"container_cpu_cfs_throttled_periods_total{{{labels}}} 0",
            ]
        return "\n".join(lines) + "\n"

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = standin.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def servicemonitor_scrapes_what_the_server_serves() -> tuple[str, str]:
    """The chart's ServiceMonitor: (port name, path); asserted to be the server's --metrics-port."""
    r = render(load_values(CHART / "ci" / "monitoring-values.yaml"))
    endpoint = r.one("ServiceMonitor")["spec"]["endpoints"][0]
    service = next(
        s for s in r.of_kind("Service") if any(p["name"] == endpoint["port"] for p in s["spec"]["ports"])
    )
    target = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])["targetPort"]
    c = r.container
    container_port = next(p["containerPort"] for p in c["ports"] if p["name"] == target)
    assert int(flag(c["args"], "--metrics-port")) == container_port
    return endpoint["port"], endpoint["path"]


@needs_prometheus
def test_every_panel_and_recording_rule_returns_data(tmp_path: Path) -> None:
    assert servicemonitor_scrapes_what_the_server_serves() == ("metrics", "/metrics")  # what we scrape below
    root = tmp_path / "registry"
    write_dataset(root, "toy", N_ROWS)
    with Servers(root) as fleet:
        checkpoints = ("--checkpoint-root", str(tmp_path / "checkpoints"))  # one root: either server commits
        (tmp_path / "checkpoints").mkdir()
        # a supervisor that autoscales (the decisions panel): one worker, a second when its trainers stall
        a = fleet.start(metrics=True, workers="auto", extra_args=(*checkpoints, "--max-workers", "2"))
        b = fleet.start(metrics=True, workers=1, extra_args=checkpoints)
        bad_request(a)  # one stream error, so the errors-by-dataset panel has a series
        out = tmp_path / "trainer"
        out.mkdir()
        store = f"sqlite:///{tmp_path}/cursors.db"
        with open(tmp_path / "trainer.log", "wb") as log:  # the child keeps its own descriptor
            trainer = subprocess.Popen(
                [sys.executable, "-c", TRAINER, f"{a.target},{b.target}", store, str(out)],
                start_new_session=True,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        prom = None
        stack = contextlib.ExitStack()
        try:
            wait_for(
                lambda: (out / "port").exists() or trainer.poll() is not None, "the trainer's metrics port"
            )
            assert trainer.poll() is None, (tmp_path / "trainer.log").read_text()
            kubelet = stack.enter_context(KubeletStandIn([a, b]))
            cfg = prometheus_config([a, b], int((out / "port").read_text()), kubelet.port)
            (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
            port = unused_port()
            base = f"http://127.0.0.1:{port}"
            with open(tmp_path / "prometheus.log", "wb") as log:
                prom = subprocess.Popen(
                    [
                        str(PROMETHEUS),
                        f"--config.file={tmp_path / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    start_new_session=True,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            wait_for(lambda: ready(base) or prom.poll() is not None, "Prometheus to be ready", 30)
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()
            wait_for(lambda: sum(float(r["value"][1]) for r in query(base, "up")) == 4, "4 targets up", 30)

            checks = [
                *panels(DEPLOY / "grafana" / "fleet.json"),
                *panels(DEPLOY / "grafana" / "training.json"),
            ]
            checks += [(f"recording rule {name}", name) for name in recording_rules()]
            empty: list[str] = []

            def all_have_data() -> bool:
                empty[:] = [what for what, expr in checks if not query(base, expr)]
                return not empty

            try:
                wait_for(all_have_data, "every panel and recording rule to return data", 40)
            except AssertionError:
                pytest.fail(f"no data for: {empty}")
            print(f"\n{len(checks)} expressions returned data:\n  " + "\n  ".join(w for w, _ in checks))
            # the trainer's own numbers behind the First batch and Checkpoints panels
            assert total(base, "shardstream_client_first_batch_seconds_count") >= 1
            wait_for(lambda: total(base, "shardstream_client_checkpoint_saves_total") >= 2, "two checkpoint saves", 30)
            assert total(base, "shardstream_client_checkpoint_loaded_bytes_total") > 0
            sent, saved = (total(base, f"shardstream_client_checkpoint_{m}_bytes_total") for m in ("sent", "state"))
            assert 0 < sent < saved  # the frozen tensor was sent once: dedup > 0
            # the step time explained: its one rank reads balanced steps (a ratio of 1: it waits for nobody)
            explained = {where.rsplit(" / ", 1)[1]: e for where, e in panels(DEPLOY / "grafana" / "training.json")}

            def values(title: str) -> list[float]:
                return [float(r["value"][1]) for r in query(base, explained[title])]

            slowest = "Waiting for the slowest rank per step (estimated) [A]"
            wait_for(lambda: values(slowest) == [0.0], "the one rank to wait for no slower one", 30)
            assert all(v > 0 for v in values("Data wait per step [A]") + values("Step time [A]"))
            for dashboard in ("fleet.json", "training.json"):
                for name, label, selector in variables(DEPLOY / "grafana" / dashboard):
                    assert label_values(base, label, selector), f"{dashboard}: variable {name} has no values"
            unfiltered = [
                f"{where}: {metric}{{{matchers}}} lacks {missing}"
                for where, metric, matchers, missing in unfiltered_selectors(
                    DEPLOY / "grafana", lambda metric: bool(query(base, f'count({metric}{{dataset!=""}})'))
                )
            ]
            assert unfiltered == [], "\n".join(unfiltered)
            assert {r["metric"]["pod"] for r in query(base, "shardstream_build_info")} == {
                f"127.0.0.1:{a.metrics_port}",
                f"127.0.0.1:{b.metrics_port}",
            }
            # The Read streams are the data plane's DoGets, and the rules' service matcher counts them:
            # the bad request's InvalidArgument on a, and every stream started (the trainer's too).
            services = rpc_services_of_the_rules()
            doget = f'job="shardstream", grpc_service=~"{services}", grpc_method="DoGet", grpc_type="server_stream"'
            bad = f'grpc_server_handled_total{{{doget}, pod="127.0.0.1:{a.metrics_port}", grpc_code="InvalidArgument"}}'
            assert total(base, bad) >= 1
            streams = total(base, "shardstream_streams_total")  # the bad request never became a stream
            assert streams > 0 and total(base, f"grpc_server_started_total{{{doget}}}") >= streams + 1
            assert query(base, 'grpc_server_started_total{grpc_method="Read"}') == [], "the grpcio Read is gone"

            # A server dies: the fleet's panels say so, the trainer moves to the other server.
            dead = f"127.0.0.1:{a.metrics_port}"
            served_by_b = total(base, f'shardstream_streams_total{{pod="127.0.0.1:{b.metrics_port}"}}')
            a.kill()
            wait_for(
                lambda: query(base, f'up{{pod="{dead}"}} == 0') != [], "Prometheus to see the server down", 20
            )
            wait_for(
                lambda: (
                    total(base, "shardstream_client_failovers_total") > 0
                    and total(base, f'shardstream_streams_total{{pod="127.0.0.1:{b.metrics_port}"}}')
                    > served_by_b
                ),
                "the trainer to fail over to the other server",
                20,
            )
            assert total(base, 'sum(up{job="shardstream"})') == 1  # the "Servers up" panel
        finally:
            stack.close()
            (out / "stop").touch()
            for proc in (trainer, prom):
                if proc is not None:
                    try:
                        proc.wait(timeout=10 if proc is trainer else 0.1)
                    except subprocess.TimeoutExpired:
                        pass
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()


def raw_panels(dashboard: Path) -> Iterator[tuple[str, str]]:
    """(dashboard title / panel title, PromQL as written, variables unsubstituted) of every target."""
    d = json.loads(dashboard.read_text())
    for p in d["panels"]:
        for t in p.get("targets", []):
            yield f"{d['title']} / {p['title']} [{t['refId']}]", t["expr"]


def unfiltered_selectors(grafana: Path, has_dataset: Callable[[str], bool]) -> Iterator[tuple[str, str, str, str]]:
    """Selectors of panel targets that ignore a filter of their dashboard: on Fleet, a series without
    pod=~"$pod" (and job=~"$job" unless it is the kubelet's), or of a metric whose series carry a
    `dataset` label (`has_dataset`) without dataset=~"$dataset"; on Training, a series without
    job_name=~"$job_name". Yields (where, metric, matchers, the missing matcher)."""
    for dashboard, needs in (("fleet.json", ['pod=~"$pod"']), ("training.json", ['job_name=~"$job_name"'])):
        for where, expr in raw_panels(grafana / dashboard):
            for metric, matchers in re.findall(r"\b([a-z_]+)\{([^}]*)\}", expr):
                required = list(needs)
                if dashboard == "fleet.json" and not metric.startswith("container_"):
                    required.append('job=~"$job"')
                    if has_dataset(metric):
                        required.append('dataset=~"$dataset"')
                yield from ((where, metric, matchers, m) for m in required if m not in matchers)


def test_the_filter_check_names_panels_that_ignore_the_filters(tmp_path: Path) -> None:
    """unfiltered_selectors can fail: a Fleet panel without the pod filter, and one over a series
    with a `dataset` label but no dataset filter, are named."""
    fleet = json.loads((DEPLOY / "grafana" / "fleet.json").read_text())
    fleet["panels"] = [
        {"title": "no pod", "targets": [{"refId": "A", "expr": 'rate(shardstream_storage_reads_total{job=~"$job"}[5m])'}]},
        {"title": "no dataset", "targets": [{"refId": "A", "expr": 'sum(shardstream_streams_active{job=~"$job", pod=~"$pod"})'}]},
    ]
    (tmp_path / "fleet.json").write_text(json.dumps(fleet))
    shutil.copy(DEPLOY / "grafana" / "training.json", tmp_path / "training.json")
    found = {
        (where.split(" / ")[-1], missing)
        for where, _, _, missing in unfiltered_selectors(tmp_path, lambda m: m == "shardstream_streams_active")
    }
    assert found == {("no pod [A]", 'pod=~"$pod"'), ("no dataset [A]", 'dataset=~"$dataset"')}


def ready(base: str) -> bool:
    try:
        return urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def total(base: str, promql: str) -> float:
    return sum(float(r["value"][1]) for r in query(base, promql))


def bad_request(server: LocalServer) -> None:
    """One Read stream (a Flight DoGet on the server's data plane) that ends INVALID_ARGUMENT."""
    conn = Connection(server.target)
    try:
        with pytest.raises((grpc.RpcError, ShardstreamError)) as err:
            list(conn.read(pb.ReadRequest(dataset="toy@1", world_size=1, batch_size=0)))
        # a raw status, or (from the Flight data plane's call) the shardstream error it maps to
        code = err.value.status if isinstance(err.value, ShardstreamError) else err.value.code()
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        conn.close()


def rpc_services_of_the_rules() -> str:
    """The grpc_service matcher of the error-ratio rule (rules.yaml): what the alerts count."""
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yaml").read_text())
    (expr,) = [str(r["expr"]) for g in rules["groups"] for r in g["rules"] if r.get("record") == "shardstream:grpc_server_errors:ratio_rate5m"]
    matchers = set(re.findall(r'grpc_service=~"([^"]+)"', expr))
    assert len(matchers) == 1, matchers
    return matchers.pop()


# --- one server's metrics port -----------------------------------------------------------------------


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_two_worker_server_shows_both_workers_processes_and_no_created_series(tmp_path: Path) -> None:
    root = tmp_path / "registry"
    write_dataset(root, "toy", N_ROWS)
    with Servers(root) as fleet:
        server = fleet.start(metrics=True, workers=2)
        status, text = get(f"http://127.0.0.1:{server.metrics_port}/metrics")
        assert status == 200
        assert "_created" not in text
        for metric in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
            workers = set(re.findall(rf'^{metric}{{worker="([^"]+)"}} ', text, flags=re.M))
            assert workers == {"0", "1", "supervisor"}, (metric, workers)
        info = re.search(r"^shardstream_build_info\{(.+)\} 1\.0$", text, flags=re.M)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', info[1])) if info else {}
        assert set(labels) == {"version", "python", "pyarrow", "grpc", "kernels"}
        assert labels["kernels"] == "native"  # the C kernels are built (tests/test_kernels.py)
        # grpc-ecosystem names: the data plane's Read streams are Flight DoGets, the control plane's
        # calls keep their service; both exported at 0 before any call
        assert (
            'grpc_server_handled_total{grpc_code="OK",grpc_method="DoGet",'
            'grpc_service="arrow.flight.protocol.FlightService",grpc_type="server_stream"}' in text
        )
        assert 'grpc_method="GetDataset",grpc_service="shardstream.v1.ShardStream",grpc_type="unary"' in text
        assert 'grpc_method="Read"' not in text
        single = fleet.start(metrics=True, workers=1)
        status, text = get(f"http://127.0.0.1:{single.metrics_port}/metrics")
        assert "_created" not in text and re.search(r"^process_cpu_seconds_total \d", text, flags=re.M)


def test_healthz_and_readyz_follow_the_server_through_a_drain(tmp_path: Path) -> None:
    """/readyz turns 503 as the drain begins while /healthz stays 200 (the chart's http probes)."""
    tls = render(load_values(CHART / "ci" / "tls-values.yaml")).container
    paths = {k: tls[k]["httpGet"]["path"] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert paths == {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    root = tmp_path / "registry"
    # 32 MiB of 1 MiB rows: more than a connection's flow-control window, so a stream whose client
    # stops reading stays in flight and the drain waits for it
    blobs = [(str(i), os.urandom(1 << 20)) for i in range(32)]
    media.write_table(root, "blobs", media.blob_table("blob", blobs), row_group_rows=1, shard_rows=8)
    for workers in (1, 2):
        with Servers(root) as fleet:
            server = fleet.start(metrics=True, workers=workers, extra_args=("--grace", "60"))
            base = f"http://127.0.0.1:{server.metrics_port}"
            assert get(base + "/healthz") == (200, "ok\n") and get(base + "/readyz") == (200, "ready\n")
            conn = Connection(server.target)
            call = conn.read(pb.ReadRequest(dataset="blobs@1", world_size=1, batch_size=1))
            next(iter(call))  # a stream in flight, never read further: the drain waits for it
            server.terminate()
            wait_for(lambda url=base + "/readyz": get(url)[0] == 503, "/readyz to say draining")
            assert get(base + "/readyz") == (503, "draining\n") and get(base + "/healthz") == (200, "ok\n")
            call.cancel()
            conn.close()
