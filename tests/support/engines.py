"""Real local engines for the data-engineering tests — Spark (local[2], a JVM) and Ray (num_cpus=2) —
and a dataset of each modality `ingest` supports (text, images, RL episodes), with an `id` column so
a read can be checked to hold every row exactly once."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shardstream.client import Loader

from .media import episodes_table, python_sources, real_images

__all__ = [
    "MODALITIES",
    "episodes_for_spark",
    "modality_table",
    "read_once",
    "require_java",
    "spark_session",
    "start_ray",
]

MODALITIES = ("text", "images", "episodes")
_METADATA = {
    "text": {"modality": "table"},
    "images": {"modality": "image"},
    "episodes": {"modality": "rl_episodes"},
}


def modality_table(kind: str) -> tuple[pa.Table, dict[str, Any]]:
    """(table, manifest metadata) of one modality: text (CPython sources), images (shipped JPEG, PNG,
    WebP files, twice over) or RL episodes (as `ingest --format episodes` stores them)."""
    if kind == "text":
        texts = [t for _, t in python_sources(60)]
        table = pa.table({"id": np.arange(len(texts), dtype=np.int64), "text": texts})
    elif kind == "images":
        items = real_images() * 2
        table = pa.table(
            {
                "id": np.arange(len(items), dtype=np.int64),
                "image": pa.array([b for _, b in items], pa.binary()),
                "label": pa.array([i % 3 for i in range(len(items))], pa.int32()),
                "name": [n for n, _ in items],
            }
        )
    elif kind == "episodes":
        eps = episodes_table(40, seed=3)
        table = eps.add_column(0, "id", pa.array(np.arange(eps.num_rows, dtype=np.int64)))
    else:
        raise ValueError(kind)
    return table, dict(_METADATA[kind])


def episodes_for_spark(table: pa.Table) -> pa.Table:
    """Spark has no fixed-size lists: observations as lists of lists (write_dataset's `schema=`
    casts them back)."""
    obs = table.column("obs")
    step = obs.type.value_type
    return table.set_column(
        table.schema.get_field_index("obs"), "obs", obs.cast(pa.list_(pa.list_(step.value_type)))
    )


def read_once(target: str, ref: str, *, columns: list[str] | None = None, batch_size: int = 7) -> pa.Table:
    """One epoch of `ref` through a Loader (shuffled by blocks), every batch concatenated."""
    with Loader(
        [target], ref, batch_size=batch_size, shuffle=True, seed=5, epochs=1, columns=columns, output="arrow"
    ) as ld:
        batches = list(ld)
    return pa.Table.from_batches(batches)


def require_java() -> None:
    if shutil.which("java") is None:
        pytest.fail("java is not installed (apt-get install default-jre-headless; .ci/run does this)")


def spark_session(work: Path) -> Any:
    """A local[2] SparkSession: no UI, Python workers on this interpreter, scratch files in `work`."""
    require_java()
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # what pyspark starts its workers with
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("shardstream-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(work))
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_ray() -> Any:
    """Ray on this machine: 2 CPUs, no dashboard, a small object store."""
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=256 << 20,
        configure_logging=False,
    )
    return ray
