"""Helpers the benchmarks share: their command line (bench_parser, bench_main), stderr progress
lines, version stamps, result files, generated vector data."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "RESULTS",
    "bench_main",
    "bench_parser",
    "log",
    "results_path",
    "spread",
    "versions",
    "write_json",
    "write_vectors",
]

RESULTS = Path(__file__).resolve().parent / "results"

Result = dict[str, Any]


def results_path(name: str) -> Path:
    """Where benchmark `name` writes its results unless told: loadtest/results/NAME.json."""
    return RESULTS / f"{name}.json"


def bench_parser(
    module: str, doc: str, *, whole_doc: bool = False, epilog: str | None = None
) -> argparse.ArgumentParser:
    """The parser a benchmark adds its own options to: `python -m MODULE`, described by the first
    line of its docstring (`whole_doc`: all of it, as written). bench_main adds --json."""
    if whole_doc:
        return argparse.ArgumentParser(
            prog=f"python -m {module}",
            description=doc,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0], epilog=epilog)


def bench_main(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    run: Callable[[argparse.Namespace], Result],
    *,
    json_default: Path | None,
    report: Callable[[Result], None] | None = None,
    check: Callable[[argparse.ArgumentParser, argparse.Namespace], None] | None = None,
    then: Callable[[argparse.Namespace, Result], None] | None = None,
    failed: Callable[[Result], bool] | None = None,
) -> int:
    """Every benchmark's `main`: parse `argv` with `--json PATH` added last (default `json_default`;
    None: written only when given), `check` the arguments (it may call parser.error, or fill in
    defaults derived from others), `run`, print the `report` to stdout, write the result as JSON,
    then `then` (more outputs: a plot, a closing line).

    Exit status 0: a benchmark reports figures and never judges them; 1 only when `failed(result)`
    says a correctness check failed. A crash is a traceback (status 1)."""
    if json_default is None:
        parser.add_argument("--json", type=Path, metavar="PATH", help="write the result here")
    else:
        shown = (
            json_default.relative_to(RESULTS.parent.parent)
            if json_default.is_relative_to(RESULTS)
            else json_default
        )
        parser.add_argument(
            "--json", type=Path, default=json_default, metavar="PATH", help=f"results file (default {shown})"
        )
    args = parser.parse_args(argv)
    if check is not None:
        check(parser, args)
    result = run(args)
    if report is not None:
        report(result)
    if args.json is not None:
        write_json(args.json, result)
    if then is not None:
        then(args, result)
    return 1 if failed is not None and failed(result) else 0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def spread(values: list[float]) -> dict[str, float]:
    """Median and min-max of a benchmark's measurements (or of its pairwise ratios)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def write_json(path: Path, result: object) -> Path:
    """Write a benchmark's result as JSON (making its folder) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {path}")
    return path


def versions(*dists: str, **extra: str) -> dict[str, str | None]:
    """Python, pyarrow, numpy and the installed versions of `dists` (None when absent), plus `extra`."""
    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
    }
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out.update(extra)
    return out


def write_vectors(path: Path, num_rows: int, dim: int, chunk_rows: int = 64 * 1024) -> None:
    """Parquet of sequential int64 `id` and random float32 `vec` of `dim` (incompressible, like embeddings)."""
    rng = np.random.default_rng(0)
    schema = pa.schema([("id", pa.int64()), ("vec", pa.list_(pa.float32(), dim))])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, num_rows, chunk_rows):
            n = min(chunk_rows, num_rows - start)
            values = pa.array(rng.random(n * dim, dtype=np.float32))
            writer.write_table(
                pa.table(
                    {
                        "id": np.arange(start, start + n, dtype=np.int64),
                        "vec": pa.FixedSizeListArray.from_arrays(values, dim),
                    },
                    schema=schema,
                )
            )
