"""What every fault of the chaos suite runs with: its sizes, its datasets, servers, Redis and S3, and its row.

`Sizes` are the knobs (`make chaos` uses the defaults; tests/test_chaos.py `Sizes.small()`); `Ctx`
builds the datasets once (vectors: `id` + `vec` of random float32, as `python -m loadtest` makes
them; texts: `id` + `text` starting "KEY:"), keeps a stable fleet of two servers for the faults that
do not touch servers, and starts SeaweedFS on first use. `row()` turns a job's tally into a row of
the table: fault, load, samples delivered, lost, duplicated, wrong, max stall, failovers, outcome.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.server.backends.roots import open_registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

from .chaos_job import Job, Plan, Tally, plan_of
from .chaos_rank import KEY_STRIDE, TrainerConfig
from .driver import LoadConfig, ensure_dataset
from .redis_server import RedisServer
from .seaweed import BUCKET, S3Server, start_seaweed

__all__ = ["Ctx", "Row", "Sizes", "row", "start_all"]

Row = dict[str, Any]
MIB = 1 << 20


@dataclass
class Sizes:
    """The scale of every fault (defaults: `make chaos`, ~8 min on 2 cores)."""

    rows: int = 60_000  # the vector dataset (72 B rows at dim 16)
    dim: int = 16
    row_group_rows: int = 2_000
    mix_rows: int = 20_000  # the mixture's second vector dataset
    text_rows: int = 6_000  # each of the two text datasets (documents of 10-300 bytes)
    fleet_rows: int = 120_000  # kill9 and rolling: rows of 1,032 B (dim 256), 31 MB a rank and epoch
    fleet_dim: int = 256
    batch: int = 64
    ranks: int = 4
    ranks_per_process: int = 1  # where no rank is killed alone (server, storage and network faults)
    step_ms: float = 10.0  # simulated compute per step, where a fault sets none of its own
    epochs: int = 2
    kill_every_s: float = 5.0  # kill -9 of a server
    kill9_s: float = 30.0  # how long the job of the server kills runs (its step time follows)
    grace_s: float = 5.0  # serve --grace of the rolling restart
    rolling_s: float = 30.0  # how long the job of the rolling restart runs
    rank_kills: int = 50
    rank_batch: int = 16
    rank_step_ms: float = 20.0
    commit_every: int = 5
    resize_batch: int = 32
    resize_holds: tuple[int, int] = (23, 57)  # 8 ranks hold (then die) at step 23, 4 ranks at 57
    redis_outage_s: float = 3.0
    s3_rows: int = 30_000
    s3_dim: int = 64  # 264 B rows: 132 KB row groups, 8 of them fill the servers' 1 MiB cache
    s3_row_group_rows: int = 500
    s3_error_ratio: float = 0.2
    s3_cut_ratio: float = 0.1
    s3_spike_ratio: float = 0.05
    s3_spike_s: float = 1.0
    idle_timeout_s: float = 60.0  # the Loader's default: keepalive (10 s + 5 s) notices the blackhole first
    cache_flips: int = 4
    seed: int = 0

    @classmethod
    def small(cls) -> Sizes:
        """Each fault in a few seconds (tests/test_chaos.py)."""
        return cls(
            rows=6_000,
            row_group_rows=500,
            fleet_rows=6_000,
            mix_rows=2_000,
            text_rows=600,
            batch=32,
            ranks_per_process=4,
            kill_every_s=1.5,
            kill9_s=4.0,
            grace_s=0.5,
            rolling_s=7.0,
            rank_kills=2,
            rank_step_ms=20.0,
            commit_every=3,
            resize_batch=16,
            resize_holds=(8, 17),
            redis_outage_s=0.5,
            s3_rows=4_000,
            s3_spike_s=0.2,
            idle_timeout_s=2.0,
            cache_flips=2,
        )

    def scaled(self, factor: float) -> Sizes:
        """Bigger (or smaller) datasets, everything else as is."""
        return dataclasses.replace(
            self,
            rows=int(self.rows * factor),
            fleet_rows=int(self.fleet_rows * factor),
            mix_rows=int(self.mix_rows * factor),
            text_rows=int(self.text_rows * factor),
            s3_rows=int(self.s3_rows * factor),
        )


def start_all(servers: list[LocalServer]) -> list[LocalServer]:
    """Start (or restart) servers side by side; returns them once every one serves."""
    with concurrent.futures.ThreadPoolExecutor(len(servers) or 1) as pool:
        list(pool.map(LocalServer.start, servers))
    return servers


def write_texts(path: Path, rows: int, base: int, seed: int) -> None:
    """`id` and `text`: "KEY:" (KEY = base + id) then 10-300 bytes of words, so packed rows cross documents."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "chaos", "shard", "stream", "rank"]
    texts = [
        f"{base + i}:"
        + " ".join(rng.choice(words, size=int(rng.integers(2, 50))).tolist())[: int(rng.integers(10, 300))]
        for i in range(rows)
    ]
    pq.write_table(pa.table({"id": np.arange(rows, dtype=np.int64), "text": texts}), path)


