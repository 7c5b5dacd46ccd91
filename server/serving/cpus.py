"""The CPUs a server may use, and a worker pinned to one of them (`serve --pin-workers`).

`usable_cpus` is what `--workers` and `--transform-threads` default to: the process's affinity mask,
capped by a cgroup v2 CPU quota (a Kubernetes limit). With `--pin-workers` the supervisor gives
worker slot i the i-th CPU of its affinity mask (in turn, when there are more slots than CPUs) and
the worker confines itself to it before it starts a thread (`pin`): one worker is then one core's
worth, the unit `--workers auto` adds and removes. Without it, one worker's build and transform
threads spread over every core (measured: a single worker with `--transform-threads 1` decoding
images used 1.8 of 2 cores), and a second worker adds no capacity to a machine the first saturates.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

__all__ = ["cpu_of_slot", "pin", "usable_cpus"]

log = logging.getLogger("shardstream.server")


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (Kubernetes limits)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def cpu_of_slot(slot: int) -> int:
    """The CPU worker `slot` is pinned to: the slot-th of this process's affinity mask, in turn; -1
    where affinity cannot be set (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return -1
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[slot % len(cpus)]


def pin(cpu: int) -> None:
    """Confine this process to `cpu`: every thread it has (imports start some: BLAS, gRPC) and, from
    the calling thread, every thread started later; a warning if it cannot."""
    if cpu < 0:
        return
    try:
        os.sched_setaffinity(0, {cpu})
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), {cpu})
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
    except (AttributeError, OSError) as exc:
        log.warning("cannot pin this worker to CPU %d (%s): it runs on every CPU it may use", cpu, exc)
