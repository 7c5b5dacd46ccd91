"""Spark: write, checksum and register dataset versions from a Spark job (`pip install 'shardstream[spark]'`).

    from shardstream.engines.spark_io import register_files, write_dataset

    write_dataset(df, "s3://bucket/registry", "web")                      # prints and returns web@4
    write_dataset(df, root, "web", change="append", sort_by="url")
    register_files(spark, root, "web", ["data/2026-11-01/"])             # Parquet a job already wrote

`write_dataset` writes every partition of the DataFrame as one Parquet file under `ROOT/NAME/data/`,
in that partition's own task (`mapInArrow`: the rows reach Python as Arrow batches), with the
settings `ingest` uses — row groups of about `target_row_group_bytes` (uncompressed) for ranged
reads, Parquet page checksums — and computes the file's sha256 and the crc32 of its footer and of
every column chunk in the same task, from the bytes it just wrote. The driver collects one small
JSON entry per file and registers the version from them, reading no file again. Size the files by
partitioning (`df.repartition(n)`); `sort_by` sorts the whole DataFrame first (range partitions:
file i holds the i-th range). `register_files` gives files that Spark (or anything) already wrote
under `ROOT/NAME/` the same treatment: Spark tasks (a few files each, or one per file) read every
file once for its footer and checksums and, with `verify_pages` (default), decode it once to check
the Parquet page checksums its writer put there (Spark's writer does), so a file damaged between its
write and its registration is refused (DataLossError naming it) instead of being sealed into a
manifest.

A task that finds bad data reports it instead of failing, so Spark does not retry a deterministic
error; the driver raises one ShardstreamError naming the file and registers nothing. A failed
write's files are removed (best effort; `datasets gc` removes what is left).

This module runs the server's writer and checksum code inside Spark's tasks (shardstream.server.writing.bulk),
so the tasks' Python needs `shardstream[server,spark]`; tasks reach the root as the driver does (a
shared file system path or s3://).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardstream.errors import InvalidArgumentError
from shardstream.server.backends.roots import open_registry
from shardstream.server.writing.bulk import (
    DEFAULT_ROW_GROUP_BYTES,
    FileSpec,
    WriteSpec,
    check_columns,
    describe_file,
    prepare_write,
    register_parts,
    remove_write,
    source_keys,
    task_root,
    write_part,
)
from shardstream.server.writing.materialize import MaterializeJob, materialize_shard

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["materialize_runner", "register_files", "session", "write_dataset"]

_PART_COLUMN = "part"  # the one string column a write task returns: a Part as JSON


def session(app_name: str = "shardstream", master: str | None = None) -> SparkSession:
    """The active SparkSession, or a new one (`master` or spark-submit's, else local[*]). Python
    workers run this interpreter unless PYSPARK_PYTHON says otherwise (pyspark starts them with
    $PYSPARK_PYTHON, default `python3` from PATH, which is not a virtualenv's unless activated)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    return builder.getOrCreate()


def _context(spark: SparkSession | SparkContext) -> SparkContext:
    return getattr(spark, "sparkContext", spark)


def _write_task(spec: WriteSpec) -> Any:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        for p in write_part(spec, part, batches):
            yield pa.RecordBatch.from_pydict({_PART_COLUMN: [json.dumps(p)]})

    return write


def write_dataset(
    df: DataFrame,
    root: str | os.PathLike[str],
    name: str,
    *,
    change: str | None = None,
    target_row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
    row_group_rows: int | None = None,
    sort_by: str | Sequence[str] | None = None,
    schema: pa.Schema | None = None,
    metadata: Mapping[str, Any] | None = None,
    s3_endpoint: str | None = None,
    quiet: bool = False,
) -> str:
    """Write `df` as the next version of `name` under `root`: one Parquet file per partition, written
    and checksummed in its task, registered from the driver. Prints and returns NAME@VERSION.

    `change` is claimed and checked against the latest version (None: inferred); with `append` the
    version is the latest's shards followed by these, the rows cast to its schema. `schema` casts
    every batch to that Arrow schema (e.g. fixed-size lists for RL observations, which Spark's
    arrays cannot express). `metadata` is recorded in the manifest (e.g. `{"modality": "image"}`).
    """
    check_columns(list(df.columns))
    spec = prepare_write(
        root,
        name,
        change=change,
        schema=schema,
        row_group_bytes=target_row_group_bytes,
        row_group_rows=row_group_rows,
        s3_endpoint=s3_endpoint,
    )
    if sort_by is not None:
        df = df.orderBy(*([sort_by] if isinstance(sort_by, str) else list(sort_by)))
    try:
        rows = df.mapInArrow(_write_task(spec), f"{_PART_COLUMN} string").collect()
        with open_registry(spec.root, s3_endpoint=s3_endpoint) as registry:
            m = register_parts(
                registry,
                name,
                [json.loads(r[0]) for r in rows],
                change=change,
                metadata={"source": "spark", **dict(metadata or {})},
                keep_parent=True,
            )
    except BaseException:
        remove_write(spec.root, name, spec.write_id, s3_endpoint=s3_endpoint)
        raise
    if not quiet:
        print(m.ref, flush=True)
    return m.ref


def register_files(
    spark: SparkSession | SparkContext,
    root: str | os.PathLike[str],
    name: str,
    paths: Iterable[str | os.PathLike[str]],
    *,
    change: str | None = None,
    verify_pages: bool = True,
    files_per_task: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    s3_endpoint: str | None = None,
    quiet: bool = False,
) -> str:
    """Register Parquet files already under `root/name/` (files, directories or prefixes, as
    `shardstream register --from` takes them) as the next version of `name`, every file read in a
    Spark task. Prints and returns NAME@VERSION.

    `files_per_task` (default: about 4 tasks per core of the application, `defaultParallelism`):
    a task costs ~30-40 ms of scheduling on its own (measured on local[2], loadtest/bulk_bench.py),
    so one task per small file is mostly overhead; 1 gives every file its own task.
    """
    if files_per_task is not None and files_per_task < 1:
        raise InvalidArgumentError(f"files_per_task must be >= 1, got {files_per_task}")
    sc = _context(spark)
    with open_registry(task_root(root), s3_endpoint=s3_endpoint) as registry:
        keys = source_keys(registry, name, [os.fspath(p) for p in paths])
        registry.check_parent(name)  # an unreadable latest version: refused before any task runs
        spec = FileSpec(task_root(root), name, verify_pages=verify_pages, s3_endpoint=s3_endpoint)
        if files_per_task is None:
            files_per_task = max(1, -(-len(keys) // (4 * max(1, sc.defaultParallelism))))
        tasks = -(-len(keys) // files_per_task)
        items = list(enumerate(keys))
        parts = sc.parallelize(items, tasks).map(lambda item: describe_file(spec, item[0], item[1])).collect()
        m = register_parts(
            registry,
            name,
            parts,
            change=change,
            metadata={"source": "spark", **dict(metadata or {})},
        )
    if not quiet:
        print(m.ref, flush=True)
    return m.ref


def materialize_runner(spark: SparkSession | SparkContext | None = None) -> Any:
    """A `materialize` runner: one Spark task per source shard."""

    def run(job: MaterializeJob) -> list[dict[str, Any]]:
        sc = _context(spark if spark is not None else session("shardstream materialize"))
        if job.shards == 0:
            return []
        return (
            sc.parallelize(range(job.shards), job.shards)
            .flatMap(lambda i: materialize_shard(job, i))
            .collect()
        )

    return run
