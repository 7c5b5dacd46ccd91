"""`shardstream fleet recommend`: how many servers the trainers' reports ask for (DESIGN §11).

Each server exports what the Loaders reading from it report (server/serving/job_reports.py): per job
the trainers' data stall and consumption, and its own throughput. This reads those series from each
server's metrics port and says

    servers = ceil(Σ consumption ÷ mean per-server throughput), plus one while the trainers' stall
              (their mean over every reporting rank) is above --stall-target; at least 1

the number deploy/prometheus/scaling.yaml records as `shardstream_fleet_desired_servers` (there with
hysteresis: it uses each server's best recent throughput and is slow to go down). Name every server
of the fleet: the sums are over the servers named.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from shardstream.errors import InvalidArgumentError, UnavailableError

from . import common

__all__ = ["Recommendation", "add_commands", "recommend"]

DEFAULT_STALL_TARGET = 0.05  # the data-stall SLO of the ShardstreamDataStall alert


@dataclass(frozen=True)
class Recommendation:
    servers: int  # recommended
    now: int  # servers asked
    consumption: float  # samples/s the trainers took, all jobs
    throughput: float  # samples/s each server sent, mean over the servers asked
    stall: float  # share of the reporting ranks' time spent waiting for data (0-1)
    ranks: int  # reporting ranks
    jobs: int  # jobs reporting
    stall_target: float


def recommend(scrapes: list[dict[str, Any]], stall_target: float = DEFAULT_STALL_TARGET) -> Recommendation:
    """The recommendation from each server's series: {"throughput": x, "jobs": {job: (stall, rate, ranks)}}."""
    consumption = sum(rate for s in scrapes for _, rate, _ in s["jobs"].values())
    ranks = sum(n for s in scrapes for _, _, n in s["jobs"].values())
    stall = sum(st * n for s in scrapes for st, _, n in s["jobs"].values()) / ranks if ranks else 0.0
    throughput = sum(s["throughput"] for s in scrapes) / len(scrapes) if scrapes else 0.0
    servers = max(1, math.ceil(consumption / throughput - 1e-9)) if throughput > 0 else max(1, len(scrapes))
    if stall > stall_target:
        servers += 1
    jobs = len({job for s in scrapes for job in s["jobs"]})
    return Recommendation(servers, len(scrapes), consumption, throughput, stall, ranks, jobs, stall_target)


def parse_metrics(text: str) -> dict[str, Any]:
    """A server's scaling series from its /metrics exposition."""
    jobs: dict[str, list[float]] = {}
    throughput = 0.0
    columns = {
        "shardstream_job_data_stall_ratio": 0,
        "shardstream_job_consumption_samples_per_second": 1,
        "shardstream_job_reporting_ranks": 2,
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "shardstream_server_samples_per_second":
                throughput += sample.value
            elif sample.name in columns:
                jobs.setdefault(sample.labels.get("job_name", ""), [0.0, 0.0, 0.0])[columns[sample.name]] = sample.value
    return {"throughput": throughput, "jobs": {j: (v[0], v[1], int(v[2])) for j, v in jobs.items()}}


def _scrape(server: str, timeout_s: float) -> dict[str, Any]:
    url = server if "://" in server else f"http://{server}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            text = answer.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise UnavailableError(
            f"cannot read the metrics of {server} ({url}): {reason}: is it a server's metrics port (serve --metrics-port)?"
        ) from None
    try:
        scrape = parse_metrics(text)
    except ValueError as exc:
        raise InvalidArgumentError(f"{url} does not serve Prometheus metrics: {exc}") from None
    if "shardstream_server_samples_per_second" not in text:
        raise InvalidArgumentError(f"{url} is not a shardstream server's metrics port (or predates stall reports)")
    return scrape


def _cmd_recommend(args: argparse.Namespace) -> int:
    r = recommend([_scrape(s, args.timeout) for s in args.server], args.stall_target)
    if args.json:
        print(json.dumps(asdict(r), indent=1))
        return 0
    print(f"recommended servers: {r.servers} (asked: {r.now})")
    print(f"  consumption  {r.consumption:.1f} samples/s ({r.ranks} rank(s) of {r.jobs} job(s) reporting)")
    print(f"  throughput   {r.throughput:.1f} samples/s per server (mean of {r.now})")
    extra = ": +1 server" if r.stall > r.stall_target else ""
    print(f"  stall        {r.stall:.1%} of the trainers' time waiting for data (target {r.stall_target:.0%}){extra}")
    if not r.ranks:
        print("  (no trainer reports: Loader(report_interval_s=...) sends them; 0 turns them off)")
    return 0


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1 (0.05: 5%%), got {text}")
    return value


def add_commands(sub: Any) -> None:
    group = common.add_command(
        sub,
        "fleet",
        None,
        help="the fleet's size from the trainers' stall: recommend",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        epilog=common.examples("shardstream fleet recommend --server srv-a:9090 --server srv-b:9090"),
    )
    cmds = group.add_subparsers(dest="fleet_command", metavar="COMMAND", required=True)
    sp = common.add_command(
        cmds,
        "recommend",
        _cmd_recommend,
        help="how many servers the trainers' consumption and stall ask for",
        description="Read the trainers' reports from each server's metrics port (what the Loaders reading from it "
        "waited for data and consumed, and what the server sent) and print how many servers they ask for: "
        "ceil(total consumption / mean per-server throughput), plus one while the trainers' mean stall is above "
        "--stall-target, at least 1. Name every server of the fleet: the sums are over the servers named. "
        "Prometheus records the same number, with hysteresis, as shardstream_fleet_desired_servers "
        "(deploy/prometheus/scaling.yaml).",
        epilog=common.examples(
            "shardstream fleet recommend --server 127.0.0.1:9090",
            "shardstream fleet recommend --server srv-a:9090 --server srv-b:9090 --stall-target 0.02",
            "shardstream fleet recommend --server srv-a:9090 --json",
        ),
    )
    sp.add_argument(
        "--server", action="append", required=True, metavar="HOST:PORT",
        help="a server's metrics port (serve --metrics-port); repeat for every server of the fleet",
    )  # fmt: skip
    sp.add_argument(
        "--stall-target", type=_fraction, default=DEFAULT_STALL_TARGET,
        help="add a server while the trainers wait for data more than this share of their time (default 0.05)",
    )  # fmt: skip
    sp.add_argument("--timeout", type=common.timeout_seconds, default=5.0, help="seconds to wait for each server (default 5)")
    common.json_option(sp)
