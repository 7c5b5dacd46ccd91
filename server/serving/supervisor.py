"""A server that uses every core: a supervisor of N worker processes sharing one port.

Python serves one core per process, so `shardstream serve --workers N` runs N processes, each a
complete server (`app.serve`: ShardStream, health, reflection, its own row-group cache) listening on
the same port with SO_REUSEPORT; the kernel spreads incoming connections over them.

The port is still one server's: before any worker starts, the supervisor binds it once without
SO_REUSEPORT (a listener of anyone else — another shardstream, another program — makes that fail with
one clear line), then holds a non-listening SO_REUSEPORT socket on it for its whole life, so nothing
without SO_REUSEPORT can take it while workers start or restart. Port 0 is resolved then, once.

Lifecycle (the supervisor's main loop):
- ready: once every worker has written its ready file, the supervisor writes `--ready-file` with
  port, data_port (worker 0's, as its own ready file names it: the port it bound), data_ports (every
  worker's, by slot), metrics_port, its own pid and the workers' pids (rewritten when a worker is
  replaced);
- SIGTERM/SIGINT: every worker gets SIGTERM and drains (health NOT_SERVING on all of them, in-flight
  streams get the grace period); the supervisor exits 0 once they all have stopped;
- a worker that dies is restarted at once and the death logged. Servers are stateless and the port
  stays reserved, so a restart loses nothing but the streams that worker carried (clients resume
  them elsewhere). A worker that dies before it ever served, or more than MAX_RESTARTS times within
  RESTART_WINDOW_S, stops the supervisor with exit code 1 (a crash loop is for Kubernetes to see).
Workers stay in the supervisor's process group (killpg reaches them all) and get SIGTERM if the
supervisor dies (PR_SET_PDEATHSIG, server/worker_process.py). Each worker's config, with the grant key the workers
share (policy/grants.py), reaches it through its stdin, a pipe the supervisor writes and closes: nothing
secret is on a worker's command line or in its environment (any local user reads /proc/PID/cmdline).

Metrics: workers write prometheus-client's multiprocess files into a private directory; the
supervisor serves `/metrics` on `--metrics-port`, summing counters and histograms over all workers
(dead ones included, so totals never go back) and the `livesum` gauges over live ones, plus
`shardstream_workers`, `shardstream_worker_restarts_total`, `shardstream_build_info` and every
process's CPU, RSS and open descriptors (`process_*{worker="0".."N-1"|"supervisor"}`,
process_metrics.py). Its /healthz and /readyz answer for the workers (status_http.py).

`--workers auto` (cfg.autoscale_max_workers): start one worker and, every autoscale_interval_s once
all serve, grow or shrink by one on the trainers' stall (worker_scaling.py, rules in autoscale.py),
between 1 and autoscale_max_workers (the usable CPUs by default). A worker added takes the lowest
free slot (its data port: data_port + slot; every slot's port is checked at start); a worker removed
is the highest slot, drained as on SIGTERM (health NOT_SERVING, its streams get the grace, then
their clients resume on another worker at the first position not yet received) and not restarted;
its slot is free again once it has exited. Streams follow the workers (with a fixed count too):
every PUBLISH_INTERVAL_S the supervisor publishes each serving worker's streams (placement.py), so
GetDataset names the least busy worker's data port and a worker above its fair share hands streams
back at a step boundary (rules: rebalance.py). Each worker's share of the cache, streams and buffer is
sized for the most workers, so the server's memory stays as sized at any count.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from shardstream import kernels
from shardstream.errors import UnavailableError

from ..backends.roots import open_registry
from ..policy.grants import new_key
from ..read.spill import SpillTier
from .autoscale import AutoscalePolicy
from .config import ServerConfig
from .cpus import cpu_of_slot, usable_cpus
from .placement import PLACEMENT_FILE, PlacementWriter, SlotOf
from .ports import reserve_port
from .process_metrics import WorkerProcessCollector, register_build_info
from .ready import write_ready_file
from .status_http import Health, start_status_server
from .worker_scaling import WorkerScaler

__all__ = ["MAX_RESTARTS", "RESTART_WINDOW_S", "supervise"]

log = logging.getLogger("shardstream.server.serving.supervisor")

MAX_RESTARTS = 5  # worker restarts tolerated within RESTART_WINDOW_S before giving up
RESTART_WINDOW_S = 60.0
WORKER_START_TIMEOUT_S = 120.0  # from spawn to its ready file
STOP_MARGIN_S = 10.0  # beyond the grace period, before a draining worker is killed
TICK_S = 0.05  # supervisor loop period
TMP_PREFIX = "shardstream-workers-"  # + supervisor pid: ready files and metrics of its workers


def _remove_dead_supervisors_dirs() -> None:
    """Remove the temporary directories of this user's supervisors that were killed (SIGKILL leaves them)."""
    for d in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*-*"):
        try:
            pid = int(d.name[len(TMP_PREFIX) :].split("-", 1)[0])
            if d.stat().st_uid != os.getuid():
                continue
            os.kill(pid, 0)  # alive (or another process reused its pid): keep
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, OSError):
            continue


