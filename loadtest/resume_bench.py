"""Job-cursor resume benchmark: resume at a deep offset vs at 0, vs replaying; cost of commit(step).

    python -m loadtest.resume_bench [--rows 11000000] [--pairs 3] [--resume-reps 5]
                                    [--offset 10000000] [--replay-offset 1000000]
                                    [--no-replay-direct] [--commit-batches 4000]
                                    [--json loadtest/results/resume_bench.json]

One dataset of small samples (`id` int64, `label` int32, `text` a short string like "row-123456")
is written with pyarrow to a Parquet file in a private temp dir and ingested with
`shardstream.server.writing.ingest.ingest(src, "resume", root, IngestOptions(progress=False))` (default row
groups of ~4 MiB and shards of ~256 MiB), in a child process. One `LocalServer(root)` serves it.
Every Loader uses batch_size=32, world_size=1, seed=0, output="numpy" and a sqlite cursor store in
the temp dir (`sqlite:///<tmp>/c.db`).

1. resume: for shuffle "block" (the default) and "full", one job has a committed cursor at global
   offset 0 and another at --offset (10^7), made by `load_state_dict` of a `LoaderState` at that
   offset and `commit(step)`. Measured: wall time from `Loader(..., job=J, cursor_store=URL,
   resume="latest")` construction to its first batch (split into construction, `resumed_from` —
   GetDataset + the cursor-store read — and the first batch). One warm-up each (cold row groups),
   then --pairs rounds, each of --resume-reps pairs of A (offset 0) and B (--offset), ordered
   A B, B A, ..., then one replay (2.); ratio B/A per pair. Before every timed run the bench waits
   until the server is idle: a stream the client cancels after its first batch leaves the
   server building its read-ahead message, which would otherwise land on the next measurement.
   The first batch's position is checked against the committed offset.
2. replay: a fresh Loader (no job) iterated from offset 0 until its offset reaches
   --replay-offset (10^6), timed; samples/s, and the time to replay to --offset extrapolated
   linearly from it; ratio: extrapolated replay / median direct resume at --offset of the same
   round. Unless --no-replay-direct, one more replay per mode goes all the way to --offset
   (~50 s each at 10^7) to check the extrapolation.
3. commits: a Loader (job, sqlite store, shuffle "block") iterates --commit-batches batches, with
   `commit(step)` after every batch (B) or never (A), alternating; time per batch from the first
   batch to the last (start-up excluded), the time spent inside `commit()`, and the
   `flush_commits()` wait for the backlog the background writer has not yet written after the last
   batch. Ratio B/A per round of the per-batch time.

The server's row-group cache (1 GiB) holds the whole dataset, so after the warm-ups every read is a
cache hit; the page cache is warm. Figures only: it never asserts on time and exits 0 unless
something crashed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from shardstream.client import Loader
from shardstream.client.loader_state import LoaderState
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

__all__ = ["main"]

DATASET = "resume"
BATCH = 32
SEED = 0
MODES = ("block", "full")
DEFAULT_ROWS = 11_000_000
DEFAULT_OFFSET = 10_000_000
DEFAULT_REPLAY_OFFSET = 1_000_000
DEFAULT_PAIRS = 3
DEFAULT_COMMIT_BATCHES = 4_000
DEFAULT_RESUME_REPS = 5
GEN_ROWS = 1 << 20  # rows per generated chunk of the source file


# --- dataset -----------------------------------------------------------------------------------
def write_source(path: Path, num_rows: int) -> None:
    schema = pa.schema([("id", pa.int64()), ("label", pa.int32()), ("text", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, num_rows, GEN_ROWS):
            ids = pa.array(np.arange(start, min(start + GEN_ROWS, num_rows), dtype=np.int64))
            text = pc.binary_join_element_wise("row-", pc.cast(ids, pa.string()), "")
            labels = pa.array((ids.to_numpy() % 1000).astype(np.int32))
            writer.write_table(pa.table([ids, labels, text], schema=schema))


def build_dataset(workdir: Path, num_rows: int) -> dict[str, Any]:
    src = workdir / "src" / "resume.parquet"
    src.parent.mkdir()
    write_source(src, num_rows)
    root = workdir / "root"
    manifest = ingest(src, DATASET, root, IngestOptions(progress=False))
    src_bytes = src.stat().st_size
    src.unlink()
    groups = [len(s.row_groups) for s in manifest.shards]
    return {
        "root": str(root),
        "num_rows": manifest.num_rows,
        "shards": len(manifest.shards),
        "row_groups": sum(groups),
        "rows_per_row_group": manifest.num_rows / max(1, sum(groups)),
        "shard_bytes": manifest.num_bytes,
        "source_parquet_bytes": src_bytes,
    }


# --- measurements ------------------------------------------------------------------------------
def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


class Meter:
    """Wall time and CPU seconds of this process and of the server process."""

    def __init__(self, server_pid: int) -> None:
        self.me = psutil.Process()
        self.server = psutil.Process(server_pid)

    def __enter__(self) -> Meter:
        self.c0, self.s0, self.t0 = _cpu_s(self.me), _cpu_s(self.server), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self.t0
        self.client_cpu_s = _cpu_s(self.me) - self.c0
        self.server_cpu_s = _cpu_s(self.server) - self.s0


def wait_idle(pid: int, quiet_s: float = 0.1, max_s: float = 10.0) -> float:
    """Wait until the server process uses < 10% of a core over `quiet_s`: a stream the previous
    run cancelled may still be building its read-ahead message there. Returns the seconds waited."""
    proc = psutil.Process(pid)
    t0 = time.monotonic()
    last = _cpu_s(proc)
    while time.monotonic() - t0 < max_s:
        time.sleep(quiet_s)
        now = _cpu_s(proc)
        if now - last <= 0.1 * quiet_s:
            break
        last = now
    return time.monotonic() - t0


def make_cursor(target: str, store: str, job: str, mode: str, offset: int) -> int:
    """Commit a cursor at global `offset` for `job` (one rank); returns the committed step."""
    step = offset // BATCH
    with Loader([target], DATASET, batch_size=BATCH, shuffle=mode, job=job, cursor_store=store) as ld:
        t = ld.target
        state = LoaderState(
            dataset=t.label,
            fingerprint=t.fingerprint,
            seed=SEED,
            shuffle=str(ld.shuffle),
            epoch=0,
            offset=offset,
            world_size=1,
            batch_size=BATCH,
            steps=step,
        )
        ld.load_state_dict(state.to_dict())
        ld.commit(step)
        ld.flush_commits()
    return step


def resume_once(target: str, store: str, job: str, mode: str, server_pid: int) -> dict[str, Any]:
    """Loader(resume="latest") construction -> resumed_from -> first batch."""
    with Meter(server_pid) as m:
        t0 = time.perf_counter()
        ld = Loader(
            [target], DATASET, batch_size=BATCH, shuffle=mode, job=job, cursor_store=store, resume="latest"
        )
        try:
            t1 = time.perf_counter()
            step = ld.resumed_from
            t2 = time.perf_counter()
            it = iter(ld)
            batch = next(it)
            t3 = time.perf_counter()
            info = ld.last_batch
            it.close()
        finally:
            ld.close()
    assert info is not None
    return {
        "job": job,
        "first_batch_s": t3 - t0,
        "construct_s": t1 - t0,
        "resumed_from_s": t2 - t1,
        "stream_first_batch_s": t3 - t2,
        "resumed_from": step,
        "first_position": info.position_start,
        "first_rows": len(batch["id"]),
        "client_cpu_s": m.client_cpu_s,
        "server_cpu_s": m.server_cpu_s,
        "wall_s": m.wall_s,
    }


def replay_once(target: str, mode: str, until: int, server_pid: int) -> dict[str, Any]:
    """A fresh Loader from offset 0, iterated until its cursor reaches `until`."""
    batches = 0
    with Meter(server_pid) as m:
        t0 = time.perf_counter()
        with Loader([target], DATASET, batch_size=BATCH, shuffle=mode) as ld:
            first = float("nan")
            for _ in ld:
                batches += 1
                if batches == 1:
                    first = time.perf_counter() - t0
                if ld.offset >= until:
                    break
            reached = ld.offset
    return {
        "replayed": reached,
        "batches": batches,
        "wall_s": m.wall_s,
        "first_batch_s": first,
        "samples_per_s": reached / m.wall_s,
        "client_cpu_s": m.client_cpu_s,
        "server_cpu_s": m.server_cpu_s,
    }


def commits_once(
    target: str, store: str, job: str, batches: int, commit: bool, server_pid: int
) -> dict[str, Any]:
    """`batches` batches, commit(step) after each one or never; steady-state time per batch."""
    in_commit = 0.0
    n = 0
    with Meter(server_pid) as m:
        with Loader([target], DATASET, batch_size=BATCH, job=job, cursor_store=store) as ld:
            for step, _batch in enumerate(ld, 1):
                if step == 1:
                    t_first = time.perf_counter()
                if commit:
                    c0 = time.perf_counter()
                    ld.commit(step)
                    in_commit += time.perf_counter() - c0
                n = step
                if step >= batches:
                    break
            t_last = time.perf_counter()
            ld.flush_commits(timeout_s=600)
            t_flushed = time.perf_counter()
    return {
        "job": job,
        "commit": commit,
        "batches": n,
        "per_batch_s": (t_last - t_first) / max(1, n - 1),
        "loop_s": t_last - t_first,
        "in_commit_s": in_commit,
        "per_commit_call_s": in_commit / n if commit else None,
        "flush_backlog_s": t_flushed - t_last,
        "client_cpu_s": m.client_cpu_s,
        "server_cpu_s": m.server_cpu_s,
        "wall_s": m.wall_s,
    }


def committed_steps(db: Path, job: str) -> tuple[int, int]:
    """How many steps of `job` the store holds as committed, and the newest (0: none)."""
    with closing(sqlite3.connect(db)) as con:
        (n, newest) = con.execute("SELECT count(*), coalesce(max(step), 0) FROM committed WHERE job=?", (job,)).fetchone()
    return int(n), int(newest)


# --- report ------------------------------------------------------------------------------------
def summarize(result: dict[str, Any]) -> dict[str, Any]:
    cfg = result["config"]
    scale = cfg["offset"] / cfg["replay_offset"]
    out: dict[str, Any] = {"resume": {}, "commits": {}}
    for mode in MODES:
        runs = result["resume"][mode]
        a = [r for r in runs["at_0"] if r["round"] > 0]
        b = [r for r in runs["at_offset"] if r["round"] > 0]
        c = [r for r in runs["replay"] if r["round"] > 0]
        # replay / resume per round: the replay against the median direct resume of its round
        b_round = {
            n: statistics.median(r["first_batch_s"] for r in b if r["round"] == n)
            for n in {r["round"] for r in b}
        }
        direct = runs["replay_direct"]
        out["resume"][mode] = {
            "first_batch_ms_at_0": spread([r["first_batch_s"] * 1e3 for r in a]),
            "first_batch_ms_at_offset": spread([r["first_batch_s"] * 1e3 for r in b]),
            "cold_first_batch_ms_at_0": runs["at_0"][0]["first_batch_s"] * 1e3,
            "cold_first_batch_ms_at_offset": runs["at_offset"][0]["first_batch_s"] * 1e3,
            "ratio_offset_vs_0": spread(
                [y["first_batch_s"] / x["first_batch_s"] for x, y in zip(a, b, strict=True)]
            ),
            "pairs": len(a),
            "breakdown_ms_at_0": {
                k: statistics.median(r[k] for r in a) * 1e3
                for k in ("construct_s", "resumed_from_s", "stream_first_batch_s")
            },
            "breakdown_ms_at_offset": {
                k: statistics.median(r[k] for r in b) * 1e3
                for k in ("construct_s", "resumed_from_s", "stream_first_batch_s")
            },
            "server_cpu_ms_per_resume": statistics.median(r["server_cpu_s"] for r in a + b) * 1e3,
            "resumed_at_committed_offset": all(
                r["first_position"] == runs["offset_of"][r["job"]] for r in runs["at_0"] + runs["at_offset"]
            ),
            "replay_samples_per_s": spread([r["samples_per_s"] for r in c]),
            "replay_s_measured": spread([r["wall_s"] for r in c]),
            "replay_s_to_offset_extrapolated": spread([r["wall_s"] * scale for r in c]),
            "replay_s_to_offset_measured_once": direct["wall_s"] if direct else None,
            "replay_vs_resume": spread([z["wall_s"] * scale / b_round[z["round"]] for z in c]),
            "replay_client_cpu_s_per_1e6": statistics.median(
                r["client_cpu_s"] / r["replayed"] * 1e6 for r in c
            ),
            "replay_server_cpu_s_per_1e6": statistics.median(
                r["server_cpu_s"] / r["replayed"] * 1e6 for r in c
            ),
        }
    without = [r for r in result["commits"]["without"] if r["round"] > 0]
    with_ = [r for r in result["commits"]["with"] if r["round"] > 0]
    pairs = list(zip(without, with_, strict=True))

    def incl_flush(r: dict[str, Any]) -> float:
        return (r["loop_s"] + r["flush_backlog_s"]) / max(1, r["batches"] - 1)

    out["commits"] = {
        "per_batch_us_without": spread([r["per_batch_s"] * 1e6 for r in without]),
        "per_batch_us_with": spread([r["per_batch_s"] * 1e6 for r in with_]),
        "ratio_with_vs_without": spread([y["per_batch_s"] / x["per_batch_s"] for x, y in pairs]),
        "added_us_per_batch": spread([(y["per_batch_s"] - x["per_batch_s"]) * 1e6 for x, y in pairs]),
        "per_batch_us_with_incl_flush": spread([incl_flush(r) * 1e6 for r in with_]),
        "ratio_incl_flush": spread([incl_flush(y) / x["per_batch_s"] for x, y in pairs]),
        "commit_call_us": spread([r["per_commit_call_s"] * 1e6 for r in with_]),
        "flush_backlog_ms": spread([r["flush_backlog_s"] * 1e3 for r in with_]),
        "client_cpu_s_without": statistics.median(r["client_cpu_s"] for r in without),
        "client_cpu_s_with": statistics.median(r["client_cpu_s"] for r in with_),
        # the committer writes only the newest of the commits pending (client/cursors/committer.py):
        # what must land is the last step, not every one
        "newest_step_committed": all(r["newest_committed"] == r["batches"] for r in with_),
        "steps_written": spread([r["committed_in_store"] for r in with_]),
    }
    return out


def _fmt(s: dict[str, float], digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def print_report(result: dict[str, Any]) -> None:
    cfg, ds, summ = result["config"], result["dataset"], result["summary"]
    off, rep = cfg["offset"], cfg["replay_offset"]
    first = next(iter(summ["resume"].values()))
    print(
        f"\nshardstream resume bench: {ds['num_rows']:,} rows ({ds['shard_bytes'] / 1e6:.0f} MB in "
        f"{ds['shards']} shards, {ds['row_groups']} row groups), batch {BATCH}, world 1, output numpy, "
        f"sqlite cursors; {first['pairs']} A/B pairs in {cfg['pairs']} rounds after 1 warm-up; "
        f"pyarrow {result['versions']['pyarrow']}, grpcio {result['versions']['grpcio']}, "
        f"{result['machine']['cpus']} CPUs. Median (min-max); ratios of pairs."
    )
    head = (
        f"{'shuffle':<8} {'1st batch ms @0':>18} {f'1st batch ms @{off:.0e}':>20} {'ratio':>17} "
        f"{'replay samples/s':>23} {f'replay s to {off:.0e}':>18} {'replay/resume':>16}"
    )
    print(head)
    print("-" * len(head))
    for mode, s in summ["resume"].items():
        print(
            f"{mode:<8} {_fmt(s['first_batch_ms_at_0']):>18} {_fmt(s['first_batch_ms_at_offset']):>20} "
            f"{_fmt(s['ratio_offset_vs_0'], 2):>17} {_fmt(s['replay_samples_per_s'], 0):>23} "
            f"{_fmt(s['replay_s_to_offset_extrapolated']):>18} {_fmt(s['replay_vs_resume'], 0):>16}"
        )
    how = f"time to {off:,} extrapolated linearly" if rep != off else "measured"
    print(f"replay: {cfg['pairs']} runs from 0 to {rep:,} per mode after 1 warm-up, {how}")
    for mode, s in summ["resume"].items():
        bd0, bd = s["breakdown_ms_at_0"], s["breakdown_ms_at_offset"]
        once = s["replay_s_to_offset_measured_once"]
        print(
            f"{mode}: construct + resumed_from + first batch ms: @0 {bd0['construct_s']:.1f} + "
            f"{bd0['resumed_from_s']:.1f} + {bd0['stream_first_batch_s']:.1f}; @{off:.0e} {bd['construct_s']:.1f} + "
            f"{bd['resumed_from_s']:.1f} + {bd['stream_first_batch_s']:.1f}; server CPU "
            f"{s['server_cpu_ms_per_resume']:.0f} ms/resume; cold {s['cold_first_batch_ms_at_0']:.0f} / "
            f"{s['cold_first_batch_ms_at_offset']:.0f} ms"
            + (f"; replay to {off:,} measured once: {once:.1f} s" if once else "")
            + f"; resumed at the committed offset: {s['resumed_at_committed_offset']}"
        )
    c = summ["commits"]
    print(
        f"\ncommit(step) after every batch vs none, {cfg['commit_batches']:,} batches, shuffle block, sqlite:\n"
        f"  us/batch without {_fmt(c['per_batch_us_without'])}  with {_fmt(c['per_batch_us_with'])}  "
        f"ratio {_fmt(c['ratio_with_vs_without'], 2)}  added {_fmt(c['added_us_per_batch'])} us\n"
        f"  commit() call {_fmt(c['commit_call_us'])} us on the training thread; backlog left after the loop "
        f"{_fmt(c['flush_backlog_ms'], 0)} ms; with it {_fmt(c['per_batch_us_with_incl_flush'])} us/batch, "
        f"ratio {_fmt(c['ratio_incl_flush'], 2)}\n"
        f"  client CPU s {c['client_cpu_s_without']:.2f} -> {c['client_cpu_s_with']:.2f}; "
        f"the last step committed: {c['newest_step_committed']} "
        f"(steps written {c['steps_written']['median']:.0f} of {cfg['commit_batches']:,}: the newest pending wins)"
    )
    g0, g1 = result["git_at_start"], result["git_at_end"]
    print(f"\ncode: {str(g0['commit'])[:7]}", end="")
    if g0 != g1 or g0["modified_outside_loadtest"]:
        print(
            f" -> {str(g1['commit'])[:7]}; modified: {g0['modified_outside_loadtest']} -> {g1['modified_outside_loadtest']}"
        )
    else:
        print(", clean outside loadtest/")


# --- main --------------------------------------------------------------------------------------
def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _git_state() -> dict[str, Any]:
    """HEAD and the files changed against it outside loadtest/ (the code measured, if dirty)."""
    changed = (_git("diff", "--name-only", "HEAD") or "").splitlines()
    dirty = [f for f in changed if not f.startswith("loadtest/")]
    return {"commit": _git("rev-parse", "HEAD"), "modified_outside_loadtest": dirty}


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.resume_bench", *sys.argv[1:]]),
        "config": {
            "rows": args.rows,
            "offset": args.offset,
            "replay_offset": args.replay_offset,
            "pairs": args.pairs,
            "resume_reps": args.resume_reps,
            "replay_direct": args.replay_direct,
            "commit_batches": args.commit_batches,
            "batch_size": BATCH,
            "world_size": 1,
            "seed": SEED,
            "output": "numpy",
            "schema": "id int64, label int32, text string ('row-<id>')",
            "cursor_store": "sqlite (file in the private temp dir)",
            "page_cache": "warm (written just before)",
            "processes": "client: this process; one `shardstream serve` subprocess (LocalServer)",
        },
        "versions": versions("shardstream", "grpcio", "protobuf", "uvloop", sqlite=sqlite3.sqlite_version),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "git_at_start": _git_state(),
        "resume": {},
        "commits": {"without": [], "with": []},
    }
    with tempfile.TemporaryDirectory(prefix="shardstream-resume-bench-") as tmp:
        workdir = Path(tmp)
        db = workdir / "c.db"
        store = f"sqlite:///{db}"
        t0 = time.perf_counter()
        log(f"building {args.rows:,} rows in {workdir}")
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            ds = pool.submit(build_dataset, workdir, args.rows).result()
        result["dataset"] = ds
        log(
            f"  {ds['shards']} shards, {ds['row_groups']} row groups, {ds['shard_bytes'] / 1e6:.0f} MB, "
            f"{time.perf_counter() - t0:.1f} s"
        )
        with LocalServer(ds["root"]) as server:
            assert server.proc is not None
            pid, target = server.proc.pid, server.target
            for mode in MODES:
                jobs = {f"{mode}-at-0": 0, f"{mode}-at-{args.offset}": args.offset}
                for job, off in jobs.items():
                    make_cursor(target, store, job, mode, off)
                job0, job1 = list(jobs)
                runs: dict[str, Any] = {
                    "offset_of": jobs,
                    "at_0": [],
                    "at_offset": [],
                    "replay": [],
                    "replay_direct": None,
                }
                for round_ in range(args.pairs + 1):
                    # the warm-up round reads each job's row groups once (cold); then pairs of A
                    # (offset 0) and B (--offset), in the order A B, B A, A B, ... (no order bias)
                    for rep in range(1 if round_ == 0 else args.resume_reps):
                        pair = [("at_0", job0), ("at_offset", job1)]
                        for key, job in pair if rep % 2 == 0 else pair[::-1]:
                            idle = wait_idle(pid)
                            r = resume_once(target, store, job, mode, pid)
                            runs[key].append({"round": round_, "rep": rep, "idle_wait_s": idle, **r})
                    wait_idle(pid)
                    c = replay_once(target, mode, args.replay_offset, pid)
                    runs["replay"].append({"round": round_, **c})
                    a = [r["first_batch_s"] * 1e3 for r in runs["at_0"] if r["round"] == round_]
                    b = [r["first_batch_s"] * 1e3 for r in runs["at_offset"] if r["round"] == round_]
                    label = "warm-up" if round_ == 0 else f"round {round_}"
                    log(
                        f"  {mode:<5} {label:<7} first batch ms @0 {' '.join(f'{x:.0f}' for x in a)}  "
                        f"@{args.offset:.0e} {' '.join(f'{x:.0f}' for x in b)}  replay to "
                        f"{c['replayed']:,}: {c['wall_s']:.2f} s ({c['samples_per_s']:,.0f} samples/s)"
                    )
                if args.replay_direct and args.replay_offset != args.offset:
                    wait_idle(pid)
                    d = replay_once(target, mode, args.offset, pid)
                    runs["replay_direct"] = d
                    log(
                        f"  {mode:<5} replay to {d['replayed']:,} once: {d['wall_s']:.1f} s "
                        f"({d['samples_per_s']:,.0f} samples/s)"
                    )
                result["resume"][mode] = runs
            for round_ in range(args.pairs + 1):
                for commit in (False, True):
                    job = f"commits-{'with' if commit else 'without'}-{round_}"
                    wait_idle(pid)
                    r = commits_once(target, store, job, args.commit_batches, commit, pid)
                    r["committed_in_store"], r["newest_committed"] = committed_steps(db, job)
                    result["commits"]["with" if commit else "without"].append({"round": round_, **r})
                    label = "warm-up" if round_ == 0 else f"round {round_}"
                    log(
                        f"  commits {label:<7} {'with' if commit else 'without':<7} "
                        f"{r['per_batch_s'] * 1e6:7.1f} us/batch  flush {r['flush_backlog_s'] * 1e3:.1f} ms"
                    )
    result["git_at_end"] = _git_state()
    result["summary"] = summarize(result)
    return result


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse impossible sizes; derive --offset and --replay-offset (multiples of the batch)."""
    if args.rows < 100 * BATCH or args.pairs < 1 or args.resume_reps < 1 or args.commit_batches < 2:
        ap.error(f"--rows must be >= {100 * BATCH}, --pairs and --resume-reps >= 1, --commit-batches >= 2")
    if args.offset is None:
        args.offset = DEFAULT_OFFSET if args.rows > DEFAULT_OFFSET else int(args.rows * 0.9)
    args.offset -= args.offset % BATCH
    if args.replay_offset is None:
        args.replay_offset = min(DEFAULT_REPLAY_OFFSET, args.offset)
    args.replay_offset -= args.replay_offset % BATCH
    if not 0 < args.replay_offset <= args.offset < args.rows:
        ap.error("need 0 < --replay-offset <= --offset < --rows (multiples of 32)")
    if args.commit_batches * BATCH > args.rows:
        ap.error("--commit-batches x 32 must fit in --rows")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.resume_bench", __doc__)
    ap.add_argument("--rows", type=int, default=DEFAULT_ROWS, help=f"dataset rows (default {DEFAULT_ROWS:,})")
    ap.add_argument(
        "--pairs",
        type=int,
        default=DEFAULT_PAIRS,
        help=f"measured rounds after the warm-up (default {DEFAULT_PAIRS})",
    )
    ap.add_argument(
        "--offset",
        type=int,
        default=None,
        help=f"deep committed offset (default {DEFAULT_OFFSET:,}, or 90%% of --rows when smaller)",
    )
    ap.add_argument(
        "--replay-offset",
        type=int,
        default=None,
        help=f"replay from 0 to here, extrapolated to --offset (default {DEFAULT_REPLAY_OFFSET:,}, at most --offset)",
    )
    ap.add_argument(
        "--commit-batches",
        type=int,
        default=DEFAULT_COMMIT_BATCHES,
        help=f"batches per commit / no-commit run (default {DEFAULT_COMMIT_BATCHES:,})",
    )
    ap.add_argument(
        "--resume-reps",
        type=int,
        default=DEFAULT_RESUME_REPS,
        help=f"A/B resume pairs per round (default {DEFAULT_RESUME_REPS})",
    )
    ap.add_argument(
        "--no-replay-direct",
        dest="replay_direct",
        action="store_false",
        help="skip the one replay all the way to --offset per mode (~45-60 s each at 10^7)",
    )
    return bench_main(
        ap, argv, run, json_default=results_path("resume_bench"), report=print_report, check=_check
    )


if __name__ == "__main__":
    sys.exit(main())
