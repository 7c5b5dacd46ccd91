"""Helpers the benchmarks share: stderr progress lines, version stamps, generated vector data."""

from __future__ import annotations

import json
import platform
import statistics
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["log", "spread", "versions", "write_json", "write_vectors"]


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