@dataclass
class _Worker:
    slot: int
    proc: subprocess.Popen[bytes]
    ready_path: Path
    spawned_s: float
    ready: bool = False
    data_port: int | None = None  # its data plane's, from its ready file
    added: bool = False  # by the autoscaler: if it never serves, the server stays at the count it had


class StopRequest:
    """A stop asked for by a signal handler (`request`), waited for by the main loop (`wait`).

    Not a `threading.Event`: its `set()` takes the Event's lock, and Python runs a signal handler in
    the main thread between two bytecodes — when that thread is inside `Event.wait()`, holding the
    same lock, the handler waits on itself for ever (the class of python/cpython#126434). The
    supervisor's loop spends its life in that wait, so a SIGTERM could hang it until the kubelet's
    SIGKILL (a pod stop seen once in CI, 30 s then exit 137; tests/test_workers.py makes the race
    frequent). Here the handler only sets an attribute, and the loop sleeps: a signal's handler runs
    during the sleep, which then finishes its tick (PEP 475), so a stop is seen within `timeout_s`."""

    def __init__(self) -> None:
        self.requested = False

    def request(self, *_: object) -> None:  # the signal handler: one attribute set, no lock taken
        self.requested = True

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to `timeout_s` unless a stop was requested; whether one was."""
        if not self.requested:
            time.sleep(timeout_s)
        return self.requested


class Supervisor:
    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self._stop = StopRequest()
        _remove_dead_supervisors_dirs()
        self._tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
        self.metrics_dir = self._tmp / "metrics"
        self.metrics_dir.mkdir()
        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry, path=str(self.metrics_dir))
        self._live = Gauge("shardstream_workers", "Worker processes serving", registry=self.registry)
        self._restarts = Counter(
            "shardstream_worker_restarts_total",
            "Worker processes restarted after dying",
            registry=self.registry,
        )
        register_build_info(self.registry)
        self.registry.register(WorkerProcessCollector(self._processes))
        # /readyz: the workers serve (one at least, while a dead one is replaced) and no drain began
        self.health = Health(serving=lambda: any(w.ready and w.proc.poll() is None for w in self._workers))
        self._workers: list[_Worker] = []
        self._draining: list[_Worker] = []  # removed by the autoscaler, finishing their streams
        self.scaler = (
            WorkerScaler(AutoscalePolicy(1, cfg.autoscale_max_workers), self.metrics_dir, self.registry)
            if cfg.autoscale_max_workers > 1
            else None
        )
        # every worker's streams, for GetDataset and rebalancing (placement.py)
        self.placement = PlacementWriter(self._tmp / PLACEMENT_FILE, self.metrics_dir, self.registry)
        self._restart_times: deque[float] = deque()
        self._spawned = 0
        self._restart_count = 0
        self.port = 0
        self.data_port = 0
        self.grant_key = cfg.grant_key or new_key()  # the workers vouch for each other's grants
        self.metrics_port: int | None = None

    # --- lifecycle -----------------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        with open_registry(cfg.root, s3_endpoint=cfg.s3_endpoint) as registry:
            registry.storage.check_root()  # one clear line here rather than one per worker
        if cfg.cache_dir:
            SpillTier(cfg.cache_dir, cfg.cache_dir_bytes)  # likewise: usable, and stale files cleaned
        self.port, held = reserve_port(cfg.host, cfg.port)
        if cfg.data_port:
            # Each worker's Flight data plane has a port of its own (pyarrow's Flight server binds
            # without SO_REUSEPORT): data_port + slot; GetDataset names the answering worker's.
            try:
                for slot in range(cfg.worker_slots):
                    reserve_port(cfg.host, cfg.data_port + slot, hold=False)
            except BaseException:
                for s in held:
                    s.close()
                raise
            self.data_port = cfg.data_port
        httpd = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop_signal)
        try:
            if cfg.metrics_port is not None:
                httpd = start_status_server(cfg.metrics_port, cfg.host, self.registry, self.health)
                self.metrics_port = httpd.server_port
            self._workers = [self._spawn(slot) for slot in range(cfg.workers)]
            failure = self._watch()
        finally:
            codes = self._stop_workers()
            for s in held:
                s.close()
            if httpd is not None:
                httpd.shutdown()
            self._cleanup()
        if failure:
            raise UnavailableError(failure)
        stuck = [pid for pid, code in codes.items() if code not in (0, -signal.SIGTERM, -signal.SIGINT)]
        if stuck:
            raise UnavailableError(f"worker(s) {stuck} did not stop cleanly: {codes}")
        log.info("stopped")

    def _on_stop_signal(self, *_: object) -> None:  # in a signal handler: see StopRequest
        self.health.draining = True
        self._stop.request()

    def _processes(self) -> list[tuple[str, int]]:
        """(worker label, pid) of this supervisor and its live workers, for the process metrics."""
        live = [(str(w.slot), w.proc.pid) for w in self._workers + self._draining if w.proc.poll() is None]
        return [("supervisor", os.getpid()), *live]

    def _spawn(self, slot: int) -> _Worker:
        self._spawned += 1
        ready = self._tmp / f"worker-{slot}-{self._spawned}.json"
        wcfg = dataclasses.replace(
            self.cfg,
            workers=1,
            autoscale_max_workers=0,
            port=self.port,
            data_port=self.data_port + slot if self.data_port else 0,
            advertised_data_port=self.cfg.advertised_data_port + slot if self.cfg.advertised_data_port else 0,
            grant_key=self.grant_key,
            metrics_port=None,
            ready_file=str(ready),
            reuse_port=True,
            worker_slot=slot,
            worker_cpu=cpu_of_slot(slot) if self.cfg.pin_workers else -1,
            placement_file=str(self.placement.path),
            **self.cfg.worker_shares(self.cfg.worker_slots),  # the server's memory stays as sized
        )
        # The config (the grant key with it) goes through the worker's stdin, never its command line
        # or environment: any local user reads /proc/PID/cmdline.
        cmd = [sys.executable, "-m", "shardstream.server.worker_process", str(os.getpid())]
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir)}
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE)  # same process group, stdout, stderr
        assert proc.stdin is not None
        try:  # a few KB: the pipe's buffer takes it all, the write does not wait for the worker
            proc.stdin.write(json.dumps(dataclasses.asdict(wcfg)).encode())
        except BrokenPipeError:
            pass  # it died at once: _watch sees its exit code
        finally:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
        return _Worker(slot, proc, ready, time.monotonic())

    def _watch(self) -> str | None:
        """Run until asked to stop (None) or unable to go on (what went wrong)."""
        announced: list[int] | None = None
        next_scale = time.monotonic() + self.cfg.autoscale_interval_s
        while not self._stop.requested:
            self._reap_drained()
            failed_to_add: list[_Worker] = []
            for i, w in enumerate(self._workers):
                code = w.proc.poll()
                if w.added and not w.ready and (
                    code is not None or time.monotonic() - w.spawned_s > WORKER_START_TIMEOUT_S
                ):
                    failed_to_add.append(w)
                    continue
                if code is not None:
                    if announced is None:
                        return f"worker {w.proc.pid} exited with code {code} before serving"
                    mark_process_dead(w.proc.pid, str(self.metrics_dir))
                    now = time.monotonic()
                    while self._restart_times and now - self._restart_times[0] > RESTART_WINDOW_S:
                        self._restart_times.popleft()
                    if len(self._restart_times) >= MAX_RESTARTS:
                        return (
                            f"worker {w.proc.pid} exited with code {code}: more than {MAX_RESTARTS} "
                            f"restarts in {RESTART_WINDOW_S:g} s, giving up"
                        )
                    self._restart_times.append(now)
                    log.warning("worker %d exited with code %s; starting another", w.proc.pid, code)
                    self._restarts.inc()
                    self._restart_count += 1
                    self._workers[i] = self._spawn(w.slot)
                elif not w.ready:
                    if w.ready_path.exists():
                        w.ready = True
                        w.data_port = _data_port_of(w.ready_path)
                    elif time.monotonic() - w.spawned_s > WORKER_START_TIMEOUT_S:
                        return f"worker {w.proc.pid} not serving after {WORKER_START_TIMEOUT_S:g} s"
            for w in failed_to_add:
                self._drop_added(w)
            serving = [w.proc.pid for w in self._workers if w.ready]
            self._live.set(len(serving))
            if len(serving) == len(self._workers) and serving != announced:
                self._announce(serving, first=announced is None)
                announced = serving
            if self.placement.due():
                self._publish_placement()
            if self.scaler is not None and time.monotonic() >= next_scale:
                next_scale = time.monotonic() + self.cfg.autoscale_interval_s
                if len(serving) == len(self._workers):  # decide on serving workers only
                    # a pinned worker has its CPU; unpinned, the workers share the usable ones
                    each = 1.0 if self.cfg.pin_workers else usable_cpus() / max(1, len(serving))
                    self._scale_to(self.scaler.evaluate(len(serving), serving, each).workers)
            self._stop.wait(TICK_S)
        return None

    def _scale_to(self, n: int) -> None:
        """Add a worker (the lowest free slot) or drain the highest; one step per call."""
        if n > len(self._workers):
            used = {w.slot for w in self._workers + self._draining}
            free = [slot for slot in range(self.cfg.worker_slots) if slot not in used]
            if not free:  # every slot busy: a drained worker still finishing its streams
                log.info("autoscale: no free slot until a draining worker exits")
                return
            w = self._spawn(free[0])
            w.added = True
            self._workers.append(w)
            self._workers.sort(key=lambda w: w.slot)
        elif n < len(self._workers):
            w = max(self._workers, key=lambda w: w.slot)
            self._workers.remove(w)
            log.info("autoscale: draining worker %d (slot %d): %.1f s grace for its streams", w.proc.pid, w.slot, self.cfg.grace_s)
            w.proc.send_signal(signal.SIGTERM)
            self._draining.append(w)

    def _publish_placement(self) -> None:
        """Every serving worker's streams and data port (placement.py); a shed round only while every
        worker serves and none drains."""
        serving = [w for w in self._workers if w.ready and w.proc.poll() is None]
        advertised = self.cfg.advertised_data_port
        slots = [SlotOf(w.slot, w.proc.pid, advertised + w.slot if advertised else w.data_port or 0) for w in serving]
        self.placement.publish(slots, settled=len(serving) == len(self._workers) and not self._draining)

    def _drop_added(self, w: _Worker) -> None:
        """An added worker that did not come to serve (its data port taken since the start, a crash):
        the server stays at the count it had (the autoscaler may try again after its cooldown)."""
        if w.proc.poll() is None:
            w.proc.kill()
        code = w.proc.wait()
        mark_process_dead(w.proc.pid, str(self.metrics_dir))
        self._workers.remove(w)
        port = f"data port {self.data_port + w.slot}" if self.data_port else "its data port"
        log.error(
            "autoscale: the worker added in slot %d (pid %d) did not serve (exit code %s; is %s free?): "
            "staying at %d workers", w.slot, w.proc.pid, code, port, len(self._workers),
        )  # fmt: skip

    def _reap_drained(self) -> None:
        """Forget the drained workers that have exited (their slots are free again)."""
        for w in list(self._draining):
            code = w.proc.poll()
            if code is not None:
                mark_process_dead(w.proc.pid, str(self.metrics_dir))
                self._draining.remove(w)
                log.info("autoscale: worker %d (slot %d) drained, exit code %s", w.proc.pid, w.slot, code)

    def _announce(self, pids: list[int], *, first: bool) -> None:
        self.health.started = True
        if first:
            log.info(
                "serving on %s:%d with %d workers %s (metrics on %s; %s)",
                self.cfg.host,
                self.port,
                len(pids),
                pids,
                self.metrics_port or "-",
                kernels.describe(),
            )
        if self.cfg.ready_file:
            # The workers' own data ports (as bound: with --data-port 0 each took a free one)
            data_ports = [w.data_port for w in sorted(self._workers, key=lambda w: w.slot)]
            info = {
                "port": self.port,
                "data_port": data_ports[0] if data_ports else None,
                "data_ports": data_ports,
                "metrics_port": self.metrics_port,
                "pid": os.getpid(),
                "workers": pids,
                "restarts": self._restart_count,
            }
            write_ready_file(self.cfg.ready_file, info)

    def _stop_workers(self) -> dict[int, int | None]:
        """SIGTERM every worker (each drains), wait, kill what lingers; exit code by pid."""
        live = [w for w in self._workers if w.proc.poll() is None]
        self._workers += self._draining  # already told; waited for below
        self._draining = []
        if live:
            log.info("draining %d workers: %.1f s grace for in-flight streams", len(live), self.cfg.grace_s)
        for w in live:
            w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.grace_s + STOP_MARGIN_S
        codes: dict[int, int | None] = {}
        for w in self._workers:
            try:
                codes[w.proc.pid] = w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %d still running after the grace period: killed", w.proc.pid)
                w.proc.kill()
                w.proc.wait()
                codes[w.proc.pid] = None
            mark_process_dead(w.proc.pid, str(self.metrics_dir))
        return codes

    def _cleanup(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def _data_port_of(ready_path: Path) -> int | None:
    """The data port a worker's ready file names (ready.py; written whole, atomically)."""
    try:
        port = json.loads(ready_path.read_text()).get("data_port")
    except (OSError, ValueError, AttributeError):
        return None
    return port if isinstance(port, int) else None


def supervise(cfg: ServerConfig) -> None:
    """Run `cfg.workers` worker processes on one port until SIGTERM/SIGINT (see the module docstring)."""
    Supervisor(cfg).run()