class Ctx:
    """The chaos run's shared state (module docstring); close() stops everything it started."""

    def __init__(
        self, workdir: Path, sizes: Sizes, *, s3: S3Server | Callable[[], S3Server] | None = None
    ) -> None:
        """`s3`: a running SeaweedFS, or what gives one when first needed (None: started here)."""
        self.workdir = workdir
        self.sizes = sizes
        self.root = str(workdir / "root")
        (workdir / "root").mkdir(parents=True, exist_ok=True)
        self._stack = contextlib.ExitStack()
        self._fleet: list[LocalServer] = []
        self._s3 = s3
        self._s3_root: str | None = None
        self._saved_env: dict[str, str | None] = {}

    # --- datasets (made on first use, reused by a later run over the same workdir) --------------
    @functools.cached_property
    def vectors(self) -> str:
        return self.vector_dataset(self.sizes.rows, self.sizes.row_group_rows)

    @functools.cached_property
    def mix_vectors(self) -> str:
        return self.vector_dataset(self.sizes.mix_rows, self.sizes.row_group_rows)

    @functools.cached_property
    def fleet_vectors(self) -> str:
        """Rows of 1 KB for the server faults: a rank's stream outlasts what gRPC buffers (~10 MB)."""
        return self.vector_dataset(self.sizes.fleet_rows, self.sizes.row_group_rows, dim=self.sizes.fleet_dim)

    @functools.cached_property
    def texts(self) -> list[str]:
        return [self._texts(f"chaos-text-{k}", self.sizes.text_rows, k) for k in range(2)]

    def vector_dataset(
        self,
        rows: int,
        row_group_rows: int,
        *,
        dim: int | None = None,
        root: str | None = None,
        s3_endpoint: str | None = None,
    ) -> str:
        """A vector dataset (`python -m loadtest`'s generator) under `root`, made once; its ref."""
        cfg = LoadConfig(
            rows=rows, dim=dim or self.sizes.dim, row_group_rows=row_group_rows, s3_endpoint=s3_endpoint
        )
        manifest, _ = ensure_dataset(cfg, root or self.root, self.workdir)
        return str(manifest.ref)

    def _texts(self, name: str, rows: int, k: int) -> str:
        with open_registry(self.root) as reg:
            if reg.latest(name) is None:
                src = self.workdir / f"{name}.parquet"
                write_texts(src, rows, k * KEY_STRIDE, seed=k)
                ingest(src, name, reg, IngestOptions(row_group_rows=max(50, rows // 12), progress=False))
            return str(reg.resolve(name).ref)

    def plan(self, dataset: str | dict[str, float], epochs: int, root: str | None = None) -> Plan:
        return plan_of(root or self.root, dataset, seed=self.sizes.seed, shuffle="block", epochs=epochs)

    # --- processes -------------------------------------------------------------------------------
    def servers(
        self,
        stack: contextlib.ExitStack,
        n: int,
        *,
        root: str | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> list[LocalServer]:
        """n servers of a fault's own (stopped when `stack` closes), started side by side; their
        output goes to WORKDIR/servers/."""
        logs = self.workdir / "servers"
        logs.mkdir(exist_ok=True)
        first = len(list(logs.iterdir()))
        out = [
            LocalServer(
                root or self.root,
                metrics=True,
                extra_args=args,
                env=env,
                log_path=logs / f"server-{first + i}.log",
            )
            for i in range(n)
        ]
        for server in out:
            stack.callback(server.stop)
        return start_all(out)

    @property
    def fleet(self) -> list[LocalServer]:
        """Two servers over the local root that no fault touches (started on first use)."""
        if not self._fleet:
            _ = self.vectors, self.mix_vectors, self.texts  # the datasets it serves, made first
            self._fleet = self.servers(self._stack, 2)
        return self._fleet

    def redis(self, stack: contextlib.ExitStack, name: str, *, persistent: bool) -> RedisServer:
        server = RedisServer(self.workdir / name, persistent=persistent)
        stack.callback(server.kill)
        return server.start()

    def s3(self) -> tuple[S3Server, str]:
        """SeaweedFS (started on first use) and the run's root on it; the AWS variables are set here."""
        if self._s3 is None:
            self._s3 = start_seaweed(self.workdir / "seaweed")
            self._stack.callback(self._s3.stop)
        elif not isinstance(self._s3, S3Server):
            self._s3 = self._s3()
        for k, v in self._s3.env().items():
            self._saved_env.setdefault(k, os.environ.get(k))
            os.environ[k] = v
        if self._s3_root is None:
            self._s3_root = f"s3://{BUCKET}/chaos-{os.getpid()}-{int(time.time())}"
        return self._s3, self._s3_root

    def step_ms_for(self, seconds: float, rows: int, world: int, batch: int, epochs: int) -> float:
        """The simulated step time that makes a job of these sizes run about `seconds`."""
        steps = epochs * -(-rows // (world * batch))
        return 1000.0 * seconds / max(1, steps)

    def groups(self, world: int) -> list[list[int]]:
        """The ranks of a job of `world` ranks, ranks_per_process to a trainer process."""
        k = self.sizes.ranks_per_process
        return [list(range(i, min(world, i + k))) for i in range(0, world, k)]

    def job(self, name: str, cfg: TrainerConfig, plan: Plan | None) -> Job:
        return Job(self.workdir / "jobs" / name, cfg, plan)

    def trainer(self, endpoints: list[str], dataset: str | dict[str, float], **kw: Any) -> TrainerConfig:
        """A trainer's config with the run's defaults (seed, block shuffle, step time, batch)."""
        base: dict[str, Any] = {
            "endpoints": endpoints,
            "dataset": dataset,
            "ranks": [0],
            "world_size": 1,
            "batch_size": self.sizes.batch,
            "log_dir": "",
            "seed": self.sizes.seed,
            "shuffle": "block",
            "step_ms": self.sizes.step_ms,
        }
        base.update(kw)
        return TrainerConfig(**base)

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            for k, v in self._saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def __enter__(self) -> Ctx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def row(
    fault: str,
    load: str,
    t: Tally,
    *,
    expect_error: str | None = None,
    allowed_errors: tuple[str, ...] = (),
    details: dict[str, Any] | None = None,
    schedule: list[str] | None = None,
    known_bug: str | None = None,
) -> Row:
    """A row of the table from a job's tally. Without `expect_error` the fault must be survived exactly
    (complete, 0 lost, 0 duplicated, 0 wrong; typed errors only among `allowed_errors`, e.g. the loud
    failure a wiped store must give before its fallback); with it, the job must end with that typed
    error and have delivered nothing twice or wrong. `schedule`: where the fault itself did not happen
    as planned (a kill after the job had finished), each making the row fail. `known_bug`: a product
    bug the fault is known to show; a row that fails says so (and does not fail the run)."""
    problems = list(t.problems) + list(schedule or [])
    kinds = [e.split(":", 1)[0] for e in t.errors]
    if expect_error is None:
        if not t.complete:
            problems.append(
                "the job did not finish" + (f" ({'; '.join(t.errors)[:300]})" if t.errors else "")
            )
        elif any(k not in allowed_errors for k in kinds):
            problems.append(f"errors: {'; '.join(t.errors)[:300]}")
        for what in ("lost", "duplicated", "wrong"):
            if getattr(t, what):
                problems.append(f"{getattr(t, what)} {what}")
        outcome = "exact" if not problems else "FAILED: " + "; ".join(problems)
    else:
        if expect_error not in kinds:
            problems.append(f"expected {expect_error}, got {kinds or 'no error'}")
        if t.duplicated or t.wrong:
            problems.append(f"{t.duplicated} duplicated, {t.wrong} wrong before the error")
        outcome = f"typed {expect_error}" if not problems else "FAILED: " + "; ".join(problems)
    if problems and known_bug:
        outcome = f"FAILED, known bug ({known_bug}): " + outcome.removeprefix("FAILED: ")
    return {
        "known_bug": known_bug if problems else None,
        "fault": fault,
        "load": load,
        "delivered": t.delivered,
        "lost": t.lost,
        "duplicated": t.duplicated,
        "wrong": t.wrong,
        "max_stall_s": round(t.max_stall_s, 3),
        "failovers": t.failovers,
        "outcome": outcome,
        "ok": not problems,
        "tally": dataclasses.asdict(t),
        "details": details or {},
    }
