"""The Grafana dashboards of deploy/grafana/, generated so that their panels stay consistent.

    python deploy/grafana/dashboards.py           # writes fleet.json and training.json beside this file
    python deploy/grafana/dashboards.py --check   # exit 1 when the committed JSON differs

Fleet (servers: load by dataset, latency, cache, storage, transforms, errors, admission, the trainers'
stall and the servers it asks for, processes)
and Training (trainers: data stall, waits, first batch, failovers, cursor commits, checkpoints, the
picked ranks' step time explained). Each dashboard has a `datasource` variable (any Prometheus), and
variables for its series: `job` (the servers' scrape job; on Kubernetes the chart's Service name),
`pod`, `dataset` on Fleet; `job_name` and `rank` on Training; every panel applies them (Training's
aggregates take every rank of the picked jobs, its per-rank rows the picked ranks). Panels read raw
series, not the recording rules of deploy/prometheus/rules.yaml (the alerts use those), so they work
on any Prometheus that scrapes the servers, the trainers and, for "Pods against their limits", the
kubelet's cAdvisor endpoint. Training panels aggregate over ranks (worst, median, top 10) so that
they stay readable at hundreds of ranks; its Rank variable drills down into a few. Import: Grafana >
Dashboards > New > Import, upload the file, pick the Prometheus data source.
tests/test_prometheus.py evaluates every panel's expression against a real Prometheus scraping real
servers and a trainer; tests/test_monitoring.py checks the files are this script's output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
SERVERS = 'job=~"$job", pod=~"$pod"'
DATASETS = f'{SERVERS}, dataset=~"$dataset"'
JOBS = 'job_name=~"$job_name"'
RANKS = f'{JOBS}, rank=~"$rank"'
# The kubelet's cAdvisor series of the server container (kube-prometheus-stack scrapes them as job
# "kubelet"): the pod's CPU and memory limits, its working set and CPU throttling. They carry the pod
# and namespace but not the servers' job, so the pod variable selects them.
CONTAINER = 'container="server"'
POD = 'pod=~"$pod"'
# The RPC metrics' services: the control plane (GetDataset, ListDatasets) and the data plane, whose
# Read streams are Arrow Flight DoGet calls (grpc_method="DoGet", grpc_type="server_stream").
CONTROL_PLANE = 'grpc_service="shardstream.v1.ShardStream"'
BOTH_PLANES = 'grpc_service=~"shardstream.v1.ShardStream|arrow.flight.protocol.FlightService"'
WIDTH, HEIGHT = 12, 8


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend or "__auto", "refId": ref}
    if instant:
        t.update(instant=True, format="table")
    return t


def panel(
    title: str,
    *targets: tuple[str, str],
    unit: str = "short",
    kind: str = "timeseries",
    description: str = "",
    thresholds: list[tuple[str, float | None]] | None = None,
    width: int = WIDTH,
) -> dict[str, Any]:
    """A panel of `kind` over (expr, legend) targets; placed by `layout`."""
    defaults: dict[str, Any] = {"unit": unit}
    if thresholds:
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": color, "value": value} for color, value in thresholds],
        }
        defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
    p: dict[str, Any] = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": HEIGHT, "w": width, "x": 0, "y": 0},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
        "targets": [
            target(expr, legend, ref=chr(ord("A") + i), instant=kind == "table")
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    if kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    if kind == "table":
        p["options"] = {"showHeader": True}
    return p


def row(title: str) -> dict[str, Any]:
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"h": 1, "w": 24, "x": 0, "y": 0},
        "panels": [],
    }


def layout(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows full width; panels left to right, wrapping at 24 columns; ids in order."""
    x = y = 0
    for i, p in enumerate(panels, start=1):
        p["id"] = i
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if p["type"] == "row" or x + w > 24:
            y, x = y + (HEIGHT if x else 0), 0
        p["gridPos"].update(x=x, y=y)
        if p["type"] == "row":
            y += h
        else:
            x += w
    return panels


def query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def dashboard(
    uid: str, title: str, description: str, variables: list[dict[str, Any]], panels: list[dict[str, Any]]
) -> dict[str, Any]:
    datasource = {
        "type": "datasource",
        "name": "datasource",
        "label": "Data source",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
    }
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["shardstream"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [datasource, *variables]},
        "panels": layout(panels),
    }


