"""Data-plane benchmark: shardstream's read throughput against Arrow Flight and a local Parquet read.

    python -m loadtest.bench [--mib 512] [--pairs 3] [--batch-mib 2] [--flight-from-memory]
                             [--flight-tuned] [--json loadtest/results/bench.json]

One dataset of fixed-width rows (`id` int64 + `vec` fixed_size_list<float32>[256], 1,032 B/row) is
written to Parquet, ingested with `shardstream.server.writing.ingest`, and read in full passes, in the same
batches of ~--batch-mib MiB, by these paths:

    shardstream   one `shardstream serve` subprocess -> `Loader(output="arrow")`
    flight        one Arrow Flight DoGet subprocess (loadtest/flight_server.py) reading the same
                  shards -> `FlightClient.do_get` reader (--flight-from-memory: the server reads
                  them once at start, as shardstream's server keeps them in its cache)
    shardstream_striped
                  (--striped K) K `shardstream serve` subprocesses -> `Loader(streams=K)`: one rank
                  over K streams striped by step, one per server process
    flight_tuned  (--flight-tuned) the same with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ set
                  for its server and client: the allocator settings shardstream applies to itself
    parquet       `ParquetFile.iter_batches` of the same shards (no network)

Each path's client runs in its own process (spawned once, kept for all its passes), so what one
client does to its process — shardstream's client sets glibc malloc options (allocator.py) — never
helps or hurts another path, and client CPU and peak RSS are per path. Each path runs one warm-up
pass, then the paths alternate (A B C A B C ...) for --pairs rounds. Per pass: payload bytes (rows x
1,032 B, which is `batch.nbytes` of the shardstream and Flight batches; Parquet's batches also carry
1 bit/value of all-valid validity bitmaps, recorded as `arrow_nbytes`), wall time, time to first
batch (connection set-up included), CPU seconds of the client and of the server process (psutil),
peak RSS of both (VmHWM, reset before each pass). Throughput ratios are the median (min-max) of the
per-round ratios. Figures only: it never asserts on time and exits 0 unless something crashed.
MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq

from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions, write_vectors
from shardstream.client import Loader
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

__all__ = ["main"]

DIM = 256  # floats per row in `vec`
ROW_BYTES = 8 + 4 * DIM  # Arrow payload bytes per row (id + vec)
DATASET = "bench"
DEFAULT_MIB = 512
DEFAULT_PAIRS = 3
DEFAULT_BATCH_MIB = 2
SHARD_MIB = 256  # ingest's default shard size
SERVER_CACHE_MIB = 1024  # `shardstream serve` default --cache-mib
GEN_ROWS = 64 * 1024  # rows per generated chunk of the source file
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
PATHS = ("shardstream", "flight", "parquet")
STRIPED = "shardstream_striped"  # --striped K: one rank over K streams on K server processes
TUNED_FLIGHT = "flight_tuned"  # --flight-tuned: Flight with the allocator settings shardstream applies
# What shardstream's server and client set through mallopt (shardstream/allocator.py), as variables.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}
MIB = 1 << 20


# --- dataset -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Row counts chosen so every path yields the same batches (no short batch at shard ends)."""

    batch_rows: int
    row_group_rows: int
    shard_rows: int
    num_rows: int

    @classmethod
    def plan(cls, mib: int, batch_mib: float) -> Layout:
        batch_rows = max(1, int(batch_mib * MIB) // ROW_BYTES)
        group = 2 * batch_rows  # ~4 MiB for 2 MiB batches: ingest's default row-group size
        groups_per_shard = max(1, round(SHARD_MIB * MIB / (group * ROW_BYTES)))
        groups = max(1, round(mib * MIB / (group * ROW_BYTES)))
        return cls(batch_rows, group, group * groups_per_shard, group * groups)


def build_dataset(workdir: Path, layout: Layout) -> tuple[Path, list[Path]]:
    """(registry root, shard paths in dataset order)."""
    src = workdir / "src" / "bench.parquet"
    src.parent.mkdir()
    write_vectors(src, layout.num_rows, DIM, GEN_ROWS)
    root = workdir / "root"
    manifest = ingest(
        src,
        DATASET,
        root,
        IngestOptions(row_group_rows=layout.row_group_rows, shard_rows=layout.shard_rows, progress=False),
    )
    src.unlink()  # only the shards are read
    registry = Registry(root)
    return root, [registry.shard_path(manifest, s.uri) for s in manifest.shards]


# --- processes ---------------------------------------------------------------------------------
class FlightProcess:
    """loadtest/flight_server.py in its own process group."""

    def __init__(
        self,
        workdir: Path,
        shards: list[Path],
        batch_rows: int,
        from_memory: bool = False,
        env: dict[str, str] | None = None,
        name: str = "flight",
        tls: tuple[Path, Path] | None = None,  # (certificate, key): serve grpc+tls
    ) -> None:
        self.workdir = workdir
        self.tls = tls
        self.env = env
        self.name = name
        self.shards = shards
        self.batch_rows = batch_rows
        self.from_memory = from_memory
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> FlightProcess:
        shards_file = self.workdir / f"{self.name}-shards.json"
        shards_file.write_text(json.dumps([str(p) for p in self.shards]))
        ready = self.workdir / f"{self.name}-ready.json"
        cmd = self.command(shards_file, ready)
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **(self.env or {})}
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while not ready.exists():
                if self.proc.poll() is not None:
                    raise RuntimeError(f"flight server exited with code {self.proc.returncode} before ready")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"flight server not ready after {START_TIMEOUT_S:g} s")
                time.sleep(0.02)
            self.port = json.loads(ready.read_text())["port"]
        except BaseException:
            self.__exit__()
            raise
        return self

    def command(self, shards_file: Path, ready: Path) -> list[str]:
        """The server's command line (loadtest/flight_server.py; subclasses run other Flight servers)."""
        script = Path(__file__).with_name("flight_server.py")
        cmd = [
            sys.executable,
            str(script),
            "--shards",
            str(shards_file),
            "--batch-rows",
            str(self.batch_rows),
            "--ready-file",
            str(ready),
        ]
        if self.tls is not None:
            cmd += ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
        return [*cmd, "--from-memory"] if self.from_memory else cmd

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # anything left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None


