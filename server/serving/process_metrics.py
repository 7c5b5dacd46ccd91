"""What a fleet's dashboards need of every server process besides its own metrics.

- `shardstream_build_info{version, python, pyarrow, grpc} 1`: which versions each pod runs.
- Process CPU, RSS and open file descriptors of every process of the server: with `--workers N > 1`
  the supervisor serves `process_*` (prometheus-client's ProcessCollector, read from /proc) once per
  process, labelled `worker="0"`..`"N-1"` (a restarted worker keeps its slot; its CPU counter starts
  again, which rate() takes as a reset) and `worker="supervisor"`; sum by pod for the pod's total.
  A single process (`--workers 1`) exports its own, unlabelled, as prometheus-client does.
- No `*_created` series: prometheus-client exports, beside each counter and histogram, a gauge with
  its creation time, which Prometheus stores as one more series each and nothing here reads
  (`disable_created_series`, called once per server process).
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable

import grpc
import pyarrow
from prometheus_client import ProcessCollector, disable_created_metrics
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from shardstream import __version__, kernels

__all__ = [
    "BuildInfoCollector",
    "WorkerProcessCollector",
    "build_info",
    "disable_created_series",
    "register_build_info",
]

_with_build_info: set[int] = set()  # registries given one already (a process may serve twice: tests)


def build_info() -> dict[str, str]:
    return {
        "version": __version__,
        "python": platform.python_version(),
        "pyarrow": pyarrow.__version__,
        "grpc": grpc.__version__,
        "kernels": "native" if kernels.native is not None else "numpy",  # shardstream/kernels.py
    }


def disable_created_series() -> None:
    disable_created_metrics()


def register_build_info(registry: CollectorRegistry) -> None:
    """Add `shardstream_build_info` to `registry` (once)."""
    if id(registry) not in _with_build_info:
        registry.register(BuildInfoCollector())
        _with_build_info.add(id(registry))


class BuildInfoCollector(Collector):
    """`shardstream_build_info{version, python, pyarrow, grpc, kernels} 1`."""

    def __init__(self) -> None:
        self._info = build_info()

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "shardstream_build_info",
            "The versions this server runs (value 1): shardstream, Python, pyarrow, grpcio; kernels native or numpy",
            labels=list(self._info),
        )
        family.add_metric(list(self._info.values()), 1.0)
        yield family


class WorkerProcessCollector(Collector):
    """process_* of each (worker label, pid) that `processes()` lists now, labelled `worker`."""

    def __init__(self, processes: Callable[[], list[tuple[str, int]]]) -> None:
        self._processes = processes
        self._collectors: dict[int, ProcessCollector] = {}

    def _collector(self, pid: int) -> ProcessCollector:
        c = self._collectors.get(pid)
        if c is None:
            c = self._collectors[pid] = ProcessCollector(pid=lambda: pid, registry=None)
        return c

    def collect(self) -> Iterable[Metric]:
        processes = self._processes()
        for pid in set(self._collectors) - {pid for _, pid in processes}:
            del self._collectors[pid]  # a process that is gone
        merged: dict[str, Metric] = {}
        for worker, pid in processes:
            for family in self._collector(pid).collect():  # nothing for a process that just died
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type)
                for s in family.samples:
                    out.add_sample(s.name, {**s.labels, "worker": worker}, s.value)
        yield from merged.values()