def fleet() -> dict[str, Any]:
    rate = "[$__rate_interval]"
    control, rpcs = f"{SERVERS}, {CONTROL_PLANE}", f"{SERVERS}, {BOTH_PLANES}"
    pods = f"{CONTAINER}, {POD}"

    def quantile(q: float, metric: str, by: str, selector: str = SERVERS) -> str:
        return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{selector}}}{rate})))"

    # fmt: off
    panels = [
        row("Load"),
        panel("Servers up", (f"sum(up{{{SERVERS}}})", "up"), kind="stat", width=4,
              description="Server targets Prometheus scrapes successfully (one per pod)."),
        panel("Workers serving", (f"sum by (pod) (shardstream_workers{{{SERVERS}}})", "{{pod}}"), kind="stat",
              width=4, description="Worker processes serving per pod (servers with --workers > 1)."),
        panel("Versions running",
              (f"count by (version, python, pyarrow, grpc) (shardstream_build_info{{{SERVERS}}})", ""),
              kind="table", width=16, description="shardstream_build_info: pods per version."),
        panel("Streams active by dataset", (f"sum by (dataset) (shardstream_streams_active{{{DATASETS}}})", "{{dataset}}"),
              description="Read streams in progress (dataset: name, at most 64 per process; the rest as _other)."),
        panel("Streams started/s by dataset",
              (f"sum by (dataset) (rate(shardstream_streams_total{{{DATASETS}}}{rate}))", "{{dataset}}"), unit="ops"),
        panel("Rows/s by dataset", (f"sum by (dataset) (rate(shardstream_rows_sent_total{{{DATASETS}}}{rate}))", "{{dataset}}"),
              unit="short"),
        panel("Bytes/s sent by dataset",
              (f"sum by (dataset) (rate(shardstream_bytes_sent_total{{{DATASETS}}}{rate}))", "{{dataset}}"), unit="Bps"),
        row("Latency"),
        panel("Batch build time p50 / p99",
              (quantile(0.5, "shardstream_batch_build_seconds", "pod"), "p50 {{pod}}"),
              (quantile(0.99, "shardstream_batch_build_seconds", "pod"), "p99 {{pod}}"), unit="s",
              description="Time to read, take and encode one Read message; a rising p99 = storage or CPU saturation."),
        panel("Control-plane RPC time p99",
              (f'histogram_quantile(0.99, sum by (grpc_method, le) (rate(grpc_server_handling_seconds_bucket{{{control}, grpc_type="unary"}}{rate})))',
               "{{grpc_method}}"), unit="s"),
        row("Cache and storage"),
        panel("Cache hit ratio",
              (f"sum by (pod) (rate(shardstream_cache_hits_total{{{SERVERS}}}{rate})) / sum by (pod) "
               f"(rate(shardstream_cache_hits_total{{{SERVERS}}}{rate}) + rate(shardstream_cache_misses_total{{{SERVERS}}}{rate}))",
               "{{pod}}"), unit="percentunit", thresholds=[("red", None), ("green", 0.5)]),
        panel("Cache bytes", (f"sum by (pod) (shardstream_cache_bytes{{{SERVERS}}})", "used {{pod}}"),
              (f"sum by (pod) (shardstream_cache_capacity_bytes{{{SERVERS}}})", "capacity {{pod}}"), unit="bytes"),
        panel("Builds waiting for cache room",
              (f"sum by (pod) (rate(shardstream_cache_room_wait_seconds_total{{{SERVERS}}}{rate}))", "waiting {{pod}}"),
              (f"sum by (pod) (rate(shardstream_cache_room_waits_total{{{SERVERS}}}{rate}))", "waits/s {{pod}}"),
              description="Builds that waited for the row groups of other builds to leave the cache (seconds waited "
                          "per second, about builds waiting at once; and waits/s). Steady: the cache is smaller than "
                          "what the builds in flight gather from: raise --cache-mib (deploy/RUNBOOK.md \"Limits\")."),
        panel("Storage reads/s", (f"sum by (pod) (rate(shardstream_storage_reads_total{{{SERVERS}}}{rate}))", "{{pod}}"),
              unit="ops"),
        panel("Storage fetch time p99", (quantile(0.99, "shardstream_storage_read_seconds", "pod"), "{{pod}}"), unit="s"),
        panel("Read amplification",
              (f"sum by (pod) (rate(shardstream_storage_read_bytes_total{{{SERVERS}}}{rate})) / sum by (pod) "
               f"(rate(shardstream_cache_hit_bytes_total{{{SERVERS}}}{rate}) + rate(shardstream_cache_miss_bytes_total{{{SERVERS}}}{rate}))",
               "{{pod}}"),
              description="Bytes read from storage per byte looked up in the cache (1 = every lookup read storage)."),
        panel("Bytes/s read from storage",
              (f"sum by (pod) (rate(shardstream_storage_read_bytes_total{{{SERVERS}}}{rate}))", "{{pod}}"), unit="Bps"),
        row("Transforms"),
        panel("Transform time p99 by op", (quantile(0.99, "shardstream_transform_seconds", "op", DATASETS), "{{op}}"),
              unit="s", description="p99 of one transform's time, on the pods and datasets selected above."),
        panel("Transform CPU by op and dataset",
              (f"sum by (op, dataset) (rate(shardstream_transform_seconds_sum{{{DATASETS}}}{rate}))", "{{op}} {{dataset}}"),
              unit="s", description="Seconds per second spent in each server-side transform (about cores busy)."),
        row("Errors and admission"),
        panel("RPC errors/s by code",
              (f'sum by (grpc_method, grpc_code) (rate(grpc_server_handled_total{{{rpcs}, grpc_code!="OK"}}{rate}))',
               "{{grpc_method}} {{grpc_code}}"), unit="ops",
              description="Control plane (GetDataset, ListDatasets) and data plane (DoGet: the Read streams) by status."),
        panel("Stream errors/s by dataset",
              (f"sum by (dataset, code) (rate(shardstream_stream_errors_total{{{DATASETS}}}{rate}))", "{{dataset}} {{code}}"),
              unit="ops"),
        panel("Streams refused/s by limit",
              (f"sum by (limit) (rate(shardstream_streams_refused_total{{{SERVERS}}}{rate}))", "{{limit}}"), unit="ops",
              description="RESOURCE_EXHAUSTED at the admission limits (server, peer, buffer)."),
        panel("Stream buffer bytes", (f"sum by (pod) (shardstream_stream_buffer_bytes{{{SERVERS}}})", "{{pod}}"),
              unit="bytes"),
        row("Pods against their limits"),
        panel("CPU used / limit",
              (f"sum by (pod) (rate(process_cpu_seconds_total{{{SERVERS}}}{rate}))", "used {{pod}}"),
              (f"sum by (pod) (container_spec_cpu_quota{{{pods}}} / container_spec_cpu_period{{{pods}}})", "limit {{pod}}"),
              description="Cores used by every process of the pod (supervisor and workers) against the container's "
                          "CPU limit (the kubelet's cAdvisor series; the chart sizes --workers from the limit)."),
        panel("CPU throttled (share of periods)",
              (f"sum by (pod) (rate(container_cpu_cfs_throttled_periods_total{{{pods}}}{rate})) / sum by (pod) "
               f"(rate(container_cpu_cfs_periods_total{{{pods}}}{rate}))", "{{pod}}"),
              unit="percentunit", thresholds=[("green", None), ("red", 0.25)],
              description="CFS periods in which the container hit its CPU quota: batches are built late, trainers stall."),
        panel("Memory used / limit",
              (f"sum by (pod) (container_memory_working_set_bytes{{{pods}}})", "working set {{pod}}"),
              (f"sum by (pod) (process_resident_memory_bytes{{{SERVERS}}})", "RSS {{pod}}"),
              (f"sum by (pod) (container_spec_memory_limit_bytes{{{pods}}})", "limit {{pod}}"), unit="bytes",
              description="The working set is what the OOM killer weighs against the limit; size the limit by "
                          "deploy/RUNBOOK.md \"Memory limit\" (cache + 2 x stream buffer + workers)."),
        panel("Memory headroom (working set / limit)",
              (f"max by (pod) (container_memory_working_set_bytes{{{pods}}} / container_spec_memory_limit_bytes{{{pods}}})",
               "{{pod}}"), unit="percentunit", thresholds=[("green", None), ("orange", 0.8), ("red", 0.9)],
              description="Near 1 the pod is about to be OOM-killed (ShardstreamWorkerCrashLoop follows)."),
        row("Scaling: the trainers' stall"),
        panel("Trainers' data stall by job",
              (f"sum by (job_name) (shardstream_job_data_stall_ratio{{{SERVERS}}} * shardstream_job_reporting_ranks{{{SERVERS}}})"
               f" / sum by (job_name) (shardstream_job_reporting_ranks{{{SERVERS}}})", "{{job_name}}"),
              unit="percentunit", thresholds=[("green", None), ("red", 0.05)],
              description="What the trainers report (Loader report_interval_s): the mean share of wall time their "
                          "ranks waited for data, over the reporting ranks of each job. Above 5 % the fleet is short "
                          "or something in it is slow (deploy/RUNBOOK.md \"Scaling on the trainers' stall\")."),
        panel("Servers needed and servers up",
              (f"ceil(sum(shardstream_job_consumption_samples_per_second{{{SERVERS}}}) / "
               f"avg(max_over_time(shardstream_server_samples_per_second{{{SERVERS}}}[1h]) > 0))", "needed"),
              (f"sum(up{{{SERVERS}}})", "up"),
              description="The trainers' consumption over a server's best samples/s of the last hour (the "
                          "instant form of shardstream_fleet_desired_servers, deploy/prometheus/scaling.yaml, "
                          "which adds one while the stall is above 5 % and waits 15 min before going down)."),
        panel("Samples/s: the trainers' consumption and the servers' throughput",
              (f"sum by (job_name) (shardstream_job_consumption_samples_per_second{{{SERVERS}}})", "taken {{job_name}}"),
              (f"sum by (pod) (shardstream_server_samples_per_second{{{SERVERS}}})", "sent {{pod}}"), unit="short"),
        panel("Ranks reporting by job",
              (f"sum by (job_name) (shardstream_job_reporting_ranks{{{SERVERS}}})", "{{job_name}}"), kind="stat",
              description="Ranks whose last report is live (a job whose Loaders set report_interval_s=0 is missing)."),
        row("Processes"),
        panel("Worker restarts (15 min)",
              (f"sum by (pod) (increase(shardstream_worker_restarts_total{{{SERVERS}}}[15m]))", "{{pod}}")),
        panel("Open file descriptors per pod", (f"sum by (pod) (process_open_fds{{{SERVERS}}})", "{{pod}}")),
        panel("Ranks and streams per worker process",
              (f"sum by (pod, worker) (shardstream_worker_ranks{{{SERVERS}}})", "{{pod}} worker {{worker}} ranks"),
              (f"sum by (pod, worker) (shardstream_worker_streams{{{SERVERS}}})", "{{pod}} worker {{worker}} streams"),
              description="Trainer ranks and Read streams each worker of a --workers N/auto server carries (a rank "
                          "holds two streams while its next epoch's opens). Running ranks follow the workers: a "
                          "worker 2 ranks or more above the least busy hands its excess back at a step boundary "
                          "(deploy/RUNBOOK.md \"One machine: serve --workers auto\")."),
        panel("Worker moves (1 h): autoscale decisions and rebalance rounds",
              (f"sum by (pod, reason) (increase(shardstream_autoscale_decisions_total{{{SERVERS}}}[1h]))", "{{pod}} {{reason}}"),
              (f"sum by (pod) (increase(shardstream_rebalance_rounds_total{{{SERVERS}}}[1h]))", "{{pod}} rebalance rounds"),
              description="serve --workers auto: workers added (stall_above_target) or drained (capacity_to_spare); "
                          "rounds in which busy workers handed streams to less busy ones. Steadily rising: the "
                          "trainers' load moves faster than the hysteresis (RUNBOOK)."),
    ]
    # fmt: on
    variables = [
        query_variable("job", "Job", "label_values(shardstream_build_info, job)"),
        query_variable("pod", "Pod", 'label_values(shardstream_build_info{job=~"$job"}, pod)'),
        query_variable("dataset", "Dataset", 'label_values(shardstream_streams_total{job=~"$job"}, dataset)'),
    ]
    about = ("shardstream servers: load by dataset, latency, cache, storage, transforms, errors, pods against their "
             "limits, the trainers' stall and the servers it asks for.")
    return dashboard("shardstream-fleet", "shardstream / Fleet", about, variables, panels)


