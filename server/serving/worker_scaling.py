"""The supervisor's side of `serve --workers auto`: read the trainers' signal, decide, count and log.

Every `autoscale_interval_s` the supervisor (supervisor.py) asks `WorkerScaler.evaluate(workers)`.
It reads what its workers export from the multiprocess metric files it already sums for /metrics
(job_reports.py: per job the trainers' stall — the largest of the workers' means — their
consumption and reporting ranks, summed, and the samples the workers sent per second, summed): no
new port, no call to a worker. The rules are autoscale.py's (pure); this only feeds them and, when
the count moves, counts the decision in `shardstream_autoscale_decisions_total{reason}` and logs one
line saying why. The supervisor applies it: a worker more, or its highest slot drained (SIGTERM: its
streams get the grace, then their clients resume elsewhere at the first position not yet received).
Beside the metric files, each worker's CPU time between two ticks (/proc, as its process_* series),
so that a stall with CPU to spare is not taken for the workers' capacity (autoscale.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, ProcessCollector
from prometheus_client.multiprocess import MultiProcessCollector

from .autoscale import REASONS, AutoscalePolicy, AutoscaleState, Decision, Signal, decide
from .placement import live_by_pid

__all__ = ["WorkerScaler", "cpu_seconds", "signal_from_metrics"]

log = logging.getLogger("shardstream.server.serving.autoscale")

_STALL = "shardstream_job_data_stall_ratio"
_CONSUMPTION = "shardstream_job_consumption_samples_per_second"
_RANKS = "shardstream_job_reporting_ranks"
_SENT = "shardstream_server_samples_per_second"


def signal_from_metrics(metrics_dir: Path) -> Signal:
    """The trainers' signal from the workers' multiprocess files (as /metrics sums them): the stall is
    the mean over every reporting rank (each job's weighted by its ranks), as `fleet recommend` says."""
    jobs: dict[str, list[float]] = {}
    sent = 0.0
    columns = {_STALL: 0, _CONSUMPTION: 1, _RANKS: 2}
    for family in MultiProcessCollector(None, path=str(metrics_dir)).collect():
        for sample in family.samples:
            if sample.name == _SENT:
                sent += sample.value
            elif sample.name in columns:
                jobs.setdefault(sample.labels.get("job_name", ""), [0.0, 0.0, 0.0])[columns[sample.name]] = sample.value
    ranks = sum(int(r) for _, _, r in jobs.values())
    stall = sum(s * r for s, _, r in jobs.values()) / ranks if ranks else 0.0
    consumption = sum(c for _, c, _ in jobs.values())
    return Signal(stall=stall, consumption=consumption, ranks=ranks, sent=sent, busiest=_busiest(metrics_dir))


def _busiest(metrics_dir: Path) -> float:
    """The most samples/s one live worker sent (its own value of the summed gauge)."""
    return max(live_by_pid(metrics_dir, _SENT).values(), default=0.0)


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds process `pid` has used (its threads'), as its process_cpu_seconds_total says; None
    where it is gone or /proc is not there."""
    for family in ProcessCollector(pid=lambda: pid, registry=None).collect():
        if family.name == "process_cpu_seconds":
            return family.samples[0].value
    return None


class _CpuUse:
    """The busiest of some processes' CPU use since the last call, each against `share` CPUs."""

    def __init__(self, read: Callable[[int], float | None], clock: Callable[[], float]) -> None:
        self._read, self._clock = read, clock
        self._last: dict[int, tuple[float, float]] = {}  # pid -> (CPU seconds, when)

    def busiest(self, pids: Sequence[int], share: float) -> float | None:
        """None until two readings of one of them (a worker just started) or without /proc."""
        now = self._clock()
        seen: dict[int, tuple[float, float]] = {}
        busiest: float | None = None
        for pid in pids:
            cpu = self._read(pid)
            if cpu is None:
                continue
            seen[pid] = (cpu, now)
            before = self._last.get(pid)
            if before is not None and now > before[1]:
                use = (cpu - before[0]) / (now - before[1]) / share
                busiest = use if busiest is None else max(busiest, use)
        self._last = seen
        return busiest


class WorkerScaler:
    """The autoscaling state of one supervisor, its decisions counter and its log lines."""

    def __init__(
        self,
        policy: AutoscalePolicy,
        metrics_dir: Path,
        registry: CollectorRegistry,
        *,
        cpu_read: Callable[[int], float | None] = cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.metrics_dir = metrics_dir
        self._cpu = _CpuUse(cpu_read, clock)
        self.state = AutoscaleState()
        self.decisions = Counter(
            "shardstream_autoscale_decisions_total",
            "Worker processes added or drained by serve --workers auto, by why (server/serving/autoscale.py)",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:  # series known to exist: exported from 0
            self.decisions.labels(reason)

    def evaluate(self, workers: int, pids: Sequence[int] = (), cpus_each: float = 1.0) -> Decision:
        """One tick: the count to run next (`workers`: the ones serving now, processes `pids`, each with
        `cpus_each` CPUs of its own); a move is counted and logged."""
        signal = signal_from_metrics(self.metrics_dir)
        signal = replace(signal, busy=self._cpu.busiest(pids, cpus_each))
        decision, self.state = decide(self.policy, self.state, signal, workers)
        if decision.workers != workers:
            self.decisions.labels(decision.reason).inc()
            log.info("autoscale: %d -> %d workers (%s: %s)", workers, decision.workers, decision.reason, decision.why)
        else:  # SHARDSTREAM_LOG_LEVEL=DEBUG: every tick
            log.debug("autoscale: %d workers held (%s: %s)", workers, decision.reason, decision.why)
        return decision
