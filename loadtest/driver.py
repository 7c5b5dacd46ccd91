"""`python -m loadtest`: M shard-reader servers, N simulated training ranks, one measured window.

    python -m loadtest [--servers 2] [--ranks 2] [--step-ms 10] [--duration 10 | --batches N] [--batch-size 256]
                       [--root PATH|s3://BUCKET/PREFIX] [--s3-endpoint URL] [--dataset NAME]
                       [--rows 200000] [--dim 64] [--shuffle block] [--epochs 0] [--prefetch 8] [--streams 1]
                       [--cache-mib 1024] [--json OUT] [--png OUT]

It builds a dataset (or reuses --dataset under --root: `id` int64 + `vec` fixed_size_list<float32>
[--dim], random values), starts M `shardstream serve` processes over the root (each with Prometheus
/metrics) and N rank processes (loadtest/rank.py): rank r of world N is a `Loader` over all M
endpoints that sleeps --step-ms per batch to simulate compute. Every rank starts at the same moment
(ready files, then one go file) and runs for --duration seconds or until its --epochs are done. With
--batches N the work is fixed instead: every rank takes N batches (fewer only when its --epochs end
first), however long that takes — what a test on a busy machine can rely on; --duration 0 likewise
lifts the time limit of an --epochs run.

Reported per rank and in total: samples/s, MB/s (10^6 B/s of delivered Arrow payload), p50/p99 batch
wait (time the loop spent in `next()`, the first batch apart), data-stall fraction (wait / loop
time), CPU seconds and peak RSS of every process (servers and ranks); storage read amplification =
bytes of row groups the servers read from storage (`shardstream_storage_read_bytes_total`, decoded;
for S3 also the fetched bytes) / bytes delivered to the ranks. When the ranks ran whole epochs it
also checks that every global position was delivered exactly once and, for a generated dataset,
that the `id`s add up. JSON (--json) and a PNG plot (--png). Figures only: exits 0 unless something
broke; the checks are reported, and failed checks make the exit code 1.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.common import log, versions, write_vectors
from shardstream.manifest import Manifest
from shardstream.server.backends.roots import open_registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

from .fleet import RankProcess, Sampler, scrape, tree_cpu_s, tree_peak_rss_mib, tree_reset_peak

__all__ = ["LoadConfig", "run_load"]

READY_TIMEOUT_S = 180.0  # 8 ranks importing pyarrow/grpc on 2 busy cores take a while
EXIT_MARGIN_S = 120.0
# A run without a time limit (--batches, or --duration 0 with --epochs) is given this long before it
# counts as hung: a guard against a hang, not a window the work must fit in.
HANG_TIMEOUT_S = 1800.0
MIB = 1 << 20
TIMELINE_BIN_S = 0.25
SHUFFLES = ("none", "block", "full")
OUTPUTS = ("numpy", "torch", "arrow")


@dataclass
class LoadConfig:
    servers: int = 2
    ranks: int = 2
    step_ms: float = 10.0
    duration_s: float = 10.0  # 0: no time limit (the work is bounded by `batches` or `epochs`)
    batches: int = 0  # > 0: fixed work, every rank stops after this many batches (duration_s unused)
    batch_size: int = 256
    root: str | None = None  # None: a temporary directory, removed at the end
    s3_endpoint: str | None = None
    dataset: str | None = None  # None: a generated dataset named after --rows/--dim
    rows: int = 200_000
    dim: int = 64
    row_group_rows: int | None = None  # None: ingest's default (~4 MiB row groups)
    shuffle: str = "block"
    seed: int = 0
    epochs: int = 0  # 0: endless (the duration ends the run)
    prefetch: int = 8
    streams: int = 1  # Loader(streams=K): each rank over K streams striped over the servers
    output: str = "numpy"
    cache_mib: int = 1024
    cache_dir: str | None = None  # one `serve --cache-dir` shared by every server (a node-local tier)
    max_message_bytes: int = 0  # 0: the server's default (~2 MiB)
    server_env: dict[str, str] = field(default_factory=dict)

    @property
    def time_limit_s(self) -> float:
        """How long each rank runs at most (0: no limit; fixed work)."""
        return 0.0 if self.batches else self.duration_s

    @property
    def work(self) -> str:
        """What ends the run, in words."""
        ends = [f"{self.batches} batches a rank"] if self.batches else []
        ends += [f"{self.epochs} epochs"] if self.epochs else []
        ends += [f"{self.time_limit_s:g} s"] if self.time_limit_s else []
        return " or ".join(ends)

    def check(self) -> None:
        for name in ("servers", "ranks", "batch_size", "rows", "dim", "prefetch", "streams", "cache_mib"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.step_ms < 0 or self.duration_s < 0 or self.epochs < 0 or self.batches < 0:
            raise ValueError("--step-ms, --duration, --epochs and --batches must be >= 0")
        if self.duration_s == 0 and not (self.batches or self.epochs):
            raise ValueError("--duration 0 (no time limit) needs --batches or --epochs to end the run")
        if self.shuffle not in SHUFFLES:
            raise ValueError(f"--shuffle must be one of {', '.join(SHUFFLES)}, got {self.shuffle!r}")
        if self.output not in OUTPUTS:
            raise ValueError(f"--output must be one of {', '.join(OUTPUTS)}, got {self.output!r}")


# --- dataset -----------------------------------------------------------------------------------
def dataset_name(cfg: LoadConfig) -> str:
    rg = f"-g{cfg.row_group_rows}" if cfg.row_group_rows else ""
    return cfg.dataset or f"lt-r{cfg.rows}-d{cfg.dim}{rg}"


def ensure_dataset(cfg: LoadConfig, root: str, workdir: Path) -> tuple[Manifest, bool]:
    """(manifest, built now): reuse `name` under `root` when it exists, else generate and ingest it."""
    name = dataset_name(cfg)
    with open_registry(root, s3_endpoint=cfg.s3_endpoint) as registry:
        if registry.latest(name) is not None:
            return registry.resolve(name), False
        if cfg.dataset is not None and not cfg.dataset.startswith("lt-"):
            raise ValueError(
                f"dataset {cfg.dataset!r} is not under {root} (generated names start with 'lt-')"
            )
        src = workdir / f"{name}.parquet"
        write_vectors(src, cfg.rows, cfg.dim)
        try:
            opts = IngestOptions(row_group_rows=cfg.row_group_rows, progress=False)
            return ingest(src, name, registry, opts), True
        finally:
            src.unlink(missing_ok=True)


def _row_groups(m: Manifest) -> int:
    return sum(len(s.row_groups) for s in m.shards)


# --- statistics --------------------------------------------------------------------------------
def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


def rank_stats(summary: dict[str, Any], rec: dict[str, np.ndarray]) -> dict[str, Any]:
    waits = rec["wait_s"]
    steady = waits[1:]
    wall = summary["wall_s"]
    loop_after_first = wall - (waits[0] if len(waits) else 0.0)
    return {
        **summary,
        "samples_per_s": summary["rows"] / wall if wall > 0 else 0.0,
        "mb_per_s": summary["bytes"] / wall / 1e6 if wall > 0 else 0.0,
        "first_batch_ms": _ms(float(waits[0])) if len(waits) else None,
        "wait_p50_ms": _ms(_pct(steady, 50)),
        "wait_p99_ms": _ms(_pct(steady, 99)),
        "wait_s": float(waits.sum()),
        # Share of the loop's time spent waiting for data, after the first batch (start-up apart).
        "stall_fraction": float(steady.sum()) / loop_after_first if loop_after_first > 0 else None,
        "stall_fraction_with_first": float(waits.sum()) / wall if wall > 0 else None,
    }


def check_delivery(
    recs: list[dict[str, np.ndarray]], summaries: list[dict[str, Any]], manifest: Manifest, generated: bool
) -> dict[str, Any]:
    """Exactly-once over global positions (whole epochs only), rows vs positions, `id` sums."""
    n = manifest.num_rows
    out: dict[str, Any] = {
        "rows_equal_positions": all(s["id_count"] == s["rows"] for s in summaries) if generated else None,
        "whole_epochs": all(s["finished_epochs"] for s in summaries),
        "positions_exactly_once": None,
        "ids_add_up": None,
    }
    if not out["whole_epochs"]:
        return out
    pos = np.concatenate([r["positions"] for r in recs]) if recs else np.empty((0, 3), np.int64)
    pos = pos[pos[:, 2] > pos[:, 1]]  # ranks with no rows in a short last step
    epochs = sorted(set(pos[:, 0].tolist()))
    ok = bool(epochs)
    for e in epochs:
        p = pos[pos[:, 0] == e]
        p = p[np.argsort(p[:, 1])]
        ok = ok and p[0, 1] == 0 and p[-1, 2] == n and bool((p[1:, 1] == p[:-1, 2]).all())
    out["positions_exactly_once"] = ok
    out["epochs_checked"] = len(epochs)
    if generated:
        out["ids_add_up"] = sum(s["id_sum"] for s in summaries) == len(epochs) * n * (n - 1) // 2
    return out


# --- the run -----------------------------------------------------------------------------------
def _wait_ready(ranks: list[RankProcess]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(r.ready for r in ranks):
        for r in ranks:
            r.check_alive("ready")
        if time.monotonic() > deadline:
            raise TimeoutError(f"ranks not ready after {READY_TIMEOUT_S:g} s")
        time.sleep(0.02)


def _wait_exit(ranks: list[RankProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for r in ranks:
        assert r.proc is not None
        try:
            code = r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except Exception as exc:
            raise TimeoutError(f"rank {r.rank} still running after {timeout_s:g} s:\n{r.log_tail()}") from exc
        if code != 0:
            raise RuntimeError(f"rank {r.rank} exited with code {code}:\n{r.log_tail()}")


def run_load(cfg: LoadConfig, workdir: Path | None = None) -> dict[str, Any]:
    """One load test; the result as a JSON-able dict (see the module docstring)."""
    cfg.check()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shardstream-loadtest-")))
        root = cfg.root or str(workdir / "root")
        t0 = time.perf_counter()
        manifest, built = ensure_dataset(cfg, root, workdir)
        generated = dataset_name(cfg).startswith("lt-")
        log(
            f"dataset {manifest.ref}: {manifest.num_rows} rows, {manifest.num_bytes / MIB:.1f} MiB in "
            f"{len(manifest.shards)} shards / {_row_groups(manifest)} row groups "
            f"({'built' if built else 'reused'} in {time.perf_counter() - t0:.1f} s)"
        )
        env = dict(cfg.server_env)
        args: tuple[str, ...] = ("--cache-mib", str(cfg.cache_mib))
        if cfg.s3_endpoint:
            args += ("--s3-endpoint", cfg.s3_endpoint)
        if cfg.cache_dir:
            args += ("--cache-dir", cfg.cache_dir)
        servers = [LocalServer(root, metrics=True, extra_args=args, env=env) for _ in range(cfg.servers)]
        for s in servers:
            stack.callback(s.stop)
            s.start()
        endpoints = [s.target for s in servers]
        ranks = []
        for r in range(cfg.ranks):
            rp = RankProcess(
                workdir,
                {
                    "endpoints": endpoints,
                    "dataset": str(manifest.ref),
                    "rank": r,
                    "world_size": cfg.ranks,
                    "batch_size": cfg.batch_size,
                    "seed": cfg.seed,
                    "shuffle": cfg.shuffle,
                    "epochs": cfg.epochs or None,
                    "output": cfg.output,
                    "prefetch": cfg.prefetch,
                    "streams": cfg.streams,
                    "max_message_bytes": cfg.max_message_bytes,
                    "step_ms": cfg.step_ms,
                    "duration_s": cfg.time_limit_s,
                    "batches": cfg.batches,
                    "go_path": str(workdir / "go"),
                },
            )
            stack.callback(rp.kill)
            rp.start()
            ranks.append(rp)
        _wait_ready(ranks)
        before = [scrape(s) for s in servers]
        for s in servers:
            assert s.proc is not None
            tree_reset_peak(s.proc.pid)
        cpu0 = [tree_cpu_s(s.proc.pid) for s in servers if s.proc is not None]
        pids = {f"server {i}": s.proc.pid for i, s in enumerate(servers) if s.proc is not None}
        pids.update({f"rank {r.rank}": r.proc.pid for r in ranks if r.proc is not None})
        log(f"{cfg.servers} servers, {cfg.ranks} ranks ready; go for {cfg.work}")
        t_go = time.perf_counter()
        with Sampler(pids) as sampler:
            (workdir / "go").write_text("go")
            _wait_exit(ranks, cfg.time_limit_s + EXIT_MARGIN_S if cfg.time_limit_s else HANG_TIMEOUT_S)
        window_s = time.perf_counter() - t_go
        after = [scrape(s) for s in servers]
        server_rows = []
        for i, s in enumerate(servers):
            assert s.proc is not None
            delta = {k: after[i][k] - before[i][k] for k in before[i]}
            server_rows.append(
                {
                    "index": i,
                    "target": s.target,
                    "pid": s.proc.pid,
                    "cpu_s": tree_cpu_s(s.proc.pid) - cpu0[i],
                    "peak_rss_mib": tree_peak_rss_mib(s.proc.pid),
                    "metrics": delta,
                }
            )
        summaries = [r.result() for r in ranks]
        recs = [dict(np.load(r.cfg["record_path"])) for r in ranks]
    per_rank = [rank_stats(s, rec) for s, rec in zip(summaries, recs, strict=True)]
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest", *sys.argv[1:]]),
        "config": asdict(cfg),
        "versions": versions("shardstream", "grpcio", "protobuf", "uvloop", "psutil"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "dataset": {
            "ref": str(manifest.ref),
            "root": cfg.root or "(temporary directory)",
            "rows": manifest.num_rows,
            "bytes_on_storage": manifest.num_bytes,
            "shards": len(manifest.shards),
            "row_groups": _row_groups(manifest),
            "built": built,
            "row_bytes": 8 + 4 * cfg.dim if generated else None,
        },
        "window_s": window_s,
        "ranks": per_rank,
        "servers": server_rows,
        "total": totals(per_rank, server_rows, recs),
        "check": check_delivery(recs, summaries, manifest, generated),
        "timeline": {
            "samples": sampler.samples,
            "bin_s": TIMELINE_BIN_S,
            "samples_per_s": {
                f"rank {r['rank']}": _binned(rec) for r, rec in zip(per_rank, recs, strict=True)
            },
            "wait_ms_sorted": {
                f"rank {r['rank']}": _quantiles(rec["wait_s"][1:] * 1e3)
                for r, rec in zip(per_rank, recs, strict=True)
            },
        },
    }


def _binned(rec: dict[str, np.ndarray]) -> list[float]:
    """Samples/s of one rank per TIMELINE_BIN_S of its loop."""
    if not len(rec["end_s"]):
        return []
    bins = (rec["end_s"] // TIMELINE_BIN_S).astype(np.int64)
    return (np.bincount(bins, weights=rec["rows"]) / TIMELINE_BIN_S).tolist()


def _quantiles(values: np.ndarray, points: int = 200) -> list[float]:
    """`points` evenly spaced quantiles (a CDF small enough for the JSON)."""
    if not len(values):
        return []
    return np.quantile(values, np.linspace(0, 1, points)).tolist()


def totals(
    per_rank: list[dict[str, Any]], servers: list[dict[str, Any]], recs: list[dict[str, np.ndarray]]
) -> dict[str, Any]:
    rows = sum(r["rows"] for r in per_rank)
    nbytes = sum(r["bytes"] for r in per_rank)
    wall = max((r["wall_s"] for r in per_rank), default=0.0)
    steady = np.concatenate([rec["wait_s"][1:] for rec in recs]) if recs else np.empty(0)
    read = sum(s["metrics"]["shardstream_storage_read_bytes_total"] for s in servers)
    fetched = sum(s["metrics"]["shardstream_storage_fetched_bytes_total"] for s in servers)
    stalls = [r["stall_fraction"] for r in per_rank if r["stall_fraction"] is not None]
    return {
        "rows": rows,
        "bytes": nbytes,
        "batches": sum(r["batches"] for r in per_rank),
        "wall_s": wall,
        "samples_per_s": rows / wall if wall > 0 else 0.0,
        "mb_per_s": nbytes / wall / 1e6 if wall > 0 else 0.0,
        "wait_p50_ms": _ms(_pct(steady, 50)),
        "wait_p99_ms": _ms(_pct(steady, 99)),
        "stall_fraction_mean": statistics.mean(stalls) if stalls else None,
        "stall_fraction_max": max(stalls) if stalls else None,
        "storage_read_bytes": read,
        "storage_fetched_bytes": fetched,
        "read_amplification": read / nbytes if nbytes else None,
        "fetched_amplification": fetched / nbytes if nbytes and fetched else None,
        "server_bytes_sent": sum(s["metrics"]["shardstream_bytes_sent_total"] for s in servers),
        "server_rows_sent": sum(s["metrics"]["shardstream_rows_sent_total"] for s in servers),
        "server_cpu_s": sum(s["cpu_s"] for s in servers),
        "rank_cpu_s": sum(r["cpu_s"] for r in per_rank),
        "server_peak_rss_mib": max((s["peak_rss_mib"] or 0.0 for s in servers), default=None),
        "rank_peak_rss_mib": max((r["peak_rss_mib"] or 0.0 for r in per_rank), default=None),
    }