def training() -> dict[str, Any]:
    rate = "[$__rate_interval]"
    per_rank = "sum by (job_name, rank)"

    def stall(selector: str) -> str:  # a rank's share of wall time spent waiting for its next batch
        return f"{per_rank} (rate(shardstream_client_wait_seconds_sum{{{selector}}}{rate}))"

    def batches(selector: str) -> str:
        return f"{per_rank} (rate(shardstream_client_batches_total{{{selector}}}{rate}))"

    def first_batch(selector: str) -> str:  # a rank's mean first-batch time (one per iteration: per (re)start)
        return (f"{per_rank} (shardstream_client_first_batch_seconds_sum{{{selector}}}) / "
                f"({per_rank} (shardstream_client_first_batch_seconds_count{{{selector}}}) > 0)")

    def ckpt_rate(metric: str) -> str:
        return f"sum by (job_name) (rate(shardstream_client_checkpoint_{metric}{{{JOBS}}}{rate}))"

    def ckpt_p99(metric: str) -> str:
        return (f"histogram_quantile(0.99, sum by (job_name, le) "
                f"(rate(shardstream_client_checkpoint_{metric}_bucket{{{JOBS}}}{rate})))")

    def per_step(selector: str, metric: str) -> str:  # a rank's seconds of `metric` per step it took
        return f"{per_rank} (rate({metric}{{{selector}}}{rate})) / {batches(selector)}"

    def mean_ratio(selector: str) -> str:  # a rank's mean cost ratio of its balanced steps
        return (f"{per_rank} (rate(shardstream_client_step_cost_ratio_sum{{{selector}}}{rate})) / "
                f"{per_rank} (rate(shardstream_client_step_cost_ratio_count{{{selector}}}{rate}))")

    step_time = f"1 / ({batches(RANKS)} > 0)"
    # (max - own) / max x step time = (1 - own / the job's largest) x step time, the largest over all its ranks
    slowest = f"(1 - {mean_ratio(RANKS)} / on (job_name) group_left () max by (job_name) ({mean_ratio(JOBS)})) * {step_time}"
    commit_age = f"time() - max by (job_name, rank) (shardstream_client_cursor_last_commit_timestamp_seconds{{{JOBS}}} > 0)"
    who = "{{job_name}} rank {{rank}}"
    # fmt: off
    panels = [
        row("Data: every rank of the job, aggregated"),
        panel("Data stall: worst rank and median rank",
              (f"max by (job_name) ({stall(JOBS)})", "max {{job_name}}"),
              (f"quantile by (job_name) (0.5, {stall(JOBS)})", "p50 {{job_name}}"),
              unit="percentunit", thresholds=[("green", None), ("red", 0.05)],
              description="Fraction of wall time a training loop waited for its next batch: the slowest rank sets "
                          "the pace of a synchronous job. The SLO is 5%."),
        panel("Ranks stalling most (top 10)", (f"topk(10, {stall(JOBS)})", ""), kind="table",
              unit="percentunit",
              description="The ranks with the largest stall now: pick them in the Rank variable to drill down."),
        panel("Wait for a batch p99 (all ranks)",
              (f"histogram_quantile(0.99, sum by (job_name, le) (rate(shardstream_client_wait_seconds_bucket{{{JOBS}}}{rate})))",
               "{{job_name}}"), unit="s"),
        panel("Batches/s: job total and slowest rank",
              (f"sum by (job_name) ({batches(JOBS)})", "total {{job_name}}"),
              (f"min by (job_name) ({batches(JOBS)})", "slowest rank {{job_name}}"), unit="ops"),
        panel("Step imbalance: largest rank's share of a balanced step over the mean",
              (f"histogram_quantile(0.99, sum by (job_name, le) (rate(shardstream_client_step_cost_ratio_bucket{{{JOBS}}}{rate})))",
               "p99 {{job_name}}"),
              (f"histogram_quantile(0.5, sum by (job_name, le) (rate(shardstream_client_step_cost_ratio_bucket{{{JOBS}}}{rate})))",
               "p50 {{job_name}}"),
              thresholds=[("green", None), ("red", 1.1)],
              description="Jobs reading with balance= (docs: Transforms, Balanced steps): each rank's cost of a step (Σ chunk "
                          "length² of its packed rows, or its samples' cost column) over the step's mean. A step lasts "
                          "as long as its largest share; 1.0 is even. Empty for jobs without balance."),
        panel("Bytes/s received (job)",
              (f"sum by (job_name) (rate(shardstream_client_bytes_total{{{JOBS}}}{rate}))", "{{job_name}}"), unit="Bps"),
        panel("Ranks reporting", (f"count by (job_name) ({batches(JOBS)})", "{{job_name}}"), kind="stat",
              description="Trainer processes scraped per job (one per rank)."),
        panel("First batch: worst rank and median rank",
              (f"max by (job_name) ({first_batch(JOBS)})", "max {{job_name}}"),
              (f"quantile by (job_name) (0.5, {first_batch(JOBS)})", "p50 {{job_name}}"), unit="s", width=8,
              description="Time from a loop's start (iter(), a resume included) to its first batch, averaged over "
                          "each rank's starts: what a restart costs before training moves again."),
        row("Failover"),
        panel("Failovers/s",
              (f"sum by (job_name) (rate(shardstream_client_failovers_total{{{JOBS}}}{rate}))", "{{job_name}}"),
              unit="ops", description="Stream restarts that moved to another server (a server died, drained or refused)."),
        panel("Stream retries/s",
              (f"sum by (job_name) (rate(shardstream_client_stream_retries_total{{{JOBS}}}{rate}))", "{{job_name}}"),
              unit="ops", description="Every Read stream reopened after an error, on the same server or another one "
                                      "(failovers are the part that moved)."),
        row("Cursor commits"),
        panel("Commit lag: oldest rank", (f"max by (job_name) ({commit_age})", "{{job_name}}"), unit="s",
              description="Seconds since the rank that committed longest ago last committed its cursor."),
        panel("Commit time p99",
              (f"histogram_quantile(0.99, sum by (job_name, le) (rate(shardstream_client_cursor_commit_seconds_bucket{{{JOBS}}}{rate})))",
               "{{job_name}}"), unit="s"),
        panel("Commits and failures/s",
              (f"sum by (job_name) (rate(shardstream_client_cursor_commits_total{{{JOBS}}}{rate}))", "commits {{job_name}}"),
              (f"sum by (job_name) (rate(shardstream_client_cursor_commit_failures_total{{{JOBS}}}{rate}))",
               "failures {{job_name}}"), unit="ops"),
        row("Checkpoints (Checkpointer)"),
        panel("Checkpoint bytes/s saved, sent and loaded",
              (ckpt_rate("state_bytes_total"), "saved {{job_name}}"),
              (ckpt_rate("sent_bytes_total"), "sent {{job_name}}"),
              (ckpt_rate("loaded_bytes_total"), "loaded {{job_name}}"), unit="Bps",
              description="Saved: bytes of the states saved; sent: the chunks the servers lacked (what an "
                          "incremental save uploads); loaded: bytes read back, every rank together."),
        panel("Checkpoint stall p99", (ckpt_p99("stall_seconds"), "{{job_name}}"), unit="s", width=6,
              description="Time save() held the training step (staging to host memory): the step's whole cost."),
        panel("Checkpoint upload lag p99", (ckpt_p99("upload_seconds"), "{{job_name}}"), unit="s", width=6,
              description="From save() returning to the step committed (uploaded in the background): a crash in "
                          "this window restarts from the previous checkpoint."),
        panel("Checkpoint dedup ratio",
              (f"1 - {ckpt_rate('sent_bytes_total')} / {ckpt_rate('state_bytes_total')}", "{{job_name}}"),
              unit="percentunit", width=8,
              description="Share of the saved bytes the servers already had (1 - sent/saved): near 0 every save "
                          "is a full one, near 1 little of the state changed (frozen layers, LoRA)."),
        panel("Checkpoint saves and failures/s",
              (ckpt_rate("saves_total"), "saves {{job_name}}"),
              (ckpt_rate("save_failures_total"), "failures {{job_name}}"), unit="ops", width=8,
              description="Saves started, and those that did not commit (the handle's result() raises; the "
                          "previous checkpoint stays latest)."),
        panel("Checkpoint failures (1 h)",
              (f"sum by (job_name) (increase(shardstream_client_checkpoint_save_failures_total{{{JOBS}}}[1h]))",
               "{{job_name}}"), kind="stat", width=8, thresholds=[("green", None), ("red", 1)]),
        row("Step time, explained (the ranks picked in the Rank variable)"),
        panel("Step time", (step_time, who), unit="s", width=6,
              description="Wall seconds per step of each picked rank (1 / its batches per second). The next "
                          "panels are its parts; the rest is the training step's own compute."),
        panel("Data wait per step", (per_step(RANKS, "shardstream_client_wait_seconds_sum"), who), unit="s", width=6,
              description="Seconds per step the loop waited for its next batch (the data stall): the fleet is "
                          "not keeping up with this rank."),
        panel("Waiting for the slowest rank per step (estimated)", (slowest, who), unit="s", width=6,
              description="Jobs reading with balance=: (max - own) / max mean cost ratio x step time, the max "
                          "over every rank of the job. A step lasts as long as its largest share, so a rank with "
                          "less work waits for the others at the all-reduce (compute taken as proportional to "
                          "cost). Empty without balance."),
        panel("Checkpoint save stall per step", (per_step(RANKS, "shardstream_client_checkpoint_stall_seconds_sum"), who),
              unit="s", width=6,
              description="Seconds per step Checkpointer.save held the loop (staging), spread over the steps: "
                          "a save every N steps costs its stall / N here."),
        row("Rank drill-down (the ranks picked in the Rank variable)"),
        panel("Data stall of the picked ranks", (stall(RANKS), who), unit="percentunit",
              thresholds=[("green", None), ("red", 0.05)]),
        panel("Wait for a batch p99 of the picked ranks",
              (f"histogram_quantile(0.99, sum by (job_name, rank, le) (rate(shardstream_client_wait_seconds_bucket{{{RANKS}}}{rate})))",
               who), unit="s"),
        panel("Batches/s of the picked ranks", (batches(RANKS), who), unit="ops"),
        panel("Failovers and retries/s of the picked ranks",
              (f"{per_rank} (rate(shardstream_client_failovers_total{{{RANKS}}}{rate}))", "failovers " + who),
              (f"{per_rank} (rate(shardstream_client_stream_retries_total{{{RANKS}}}{rate}))", "retries " + who),
              unit="ops"),
        panel("Commit lag of the picked ranks",
              (f"time() - max by (job_name, rank) (shardstream_client_cursor_last_commit_timestamp_seconds{{{RANKS}}} > 0)", who),
              unit="s"),
    ]
    # fmt: on
    rank = query_variable("rank", "Rank", 'label_values(shardstream_client_batches_total{job_name=~"$job_name"}, rank)')
    # a drill-down: a few ranks at a time (the first by default), never all of them in one panel
    rank.update(includeAll=False, current={})
    rank.pop("allValue")
    variables = [query_variable("job_name", "Job", "label_values(shardstream_client_batches_total, job_name)"), rank]
    about = (
        "Trainers' view of shardstream at any number of ranks: the job's worst and median rank, the ranks "
        "stalling most, first-batch latency after a (re)start, failovers and retries, cursor commits, "
        "checkpoints (bytes, stall, upload lag, dedup, failures), the picked ranks' step time explained (data "
        "wait, waiting for the slowest rank, checkpoint stall), and a drill-down into picked ranks."
    )
    return dashboard("shardstream-training", "shardstream / Training", about, variables, panels)


DASHBOARDS = {"fleet.json": fleet, "training.json": training}


def render() -> dict[str, str]:
    """file name -> the JSON text this script writes."""
    return {name: json.dumps(make(), indent=2) + "\n" for name, make in DASHBOARDS.items()}


def main(argv: list[str]) -> int:
    stale = []
    for name, text in render().items():
        path = HERE / name
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python deploy/grafana/dashboards.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