# --- measurement -------------------------------------------------------------------------------
@dataclass
class Pass:
    path: str
    round: int  # 0 is the warm-up
    batches: int
    rows: int
    payload_bytes: int  # rows x 1,032 B: the same logical payload on every path
    arrow_nbytes: int  # sum of batch.nbytes (Parquet's batches also carry all-valid validity bitmaps)
    wall_s: float
    first_batch_s: float
    client_cpu_s: float
    server_cpu_s: float | None
    client_peak_rss_mib: float | None
    server_peak_rss_mib: float | None

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.wall_s / 1e6

    @property
    def steady_mb_per_s(self) -> float:
        """After the first batch: excludes connection set-up and the first message."""
        rest = self.wall_s - self.first_batch_s
        if rest <= 0 or self.batches < 2:
            return float("nan")
        return self.payload_bytes * (self.batches - 1) / self.batches / rest / 1e6

    @property
    def cpu_s_per_gb(self) -> float:
        return (self.client_cpu_s + (self.server_cpu_s or 0.0)) / (self.payload_bytes / 1e9)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "mb_per_s": self.mb_per_s,
            "steady_mb_per_s": self.steady_mb_per_s,
            "cpu_s_per_gb": self.cpu_s_per_gb,
        }


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _reset_peak_rss(pid: int) -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM, so each pass gets its own peak."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def measure_in_child(
    name: str, round_: int, source: tuple[str, Any], server_pid: int | list[int] | None
) -> Pass:
    """`measure` of one path, run in that path's own client process (see `ClientProcess`)."""
    kind, arg = source
    batches: Callable[[], Iterator[pa.RecordBatch]]
    if kind == "shardstream":
        batches = lambda: shardstream_batches(*arg)  # noqa: E731
    elif kind == "flight":
        batches = lambda: flight_batches(arg)  # noqa: E731
    else:
        batches = lambda: parquet_batches(*arg)  # noqa: E731
    return measure(name, round_, batches, server_pid)


class ClientProcess:
    """One client process per path, kept for all its passes: what one path's client does to its
    process (shardstream's client sets glibc malloc options, allocator.py) never reaches another
    path's client, and each path's client CPU and peak RSS are its own. `env` is added to its
    environment (e.g. MALLOC_* for the Flight client that gets shardstream's allocator settings)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            self.pool.submit(int).result()  # start it now, with this environment
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def measure(
        self, name: str, round_: int, source: tuple[str, Any], server_pid: int | list[int] | None
    ) -> Pass:
        return self.pool.submit(measure_in_child, name, round_, source, server_pid).result()

    def close(self) -> None:
        self.pool.shutdown()


def measure(
    name: str,
    round_: int,
    batches: Callable[[], Iterator[pa.RecordBatch]],
    server_pid: int | list[int] | None,
) -> Pass:
    """One pass; `server_pid` is the serving process (or processes: CPU summed, the largest peak)."""
    me = psutil.Process()
    pids = [server_pid] if isinstance(server_pid, int) else list(server_pid or [])
    servers = [psutil.Process(pid) for pid in pids]
    peaks = _reset_peak_rss(me.pid) and all(_reset_peak_rss(s.pid) for s in servers)
    n = rows = nbytes = 0
    first = float("nan")
    s0 = sum(_cpu_s(s) for s in servers)
    c0 = _cpu_s(me)
    t0 = time.perf_counter()
    for batch in batches():
        if n == 0:
            first = time.perf_counter() - t0
        n += 1
        rows += batch.num_rows
        nbytes += batch.nbytes
    wall = time.perf_counter() - t0
    c1 = _cpu_s(me)
    s1 = sum(_cpu_s(s) for s in servers)
    server_peak = max((_peak_rss_mib(s.pid) or 0.0 for s in servers), default=0.0) if peaks else 0.0
    return Pass(
        path=name,
        round=round_,
        batches=n,
        rows=rows,
        payload_bytes=rows * ROW_BYTES,
        arrow_nbytes=nbytes,
        wall_s=wall,
        first_batch_s=first,
        client_cpu_s=c1 - c0,
        server_cpu_s=(s1 - s0) if servers else None,
        client_peak_rss_mib=_peak_rss_mib(me.pid) if peaks else None,
        server_peak_rss_mib=server_peak or None,
    )


def shardstream_batches(targets: list[str], batch_rows: int, streams: int = 1) -> Iterator[pa.RecordBatch]:
    with Loader(
        targets, DATASET, batch_size=batch_rows, shuffle=False, output="arrow", streams=streams
    ) as loader:
        yield from loader


def flight_batches(port: int) -> Iterator[pa.RecordBatch]:
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        reader = client.do_get(flight.Ticket(b"all"))
        for chunk in reader:
            yield chunk.data
    finally:
        client.close()


def parquet_batches(shards: list[Path], batch_rows: int) -> Iterator[pa.RecordBatch]:
    for path in shards:
        yield from pq.ParquetFile(path).iter_batches(batch_size=batch_rows)


# --- report ------------------------------------------------------------------------------------
def _paths(args: argparse.Namespace) -> tuple[str, ...]:
    out = [PATHS[0]]
    if getattr(args, "striped", 1) > 1:
        out.append(STRIPED)
    out.append("flight")
    if getattr(args, "flight_tuned", False):
        out.append(TUNED_FLIGHT)
    return (*out, "parquet")


def summarize(passes: list[Pass]) -> dict[str, Any]:
    measured = [p for p in passes if p.round > 0]
    names = [
        n
        for n in ("shardstream", STRIPED, "flight", TUNED_FLIGHT, "parquet")
        if any(p.path == n for p in passes)
    ]
    by_path = {name: [p for p in measured if p.path == name] for name in names}
    per_path = {}
    for name, ps in by_path.items():
        per_path[name] = {
            "mb_per_s": spread([p.mb_per_s for p in ps]),
            "steady_mb_per_s": spread([p.steady_mb_per_s for p in ps]),
            "first_batch_ms": spread([p.first_batch_s * 1e3 for p in ps]),
            "client_cpu_s": spread([p.client_cpu_s for p in ps]),
            "server_cpu_s": spread([p.server_cpu_s for p in ps]) if ps[0].server_cpu_s is not None else None,
            "cpu_s_per_gb": spread([p.cpu_s_per_gb for p in ps]),
            "client_peak_rss_mib": max((p.client_peak_rss_mib or 0.0) for p in ps) or None,
            "server_peak_rss_mib": max((p.server_peak_rss_mib or 0.0) for p in ps) or None,
        }
    ratios = {}
    mine = [n for n in ("shardstream", STRIPED) if n in by_path]
    for base, other in [(a, b) for a in mine for b in names if b not in mine]:
        pairs = list(zip(by_path[base], by_path[other], strict=True))
        ratios[f"{base}/{other}"] = {
            "mb_per_s": spread([a.mb_per_s / b.mb_per_s for a, b in pairs]),
            "cpu_s_per_gb": spread([a.cpu_s_per_gb / b.cpu_s_per_gb for a, b in pairs]),
        }
    shapes = {(p.batches, p.rows) for p in passes}
    return {"paths": per_path, "ratios": ratios, "same_batches_on_every_path": len(shapes) == 1}


def _fmt(s: dict[str, float], digits: int = 0) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def print_report(result: dict[str, Any]) -> None:
    cfg, summary = result["config"], result["summary"]
    print(
        f"\nshardstream bench: {cfg['payload_mib']:.0f} MiB payload, {cfg['batches']} batches of "
        f"{cfg['batch_rows']} rows ({cfg['batch_bytes'] / MIB:.2f} MiB), "
        f"{cfg['pairs']} rounds after 1 warm-up; "
        f"pyarrow {result['versions']['pyarrow']}, grpcio {result['versions']['grpcio']}, "
        f"{result['machine']['cpus']} CPUs, warm page cache"
    )
    head = (
        f"{'path':<20} {'MB/s med (min-max)':>20} {'steady MB/s':>12} {'1st batch ms':>13} "
        f"{'client CPU s':>13} {'server CPU s':>13} {'CPU s/GB':>9} {'server peak RSS MiB':>19}"
    )
    print(head)
    print("-" * len(head))
    for name, s in summary["paths"].items():
        server_cpu = f"{s['server_cpu_s']['median']:.2f}" if s["server_cpu_s"] else "-"
        rss = f"{s['server_peak_rss_mib']:.0f}" if s["server_peak_rss_mib"] else "-"
        print(
            f"{name:<20} {_fmt(s['mb_per_s']):>20} {s['steady_mb_per_s']['median']:>12.0f} "
            f"{s['first_batch_ms']['median']:>13.1f} {s['client_cpu_s']['median']:>13.2f} {server_cpu:>13} "
            f"{s['cpu_s_per_gb']['median']:>9.2f} {rss:>19}"
        )
    print()
    for key, r in summary["ratios"].items():
        print(f"{key:<34} MB/s ratio {_fmt(r['mb_per_s'], 2)}   CPU s/GB ratio {_fmt(r['cpu_s_per_gb'], 2)}")
    if not summary["same_batches_on_every_path"]:
        print("WARNING: the paths did not deliver the same batches and rows; see the JSON", file=sys.stderr)


# --- main --------------------------------------------------------------------------------------
def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.plan(args.mib, args.batch_mib)
    passes: list[Pass] = []
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-") as tmp:
        workdir = Path(tmp)
        t0 = time.perf_counter()
        log(f"building {layout.num_rows * ROW_BYTES / MIB:.0f} MiB ({layout.num_rows} rows) in {workdir}")
        # In a child process, so the heap the ingest leaves behind does not count in our RSS.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            root, shards = pool.submit(build_dataset, workdir, layout).result()
        log(f"  {len(shards)} shards, {time.perf_counter() - t0:.1f} s")
        paths = _paths(args)
        with contextlib.ExitStack() as stack:
            server = stack.enter_context(LocalServer(root))
            assert server.proc is not None
            runs: dict[str, tuple[tuple[str, Any], int | list[int] | None]] = {
                "shardstream": (("shardstream", ([server.target], layout.batch_rows)), server.proc.pid),
                "parquet": (("parquet", (shards, layout.batch_rows)), None),
            }
            if STRIPED in paths:  # the first server and K - 1 more
                more = [stack.enter_context(LocalServer(root)) for _ in range(args.striped - 1)]
                group = [server, *more]
                runs[STRIPED] = (
                    ("shardstream", ([s.target for s in group], layout.batch_rows, args.striped)),
                    [s.proc.pid for s in group if s.proc is not None],
                )
            for name in paths:
                if name.startswith("flight"):
                    env = MALLOC_ENV if name == TUNED_FLIGHT else None
                    fp = FlightProcess(workdir, shards, layout.batch_rows, args.flight_from_memory, env, name)
                    fl = stack.enter_context(fp)
                    assert fl.proc is not None
                    runs[name] = (("flight", fl.port), fl.proc.pid)
            clients = {}
            for name in paths:
                clients[name] = ClientProcess(MALLOC_ENV if name == TUNED_FLIGHT else None)
                stack.callback(clients[name].close)
            for round_ in range(args.pairs + 1):
                for name in paths:
                    source, pid = runs[name]
                    p = clients[name].measure(name, round_, source, pid)
                    passes.append(p)
                    label = "warm-up" if round_ == 0 else f"round {round_}"
                    log(
                        f"  {label} {name:<20} {p.mb_per_s:7.0f} MB/s  "
                        f"first batch {p.first_batch_s * 1e3:6.1f} ms  {p.batches} batches"
                    )
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.bench", *sys.argv[1:]]),
        "config": {
            "mib": args.mib,
            "pairs": args.pairs,
            "batch_mib": args.batch_mib,
            "striped_streams": args.striped,
            **asdict(layout),
            "flight_source": "memory (read once at start)"
            if args.flight_from_memory
            else "Parquet, every DoGet",
            "row_bytes": ROW_BYTES,
            "batch_bytes": layout.batch_rows * ROW_BYTES,
            "batches": layout.num_rows // layout.batch_rows,
            "payload_mib": layout.num_rows * ROW_BYTES / MIB,
            "shards": len(shards),
            "schema": "id int64, vec fixed_size_list<float32>[256]",
            "server_cache_holds_dataset": layout.num_rows * ROW_BYTES < SERVER_CACHE_MIB * MIB,
            "page_cache": "warm (written just before the passes)",
            "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
            "processes": "each path: its own client process; shardstream and flight servers: one subprocess each",
        },
        "versions": versions("shardstream", "grpcio", "protobuf", "torch", "uvloop"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "git_commit": _git_commit()},
        "passes": [p.to_json() for p in passes],
        "summary": summarize(passes),
    }


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.mib < 1 or args.pairs < 1 or not args.batch_mib > 0:
        ap.error("--mib and --pairs must be >= 1 and --batch-mib > 0")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.bench", __doc__)
    ap.add_argument(
        "--mib", type=int, default=DEFAULT_MIB, help=f"dataset payload size (default {DEFAULT_MIB})"
    )
    ap.add_argument(
        "--pairs",
        type=int,
        default=DEFAULT_PAIRS,
        help=f"measured rounds after the warm-up (default {DEFAULT_PAIRS})",
    )
    ap.add_argument(
        "--batch-mib",
        type=float,
        default=DEFAULT_BATCH_MIB,
        help=f"batch size in MiB of payload (default {DEFAULT_BATCH_MIB})",
    )
    ap.add_argument(
        "--flight-from-memory",
        action="store_true",
        help="the Flight server reads the shards once at start and serves them from memory, like "
        "shardstream's warm row-group cache (transport only); default: it reads Parquet on every pass",
    )
    ap.add_argument(
        "--striped",
        type=int,
        default=1,
        metavar="K",
        help="also measure one rank over K streams striped over K server processes (Loader(streams=K))",
    )
    ap.add_argument(
        "--flight-tuned",
        action="store_true",
        help=f"also measure Flight with the allocator settings shardstream applies to itself "
        f"({' '.join(f'{k}={v}' for k, v in MALLOC_ENV.items())} in its server's and client's environment)",
    )
    return bench_main(ap, argv, run, json_default=results_path("bench"), report=print_report, check=_check)


if __name__ == "__main__":
    sys.exit(main())
